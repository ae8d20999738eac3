"""Riding out storage outages: how long a client keeps trying, the wait before each retry, and
the loop that retries one request until it succeeds or its failures outlast the tolerance.

Which failures are transient is the backend's to say (``S3Storage`` passes its classifier);
file:// errors are local and final. Standard library only: imported at DAG-parse time.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from trainer.storage.base import StorageError, StorageUnavailable

log = logging.getLogger("trainer.storage")

T = TypeVar("T")

OUTAGE_TOLERANCE_ENV = "TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S"
# How long one request keeps retrying before the operation fails as an outage. Five minutes:
# throttling storms and regional blips last seconds to a few minutes, and waiting them out costs
# a gang a few idle minutes where failing costs the attempt (a relaunch, a resume, and the steps
# since the last checkpoint). A longer outage fails the attempt as infrastructure, and the
# relaunch budget, with its own back-off, takes over.
DEFAULT_OUTAGE_TOLERANCE_S = 300.0
FIRST_DELAY_S = 0.1  # a lost reply or a reset is usually cured by an immediate retry
MAX_DELAY_S = 10.0  # long enough not to add to a throttling storm, short enough to notice its end


class Abandoned(StorageError):
    """Another request of the same operation gave up, so this one stopped too."""


def outage_tolerance(value: float | None = None) -> float:
    """The outage tolerance in seconds: ``value``, else ``$TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S``,
    else :data:`DEFAULT_OUTAGE_TOLERANCE_S`. ``0`` means fail at the first transient error."""
    source = "outage_tolerance_s"
    if value is None:
        raw = os.environ.get(OUTAGE_TOLERANCE_ENV, "").strip()
        if not raw:
            return DEFAULT_OUTAGE_TOLERANCE_S
        source = OUTAGE_TOLERANCE_ENV
        try:
            value = float(raw)
        except ValueError:
            raise StorageError(
                f"{OUTAGE_TOLERANCE_ENV}={raw!r} is not a number of seconds: set it to e.g. "
                f"{DEFAULT_OUTAGE_TOLERANCE_S:.0f}, or unset it for the default"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise StorageError(
            f"{source}={value!r} is not a number of seconds >= 0: use e.g. {DEFAULT_OUTAGE_TOLERANCE_S:.0f}"
        )
    return float(value)


def backoff_delay(
    retry: int, draw: float, *, first: float = FIRST_DELAY_S, cap: float = MAX_DELAY_S
) -> float:
    """The wait before retry number ``retry`` (1, 2, ...): doubling from ``first`` up to ``cap``,
    the upper half of it drawn (``draw`` in [0, 1)), so that clients failed together spread out."""
    ceiling = min(cap, first * 2.0 ** min(retry - 1, 64))
    return ceiling / 2 + ceiling / 2 * draw


class Retrier:
    """Runs requests with retries: exponential back-off with jitter, for up to ``tolerance_s``
    seconds of consecutive failures of that request, each retry logged."""

    def __init__(self, tolerance_s: float, transient: Callable[[BaseException], str | None]) -> None:
        """:param transient: what a failure was (``"refused (503 SlowDown)"``), when retrying can
        cure it; None for a failure that is final (not found, denied, precondition failed)."""
        self.tolerance_s = tolerance_s
        self.transient = transient
        self._random = random.Random()
        self._lock = threading.Lock()
        self.retries = 0  # every retry this client made, for reports

    def _draw(self) -> float:
        with self._lock:
            return self._random.random()

    def _count(self) -> None:
        with self._lock:
            self.retries += 1

    def run(
        self,
        op: str,
        uri: str,
        attempt: Callable[[int], T],
        *,
        stop: threading.Event | None = None,
        unsure: str = "",
    ) -> T:
        """``attempt(retry)`` until it returns or fails for good; ``retry`` is 0 on the first try.

        :param op: what the request does, for the log (``"PUT"``, ``"UploadPart 3"``).
        :param stop: set by another request of the same operation that gave up: stop too.
        :param unsure: appended to the error when the tolerance runs out after a retry (what a
            write whose reply may have been lost leaves the caller to check).
        :raises StorageUnavailable: the request kept failing for longer than the tolerance.
        """
        retry = 0
        first_failure = 0.0
        while True:
            if stop is not None and stop.is_set():
                raise Abandoned(f"storage: {op} {uri} stopped: another request of the same operation gave up")
            if retry:
                self._count()
            try:
                result = attempt(retry)
            except Exception as exc:
                reason = self.transient(exc)
                if reason is None:
                    raise
                now = time.monotonic()
                if retry == 0:
                    first_failure = now
                failing = now - first_failure
                if failing >= self.tolerance_s:
                    note = f"; {unsure}" if unsure and retry else ""
                    tries = f"{retry + 1} tries" if retry else "1 try"
                    raise StorageUnavailable(
                        f"storage: {op} {uri} kept failing for {failing:.1f} s over {tries} "
                        f"(last: {reason}), beyond the outage tolerance of {self.tolerance_s:g} s: check "
                        f"that the storage endpoint is up and reachable, or raise {OUTAGE_TOLERANCE_ENV}"
                        f"{note}"
                    ) from exc
                retry += 1
                delay = min(backoff_delay(retry, self._draw()), self.tolerance_s - failing)
                log.warning(
                    "storage: %s %s %s; retry %d in %.1f s, %.0f s of at most %g s",
                    op,
                    uri,
                    reason,
                    retry,
                    delay,
                    failing,
                    self.tolerance_s,
                )
                if stop is not None:
                    stop.wait(delay)
                else:
                    time.sleep(delay)
                continue
            if retry:
                log.info(
                    "storage: %s %s succeeded on retry %d, after %.1f s of failures",
                    op,
                    uri,
                    retry,
                    time.monotonic() - first_failure,
                )
            return result
