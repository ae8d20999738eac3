"""Preemption: signal handlers that only set a flag, and the per-step agreement to stop.

A spot node gets SIGTERM (torchrun forwards it to every worker). Handlers must not do
I/O or collectives: they run between bytecodes of whatever the rank is doing. Instead,
as each step begins all ranks start an asynchronous all-reduce of the flag, and take the sum
once the step's compute is issued (``trainer.train.train_step``), so they all stop after the
same step, the one after the signal, and can take one emergency checkpoint together.
"""

from __future__ import annotations

import signal
import time
from types import FrameType


class StopFlag:
    """Set by SIGTERM/SIGINT; remembers which signal came first, and when (``at``, monotonic
    seconds: the notice window starts there)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.at: float | None = None

    @property
    def is_set(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.at = time.monotonic()
            self.signal_name = signal.Signals(signum).name

    def install(self) -> StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self


def stop_decision(flag_sum: float, local_signal: str | None) -> tuple[bool, str | None]:
    """Whether all ranks stop, from the all-reduced sum of their flags (any rank is enough).

    A rank that did not see the signal itself still reports SIGTERM, the signal a
    preemption sends.
    """
    stop = flag_sum > 0
    return stop, (local_signal or "SIGTERM") if stop else None
