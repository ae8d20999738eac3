"""Rank 0's heartbeat: the attempt's latest step in a small object the operator watches for hangs.

``beat`` only records the step in memory and wakes a writer thread, so training never waits on
storage. The thread writes the newest step at most every ``every_s`` seconds; a write that
fails is tried again after 1 s, then 2, 4, ... up to the interval (what it carried may be all
there is to say: a busy mark, while no step comes), logged once until one works. The object carries the time the step *finished*, not the time of the write, so a
reader never sees a hang earlier than it began, only up to ``every_s`` later.

It also carries the attempt's pace after warm-up (the p99 step time and the longest gap between
two steps), from which the watch derives its timeout, and ``busy`` while the training thread is
in a long operation that stops stepping on purpose (a checkpoint save, the export), so that
the watch does not take the pause for a hang. A busy mark is written with the next regular write,
or after :data:`BUSY_WRITE_AFTER_S` if the operation lasts that long (a short one, a metrics
flush that goes through at once, costs no write), and the end of one that was written, at once.
The ends of the first step and of warm-up are written at once too: each changes the watch's
limit.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from trainer.contract import HEARTBEAT_WARMUP_STEPS, Heartbeat, RunLayout
from trainer.storage import open_storage

if TYPE_CHECKING:
    from trainer.storage import Storage

log = logging.getLogger("trainer.heartbeat")

EVERY_S = 10.0  # at most one write per 10 s: a heartbeat is a liveness signal, not a metric
# The interval, for a run whose hang_timeout is far under a minute (the end-to-end hang test): a
# heartbeat is up to one interval old when read, so the interval must stay well under the timeout.
ENV_EVERY_S = "TRAINOPS_HEARTBEAT_EVERY_S"
STEP_TIMES_KEPT = 1000  # the median is over this attempt's last 1000 step times
WRITE_OUTAGE_TOLERANCE_S = 2.0  # a write rides out this much of an outage; then retried
RETRY_S = 1.0  # the first retry of a failed write, doubling up to the interval
BUSY_WRITE_AFTER_S = 1.0  # a busy operation this long is written without waiting for the interval


class HeartbeatWriter:
    """Writes attempt ``attempt``'s heartbeat to ``layout.heartbeat(attempt)`` in the background.

    Writes are rate-limited to one per ``every_s``, except those that change how the watch
    reads the attempt, which go at once: the first step (the startup allowance ends), the end
    of warm-up (a derived pace exists), and entering or leaving a :meth:`busy` operation.

    :param storage: a storage client that gives up quickly (a heartbeat is never worth a wait).
    :param every_s: the least time between two writes.
    :param clock: wall-clock seconds (the reader compares them with its own).
    :param monotonic: seconds for the gaps between steps (immune to clock steps).
    """

    def __init__(
        self,
        storage: Storage,
        layout: RunLayout,
        attempt: int,
        *,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.storage, self.uri, self.attempt = storage, layout.heartbeat(attempt), attempt
        self.every_s, self._clock, self._monotonic = every_s, clock, monotonic
        self._step_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)  # for the median
        self._paced_times: deque[float] = deque(maxlen=STEP_TIMES_KEPT)  # after warm-up: the p99
        self._max_gap: float | None = None
        self._gap_from: float | None = None  # monotonic: the last beat, or the end of a busy spell
        self._steps = 0
        self._step, self._at = 0, 0.0
        self._busy: tuple[str, float] | None = None  # what, since (epoch)
        self._busy_ended: float | None = None
        self._dirty = False  # something not written yet
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._urgent = threading.Event()  # write now, not at the end of the interval
        self._busy_serial = 0  # which busy operation is current (its delayed mark checks it)
        self._busy_written = False  # the current busy mark reached storage
        self._closed = False
        self._failing = False
        self.writes = 0  # heartbeats written (for tests and the log)
        self._thread = threading.Thread(target=self._run, name="trainer-heartbeat", daemon=True)
        self._thread.start()

    def start(self, step: int) -> None:
        """The loop starts at ``step`` (the resumed one): before the first step, which may
        compile or warm up for long, the watcher allows extra time."""
        with self._lock:
            self._step, self._at, self._gap_from = step, self._clock(), self._monotonic()
            self._dirty = True
        self._wake.set()

    def beat(self, step: int, step_s: float) -> None:
        """Step ``step`` finished, having taken ``step_s`` seconds (never blocks; constant time:
        the median and the p99 are taken by the writer, when it writes)."""
        now = self._monotonic()
        with self._lock:
            if self._steps > 0:  # the attempt's first step compiles and warms up: not typical
                self._step_times.append(step_s)
            self._steps += 1
            if self._steps > HEARTBEAT_WARMUP_STEPS:
                self._paced_times.append(step_s)
                if self._gap_from is not None:
                    gap = now - self._gap_from
                    self._max_gap = gap if self._max_gap is None else max(self._max_gap, gap)
            self._gap_from = now
            self._step, self._at, self._dirty = step, self._clock(), True
            urgent = self._steps in (1, HEARTBEAT_WARMUP_STEPS + 1)
        self._wake.set()
        if urgent:
            self._urgent.set()

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Mark a long operation of the training thread that legitimately stops stepping (a
        checkpoint save, the export) for its duration: the heartbeat says ``busy: what`` at
        once, so the watch allows it the startup allowance instead of the derived timeout (a
        hang inside it is still caught, later). Its time is left out of ``max_gap_s``.

        :param what: the operation, in a few words, for the hang verdict.
        """
        with self._lock:
            self._busy, self._dirty, self._busy_written = (what, self._clock()), True, False
            self._busy_serial += 1
            serial = self._busy_serial
        self._wake.set()  # with the next regular write, or, if it lasts, after BUSY_WRITE_AFTER_S
        mark = threading.Timer(BUSY_WRITE_AFTER_S, self._mark_busy, (serial,))
        mark.daemon = True
        mark.start()
        try:
            yield
        finally:
            mark.cancel()
            with self._lock:
                written = self._busy_written
                self._busy, self._busy_ended, self._dirty = None, self._clock(), True
                self._gap_from = self._monotonic()
            self._wake.set()
            if written:  # the watch knows of it: say at once that it is over
                self._urgent.set()

    def _mark_busy(self, serial: int) -> None:
        """The busy operation ``serial`` lasted :data:`BUSY_WRITE_AFTER_S`: write it now."""
        with self._lock:
            still = self._busy is not None and self._busy_serial == serial
        if still:
            self._wake.set()
            self._urgent.set()

    def close(self) -> None:
        """Stop the writer thread (what it has not written by now is not needed)."""
        self._closed = True
        self._wake.set()
        self._urgent.set()
        self._thread.join(timeout=5)

    def _snapshot(self) -> Heartbeat | None:
        """The heartbeat to write now (None: nothing new); the percentiles are taken here, on the
        writer's thread."""
        with self._lock:
            if not self._dirty:
                return None
            self._dirty = False
            times, paced = list(self._step_times), list(self._paced_times)
            busy, busy_ended, max_gap = self._busy, self._busy_ended, self._max_gap
            self._busy_written = self._busy_written or busy is not None
            step, at, steps = self._step, self._at, self._steps
        return {
            "attempt": self.attempt,
            "step": step,
            "time": at,
            "steps": steps,
            "median_step_s": statistics.median(times) if times else None,
            "p99_step_s": p99(paced),
            "max_gap_s": max_gap,
            "every_s": self.every_s,
            "busy": busy[0] if busy else None,
            "busy_since": busy[1] if busy else None,
            "busy_ended": busy_ended,
        }

    def _run(self) -> None:
        retry = 0.0
        while True:
            self._wake.wait()
            if self._closed:
                return
            self._wake.clear()
            self._urgent.clear()
            beat = self._snapshot()
            if beat is not None and not self._write(beat):
                with self._lock:  # not written: what it carried is still to say
                    self._dirty = True
                    if beat["busy"] is not None and self._busy is not None:
                        self._busy_written = False
                self._wake.set()
                retry = min(max(2 * retry, RETRY_S), self.every_s)
                self._urgent.wait(retry)
                continue
            retry = 0.0
            # rate limit: sleep out the interval (beats meanwhile only update what is pending),
            # unless a write that changes the watch's reading comes
            self._urgent.wait(self.every_s)

    def _write(self, beat: Heartbeat) -> bool:
        """Whether ``beat`` reached storage (a failure is logged once until a write works)."""
        try:
            self.storage.put(self.uri, json.dumps(beat).encode())
        except Exception as exc:  # training goes on; the writer tries again
            if not self._failing:
                self._failing = True
                log.warning("heartbeat not written (%s); training goes on, retrying", exc)
            return False
        self.writes += 1
        if self._failing:
            self._failing = False
            log.info("heartbeat written again (step %d)", beat["step"])
        return True


