"""Riding out failed reads in a trigger: a transient fault is weather, not a verdict.

A Kubernetes API answering 5xx or 429, a reset connection, storage that times out, credentials
being refreshed: none of them says anything about the job, which is most likely healthy. A
trigger that reads the job's status, logs, metrics or heartbeat keeps one :class:`Outage` per
kind of read: each failure is logged once with a running count and retried after a back-off;
only reads failing for longer than the tolerance (``api_outage_tolerance``, 10 minutes by
default) end the wait, and even then the operator deletes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

DEFAULT_API_OUTAGE_TOLERANCE_S = 600.0
RETRY_CAP_S = 30.0  # the longest back-off between two tries of a failing read


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ..., ``11th``, ``21st``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def describe(exc: BaseException) -> str:
    """The failure in a few words: its type and first line (a Kubernetes ApiException's
    status and reason rather than its whole HTTP dump)."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None and reason is not None:
        return f"{type(exc).__name__} {status} {reason}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


class Log(Protocol):
    """What an :class:`Outage` logs through (a stdlib logger, or a trigger's ``self.log``)."""

    def warning(self, msg: Any, /, *args: Any) -> Any: ...

    def info(self, msg: Any, /, *args: Any) -> Any: ...


class Outage:
    """The failures in a row of one kind of read (``what``, e.g. ``"status read"``).

    :param tolerance_s: how long reads may keep failing before :meth:`failed` gives up.
    :param base_s: the first back-off; it doubles up to ``cap_s``.
    :param cap_s: the longest back-off.
    :param log: where each failure and the recovery are logged.
    :param clock: monotonic seconds.
    """

    def __init__(
        self,
        what: str,
        tolerance_s: float,
        log: Log,
        *,
        base_s: float = 1.0,
        cap_s: float = RETRY_CAP_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.what, self.tolerance_s, self.log = what, tolerance_s, log
        self.base_s, self.cap_s, self._clock = base_s, cap_s, clock
        self.failures = 0
        self.since: float | None = None
        self.total_failures = 0  # over the trigger's life, every outage together

    def failed(self, exc: BaseException) -> float | None:
        """Count a failed read: the seconds to wait before the next try, or None when reads
        have failed for longer than the tolerance (the caller reports an error)."""
        now = self._clock()
        if self.since is None:
            self.since = now
        self.failures += 1
        self.total_failures += 1
        elapsed = now - self.since
        if elapsed > self.tolerance_s:
            return None
        self.log.warning(
            "%s failed (%s); %s failure in %.0f s, riding it out up to %.0f s",
            self.what,
            describe(exc),
            ordinal(self.failures),
            elapsed,
            self.tolerance_s,
        )
        back_off = min(self.cap_s, self.base_s * 2 ** (self.failures - 1))
        return max(0.01, min(back_off, self.tolerance_s - elapsed + 0.01))

    def worked(self) -> None:
        """A read worked: log the recovery once, and start counting afresh."""
        if self.since is not None:
            self.log.info(
                "%s works again after %d failure(s) over %.0f s",
                self.what,
                self.failures,
                self._clock() - self.since,
            )
        self.failures, self.since = 0, None

    def verdict(self, exc: BaseException) -> str:
        """The error event's message once the tolerance is spent."""
        elapsed = self._clock() - (self.since if self.since is not None else self._clock())
        return (
            f"{self.what} failed for {elapsed:.0f} s ({self.failures} tries), longer than the "
            f"api_outage_tolerance of {self.tolerance_s:.0f} s; last error: {describe(exc)}"
        )
