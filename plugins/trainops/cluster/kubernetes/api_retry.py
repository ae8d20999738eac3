"""Riding out Kubernetes API blips: which failed calls a retry can cure, and the loop that
retries one call with exponential back-off and jitter for a bounded time.

The kubernetes client retries connection errors only (urllib3's own retries), never a 5xx or a
429: an API server restarting, an etcd leader election or a throttled client answers those for
seconds to a minute, and a watcher that gives up on the first one deletes a healthy run. What
is retried here: 500, 502, 503 and 504, 429 (waiting at least its ``Retry-After``), and
connection resets, refused connections and timeouts. Any other 4xx is an answer, not a blip.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trainer.storage.retry import backoff_delay

log = logging.getLogger(__name__)

T = TypeVar("T")

# Long enough for an API server rollout or a control plane upgrade on a managed cluster (GKE,
# EKS and AKS answer 5xx or drop connections for tens of seconds), short enough that a caller
# with its own deadline (the trigger's outage tolerance) still gets to decide.
DEFAULT_API_RETRY_S = 60.0
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0
RETRIED_STATUSES = (429, 500, 502, 503, 504)


@dataclass(frozen=True)
class Blip:
    """A failure a retry can cure: what it was (for the log) and the server's Retry-After."""

    reason: str
    retry_after_s: float | None = None


class ApiUnavailable(RuntimeError):
    """A call kept failing with blips for longer than the retry budget. ``status`` is the last
    HTTP status (None for a connection error), so callers that look at it still can."""

    def __init__(self, message: str, status: int | None):
        super().__init__(message)
        self.status = status


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a client error (``ApiException``, :class:`ApiUnavailable`), else None."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _retry_after(exc: BaseException) -> float | None:
    """The Retry-After header of an API error, in seconds (None: absent or an HTTP date)."""
    headers = getattr(exc, "headers", None) or {}
    try:
        value = headers.get("Retry-After")
    except AttributeError:
        return None
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What the client raises when the connection, not the server, failed."""
    from urllib3.exceptions import MaxRetryError, ProtocolError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    return (ConnectionError, TimeoutError, ProtocolError, Urllib3Timeout, MaxRetryError)


def blip(exc: BaseException) -> Blip | None:
    """What ``exc`` was when a retry can cure it; None when it is an answer (404, 403, 409,
    422, ...) or not an API failure at all."""
    if isinstance(exc, ApiUnavailable):
        return None  # a nested call already spent its budget
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status in RETRIED_STATUSES:
        reason = getattr(exc, "reason", None) or ""
        return Blip(f"{status} {reason}".strip(), _retry_after(exc) if status == 429 else None)
    if isinstance(exc, _connection_errors()):
        return Blip(f"{type(exc).__name__}: {exc}")
    return None


class ApiRetry:
    """Runs API calls, retrying blips for up to ``budget_s`` seconds of consecutive failures
    of one call, each retry logged once with the count of retries so far.

    :param budget_s: how long one call may keep failing before :class:`ApiUnavailable`;
        ``0``: fail at the first blip.
    :param clock: seconds, for the budget; :param sleep: waits out a back-off (tests pass a
        simulated clock and sleep).
    :param draw: the jitter, a number in [0, 1).
    """

    def __init__(
        self,
        budget_s: float = DEFAULT_API_RETRY_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        draw: Callable[[], float] = random.random,
    ):
        if budget_s < 0:
            raise ValueError(f"api_retry_s must be >= 0 seconds, not {budget_s!r}: use e.g. 60")
        self.budget_s = budget_s
        self._clock, self._sleep, self._draw = clock, sleep, draw
        self.retries = 0  # every retry this client made, for the log and reports

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` until it returns or fails with something that is not a blip.

        :param what: the call, for the log (``"list pods ml/trainops/job=train-x"``).
        :raises ApiUnavailable: it kept failing with blips for longer than ``budget_s``.
        """
        tries, since = 0, 0.0
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                found = blip(exc)
                if found is None:
                    raise
                now = self._clock()
                since = now if tries == 0 else since
                tries += 1
                failing = now - since
                remaining = self.budget_s - failing
                wait_at_least = found.retry_after_s or 0.0
                if remaining <= 0 or wait_at_least > remaining:
                    asks = f", Retry-After {wait_at_least:g} s" if wait_at_least else ""
                    raise ApiUnavailable(
                        f"kubernetes API: {what} kept failing for {failing:.1f} s over {tries} "
                        f"tr{'ies' if tries > 1 else 'y'} (last: {found.reason}{asks}), beyond the retry "
                        f"budget of {self.budget_s:g} s: check that the API server is up and "
                        "reachable, or raise api_retry_s",
                        getattr(exc, "status", None),
                    ) from exc
                backoff = backoff_delay(tries, self._draw(), first=FIRST_DELAY_S, cap=MAX_DELAY_S)
                delay = min(max(backoff, wait_at_least), remaining)
                self.retries += 1
                log.warning(
                    "kubernetes API: %s failed (%s); retry %d in %.1f s (%d API retries so far)",
                    what,
                    found.reason,
                    tries,
                    delay,
                    self.retries,
                )
                self._sleep(delay)
