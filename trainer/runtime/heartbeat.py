"""Rank 0's heartbeat: the attempt's latest step in a small object the operator watches for hangs.

``beat`` only records the step in memory and wakes a writer thread, so training never waits on
storage. The thread writes the newest step at most every ``every_s`` seconds; a write that
fails is skipped (the next one carries a newer step anyway), logged once until one works, like
the metrics. The object carries the time the step *finished*, not the time of the write, so a
reader never sees a hang earlier than it began, only up to ``every_s`` later.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from trainer.contract import Heartbeat, RunLayout
from trainer.storage import open_storage

if TYPE_CHECKING:
    from trainer.storage import Storage

log = logging.getLogger("trainer.heartbeat")

EVERY_S = 10.0  # at most one write per 10 s: a heartbeat is a liveness signal, not a metric
# The interval, for a run whose hang_timeout is far under a minute (the end-to-end hang test): a
# heartbeat is up to one interval old when read, so the interval must stay well under the timeout.
ENV_EVERY_S = "TRAINOPS_HEARTBEAT_EVERY_S"
STEP_TIMES_KEPT = 1000  # the median is over this attempt's last 1000 step times
WRITE_OUTAGE_TOLERANCE_S = 2.0  # a write rides out this much of an outage; the next step retries


class HeartbeatWriter:
    """Writes attempt ``attempt``'s heartbeat to ``layout.heartbeat(attempt)`` in the background.

    :param storage: a storage client that gives up quickly (a heartbeat is never worth a wait).
    :param every_s: the least time between two writes.
    :param clock: wall-clock seconds (the reader compares them with its own).
    """

    def __init__(
        self,
        storage: Storage,
        layout: RunLayout,
        attempt: int,
        *,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.time,
    ):
        self.storage, self.uri, self.attempt = storage, layout.heartbeat(attempt), attempt
        self.every_s, self._clock = every_s, clock
        self._step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        self._steps = 0
        self._pending: tuple[int, float, int] | None = None  # step, its time, steps
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._failing = False
        self.writes = 0  # heartbeats written (for tests and the log)
        self._thread = threading.Thread(target=self._run, name="trainer-heartbeat", daemon=True)
        self._thread.start()

    def start(self, step: int) -> None:
        """The loop starts at ``step`` (the resumed one): before the first step, which may
        compile or warm up for long, the watcher allows extra time."""
        self._put(step)

    def beat(self, step: int, step_s: float) -> None:
        """Step ``step`` finished, having taken ``step_s`` seconds (never blocks)."""
        with self._lock:
            if self._steps > 0:  # the attempt's first step compiles and warms up: not typical
                self._step_times.append(step_s)
            self._steps += 1
        self._put(step)

    def _put(self, step: int) -> None:
        # Constant time on the training thread: the median is taken by the writer, when it writes.
        with self._lock:
            self._pending = (step, self._clock(), self._steps)
        self._wake.set()

    def close(self) -> None:
        """Stop the writer thread (what it has not written by now is not needed)."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._closed:
                return
            with self._lock:
                pending, self._pending = self._pending, None
                times = list(self._step_times) if pending is not None else []
                self._wake.clear()
            if pending is not None:
                step, at, steps = pending
                median = statistics.median(times) if times else None
                self._write(
                    {
                        "attempt": self.attempt,
                        "step": step,
                        "time": at,
                        "steps": steps,
                        "median_step_s": median,
                    }
                )
            # rate limit: sleep out the interval; beats meanwhile only replace the pending one
            deadline = time.monotonic() + self.every_s
            while not self._closed and (remaining := deadline - time.monotonic()) > 0:
                time.sleep(min(remaining, 0.5))

    def _write(self, beat: Heartbeat) -> None:
        try:
            self.storage.put(self.uri, json.dumps(beat).encode())
        except Exception as exc:  # skipped, like a metrics flush: training goes on
            if not self._failing:
                self._failing = True
                log.warning("heartbeat not written (%s); training goes on, retrying with the next step", exc)
            return
        self.writes += 1
        if self._failing:
            self._failing = False
            log.info("heartbeat written again (step %d)", beat["step"])


def every_s_from(environ: Mapping[str, str]) -> float:
    """The least time between two writes: ``$TRAINOPS_HEARTBEAT_EVERY_S`` when set, else
    :data:`EVERY_S`.

    :param environ: the process environment.
    :raises ValueError: the variable is set but is not a number of seconds > 0.
    """
    raw = environ.get(ENV_EVERY_S, "").strip()
    if not raw:
        return EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(
            f"{ENV_EVERY_S}={raw!r} is not a number of seconds > 0; unset it for the default ({EVERY_S:g} s)"
        )
    return value


def beats(
    run_uri: str, attempt: int, is_main: bool, step: int, environ: Mapping[str, str] = os.environ
) -> Callable[[int, float], None]:
    """What the loop calls after each step, ``beat(step, step_s)``: on rank 0 a started
    :class:`HeartbeatWriter` of attempt ``attempt`` (the loop starts at ``step``), elsewhere
    nothing. The writer's thread is a daemon: it ends with the process.

    :param run_uri: the run's folder.
    :param attempt: the attempt number.
    :param is_main: whether this is rank 0.
    :param step: the step the loop starts at.
    :param environ: where ``$TRAINOPS_HEARTBEAT_EVERY_S`` is read (:func:`every_s_from`).
    """
    every_s = every_s_from(environ)  # a bad value fails on every rank, before training
    if not is_main:
        return lambda step, step_s: None
    store = open_storage(run_uri, outage_tolerance_s=WRITE_OUTAGE_TOLERANCE_S)
    writer = HeartbeatWriter(store, RunLayout(run_uri), attempt, every_s=every_s)
    writer.start(step)
    return writer.beat
