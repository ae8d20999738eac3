"""Per-step training metrics in ``<run_uri>/metrics.jsonl``, rewritten whole at flush points.

S3 has no append, so a flush reads the file, keeps every other attempt's records, adds this
attempt's and writes it back with a compare-and-swap (If-Match): a stale gang still running
can never erase a newer attempt's records, nor the reverse. Records carry their attempt number;
readers keep, for each step, the record of the last attempt that reached it
(:func:`trainer.contract.metrics_by_step`).

A flush that fails (storage down or refusing) never stops training: the records stay buffered,
the failure is logged once per outage with the count of records waiting, and flushes are
skipped for ``retry_after_s`` before the next one tries again, so an outage stalls the loop for
one flush's tolerance, not every flush's (the trainer opens the metrics' storage with a short
tolerance, :data:`OUTAGE_TOLERANCE_S`). Only the final flush of an attempt, which always
tries, reports what could not be written, and the attempt record says so
(``metrics_unwritten``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from trainer.contract import MetricsRecord, metrics_records
from trainer.storage import NotFound, PreconditionFailed, Storage

log = logging.getLogger("trainer.metrics")

# Compare-and-swap rounds per flush: a round is lost only when another process wrote the file
# meanwhile (a stale gang of an older attempt); the records then wait for the next flush.
MAX_ROUNDS = 5
# How long one metrics request may retry an outage: the records are buffered, so a short wait
# is enough, and the loop waits while rank 0 flushes.
OUTAGE_TOLERANCE_S = 10.0
# After a failed flush, how long flushes are skipped before one tries storage again.
RETRY_AFTER_S = 60.0


def merged(existing: list[MetricsRecord], mine: list[MetricsRecord], attempt: int) -> list[MetricsRecord]:
    """The file's records after this attempt's flush: every other attempt's as they were, then
    ``mine``. This attempt's records already in the file are replaced from the step ``mine``
    starts at (a rerun under the same attempt number keeps what it did not replay)."""
    first = mine[0]["step"] if mine else None
    kept = [r for r in existing if r.get("attempt") != attempt or (first is not None and r["step"] < first)]
    return kept + mine


class MetricsLog:
    """Rank 0's metrics file writer: this attempt's records, flushed every ``flush_every`` steps."""

    def __init__(
        self,
        storage: Storage,
        uri: str,
        attempt: int,
        flush_every: int,
        *,
        retry_after_s: float = RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.storage, self.uri, self.attempt, self.flush_every = storage, uri, attempt, flush_every
        self.retry_after_s, self._clock = retry_after_s, clock
        self.records: list[MetricsRecord] = []
        self._dirty = False
        self._written = 0  # how many of self.records the file holds
        self._failures = 0  # flushes failed in a row (the current outage)
        self._failed_at: float | None = None  # when the last one failed

    @property
    def unwritten(self) -> int:
        """Records of this attempt that the file does not hold yet."""
        return len(self.records) - self._written

    def add(
        self, *, step: int, loss: float, lr: float, tokens_per_s: float, time: float, **extra: float
    ) -> None:
        """Record one step; ``extra`` holds optional figures such as ``mfu`` and ``peak_mem_gib``."""
        self.records.append(
            {
                "step": step,
                "loss": loss,
                "lr": lr,
                "tokens_per_s": tokens_per_s,
                "attempt": self.attempt,
                "time": time,
                **extra,
            }
        )
        self._dirty = True
        if step % self.flush_every == 0:
            self.flush()

    def flush(self, *, final: bool = False) -> int:
        """Write the file now; never raises. Returns how many records are still unwritten.

        :param final: the attempt's last flush: a failure is logged as lost records.
        """
        if not self._dirty:
            return 0
        if not final and self._failed_at is not None and self._clock() - self._failed_at < self.retry_after_s:
            return self.unwritten  # storage failed a moment ago: let the records wait, do not stall
        try:
            self._write()
        except Exception as exc:  # storage down or refusing: training goes on, the records wait
            self._failures += 1
            self._failed_at = self._clock()
            if final:
                log.error(
                    "metrics: %d records of attempt %d could not be written to %s (%s: %s); "
                    "the attempt record says so",
                    self.unwritten,
                    self.attempt,
                    self.uri,
                    type(exc).__name__,
                    exc,
                )
            elif self._failures == 1:
                log.warning(
                    "metrics: could not write %s (%s: %s); %d records wait for the next flush, "
                    "training goes on",
                    self.uri,
                    type(exc).__name__,
                    exc,
                    self.unwritten,
                )
            return self.unwritten
        if self._failures:
            log.info(
                "metrics: %s written again after %d failed flushes; nothing was lost",
                self.uri,
                self._failures,
            )
        self._failures, self._dirty, self._written = 0, False, len(self.records)
        self._failed_at = None
        return 0

    def _write(self) -> None:
        for _ in range(MAX_ROUNDS):
            try:
                body, etag = self.storage.get_with_etag(self.uri)
                existing: list[MetricsRecord] = metrics_records(body.decode("utf-8", errors="replace"))
            except NotFound:
                existing, etag = [], None
            text = "".join(json.dumps(r) + "\n" for r in merged(existing, self.records, self.attempt))
            try:
                if etag is None:
                    self.storage.put(self.uri, text.encode("utf-8"), if_none_match=True)
                else:
                    self.storage.put(self.uri, text.encode("utf-8"), if_match=etag)
                return
            except PreconditionFailed:
                continue  # another writer came between: merge with what it wrote
        raise PreconditionFailed(f"{self.uri} changed {MAX_ROUNDS} times during one flush")
