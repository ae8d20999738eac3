"""Preemption: signal handlers that only set a flag, and the per-step agreement to stop.

A spot node gets SIGTERM (torchrun forwards it to every worker). Handlers must not do
I/O or collectives: they run between bytecodes of whatever the rank is doing. Instead,
as each step begins all ranks start an asynchronous all-reduce of the flag, and take the sum
once the step's compute is issued (``trainer.train.train_step``), so they all stop after the
same step, the one after the signal, and can take one emergency checkpoint together.

The cloud's notice (``trainer.runtime.notice``) comes through the same flag, from the notice
watcher's thread: an interruption stops the gang like SIGTERM (``signal_name`` ``notice``, the
notice kept in ``notice``), an advisory only asks for a checkpoint at the next step
(:meth:`StopFlag.take_save_request`).
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

from trainer.runtime.notice_sources import Notice

# A preempted worker exits non-zero on purpose: a torchrun agent whose workers all exit 0 waits
# in its exit barrier (up to 300 s) for the agents of the other nodes, and a preempted node's
# agent never arrives. Non-zero makes every agent exit at once; the attempt record says why.
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, the shell's convention

NOTICE = "notice"  # the stop's ``signal`` when the cloud's notice, not a signal, stopped the gang


class StopFlag:
    """Set by SIGTERM/SIGINT or an interruption notice; remembers which came first, and when
    (``at``, monotonic seconds: the notice window starts there)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.at: float | None = None
        self.notice: Notice | None = None  # the interruption notice that set the flag
        self._save_requested = False
        self._lock = threading.Lock()  # the watcher's thread and the training thread

    @property
    def is_set(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.at = time.monotonic()
            self.signal_name = signal.Signals(signum).name

    def on_notice(self, notice: Notice) -> None:
        """The notice watcher's callback (another thread): an interruption sets the flag unless
        a signal came first; an advisory asks for a checkpoint."""
        with self._lock:
            if notice.kind == "advisory":
                self._save_requested = True
            elif self.signal_name is None:
                self.notice, self.at = notice, time.monotonic()
                self.signal_name = NOTICE

    def take_save_request(self) -> bool:
        """Whether an advisory asked for a checkpoint since the last call (then cleared)."""
        with self._lock:
            requested, self._save_requested = self._save_requested, False
        return requested

    def install(self) -> StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self


def stop_cause(seen: list[tuple[str | None, Notice | None]]) -> tuple[str, Notice | None]:
    """What stopped the gang, from every rank's ``(own signal, own notice)`` in rank order: the
    signal of the first rank that had one (rank 0's when it had one; SIGTERM when none kept it),
    and the earliest interruption notice any node's watcher read (None: no notice)."""
    signals = [own for own, _ in seen if own is not None]
    notices = [notice for _, notice in seen if notice is not None]
    first = min(notices, key=lambda n: n.noticed_at) if notices else None
    return (signals[0] if signals else "SIGTERM"), first


def stop_decision(flag_sum: float, local_signal: str | None) -> tuple[bool, str | None]:
    """Whether all ranks stop, from the all-reduced sum of their flags (any rank is enough).

    A rank that did not see the signal itself still reports SIGTERM, the signal a
    preemption sends.
    """
    stop = flag_sum > 0
    return stop, (local_signal or "SIGTERM") if stop else None