class NoHeartbeat:
    """What the ranks other than 0 get from :func:`beats`: the same calls, doing nothing."""

    def beat(self, step: int, step_s: float) -> None:
        """Nothing: only rank 0 writes the heartbeat."""

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Nothing: only rank 0 writes the heartbeat."""
        yield

    def close(self) -> None:
        """Nothing to stop."""


def p99(times: list[float]) -> float | None:
    """The 99th percentile of ``times`` by nearest rank (the largest below 100 of them: with few
    steps known, the slowest is the safe guess); None when empty."""
    if not times:
        return None
    ranked = sorted(times)
    return ranked[math.ceil(0.99 * len(ranked)) - 1]


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


def restarting(run_uri: str, attempt: int, step: int, clock: Callable[[], float] = time.time) -> bool:
    """Rank 0 of an in-place restart (``trainer.runtime.restarts``), before its setup: one
    heartbeat at once, with no step trained yet and busy ``restart in place``, so that the
    watch gives the restarted gang the startup allowance instead of timing the silence since the
    incarnation before it died against that one's pace. Whether it was written (a failure is
    logged: the restart goes on)."""
    now = clock()
    beat: Heartbeat = {
        "attempt": attempt,
        "step": step,
        "time": now,
        "steps": 0,
        "median_step_s": None,
        "p99_step_s": None,
        "max_gap_s": None,
        "every_s": every_s_from(os.environ),
        "busy": "restart in place",
        "busy_since": now,
        "busy_ended": None,
    }
    try:
        store = open_storage(run_uri, outage_tolerance_s=WRITE_OUTAGE_TOLERANCE_S)
        store.put(RunLayout(run_uri).heartbeat(attempt), json.dumps(beat).encode())
    except Exception as exc:
        log.warning("heartbeat of the restart not written (%s); restarting anyway", exc)
        return False
    return True


def beats(
    run_uri: str, attempt: int, is_main: bool, step: int, environ: Mapping[str, str] = os.environ
) -> HeartbeatWriter | NoHeartbeat:
    """What the loop calls, ``beat(step, step_s)`` after each step and ``with busy(what):``
    around a long operation: on rank 0 a started :class:`HeartbeatWriter` of attempt
    ``attempt`` (the loop starts at ``step``), elsewhere a :class:`NoHeartbeat`. The writer's
    thread is a daemon: it ends with the process.

    :param run_uri: the run's folder.
    :param attempt: the attempt number.
    :param is_main: whether this is rank 0.
    :param step: the step the loop starts at.
    :param environ: where ``$TRAINOPS_HEARTBEAT_EVERY_S`` is read (:func:`every_s_from`).
    """
    every_s = every_s_from(environ)  # a bad value fails on every rank, before training
    if not is_main:
        return NoHeartbeat()
    store = open_storage(run_uri, outage_tolerance_s=WRITE_OUTAGE_TOLERANCE_S)
    writer = HeartbeatWriter(store, RunLayout(run_uri), attempt, every_s=every_s)
    writer.start(step)
    return writer
