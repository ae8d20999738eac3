"""Per-step training metrics, written by rank 0 as one new immutable part per flush.

Each flush writes the records added since the last one as ``<run>/metrics/part-<attempt>-<n>.jsonl``
(:meth:`trainer.contract.RunLayout.metrics_part`), created with If-None-Match and never
rewritten, so a run's metrics cost O(steps) bytes on ``file://`` and ``s3://`` alike (the
previous version rewrote one ``metrics.jsonl`` whole at each flush: O(steps^2)). The one reader,
:class:`trainer.contract.MetricsReader`, lists the parts and merges them with that legacy file.

What the create-only write guarantees:

- **Nothing is overwritten.** A stale gang of an older attempt writes parts under its own
  attempt number, so it can never erase a newer attempt's records, nor the reverse; readers
  keep, for each step, the record of the last attempt that reached it
  (:func:`trainer.contract.metrics_by_step`).
- **A rerun under the same attempt number** numbers its parts after the highest part of that
  attempt it finds at its first flush (a listing), so it never collides with the earlier run's
  parts; readers then let its parts replace the earlier run's records from the step it resumed
  at (:func:`trainer.contract.merge_metrics`), keeping the steps it did not replay.
- **A retried write counts once.** The records of a part are fixed when it is first tried:
  a flush that failed retries the very same bytes under the same name before it writes
  anything newer. If-None-Match then refusing it (412) means the name is taken: the part is
  read back, and when it holds exactly these bytes the earlier try was stored (its reply was
  lost), so it counts as written; otherwise another writer of the same attempt took the number,
  and the part moves to the next free one.

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

from trainer.contract import MetricsRecord, RunLayout, metrics_part_key, metrics_run_uri
from trainer.storage import NotFound, PreconditionFailed, Storage

log = logging.getLogger("trainer.metrics")

# Part numbers tried per flush: a number is lost only when another writer of the same attempt
# (a rerun while the earlier gang still runs) took it; the records then wait for the next flush.
MAX_ROUNDS = 5
# How long one metrics request may retry an outage: the records are buffered, so a short wait
# is enough, and the loop waits while rank 0 flushes.
OUTAGE_TOLERANCE_S = 10.0
# After a failed flush, how long flushes are skipped before one tries storage again.
RETRY_AFTER_S = 60.0


def part_body(records: list[MetricsRecord]) -> bytes:
    """A part's bytes: one JSON object per line."""
    return "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")


class MetricsLog:
    """Rank 0's metrics writer: this attempt's records, flushed every ``flush_every`` steps.

    :param storage: the client for the run's storage.
    :param uri: the run prefix, or its ``RunLayout.metrics`` (:func:`trainer.contract.metrics_run_uri`).
    :param attempt: the attempt number the records and the parts carry.
    :param flush_every: steps between flushes (``metrics.flush_every``).
    :param retry_after_s: after a failed flush, how long flushes are skipped.
    :param clock: monotonic seconds (tests pass their own).
    """

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
        self.storage, self.attempt, self.flush_every = storage, attempt, flush_every
        self.layout = RunLayout(metrics_run_uri(uri))
        self.uri = self.layout.metrics_parts
        self.retry_after_s, self._clock = retry_after_s, clock
        self._waiting: list[MetricsRecord] = []  # added since the current part was fixed
        self._due = False  # a step that calls for a flush was added since the last one
        self._part: tuple[int, bytes, int] | None = None  # (number, bytes, records): tried, not yet stored
        self._next: int | None = None  # the next part number; None: list to find it
        self.parts_written = 0
        self.bytes_written = 0  # bytes of the parts stored, for benchmarks
        self._failures = 0  # flushes failed in a row (the current outage)
        self._failed_at: float | None = None  # when the last one failed

    @property
    def unwritten(self) -> int:
        """Records of this attempt that storage does not hold yet."""
        return len(self._waiting) + (self._part[2] if self._part else 0)

    def add(
        self,
        *,
        step: int,
        loss: float,
        lr: float,
        tokens_per_s: float,
        time: float,
        flush: bool = True,
        **extra: float,
    ) -> None:
        """Record one step; ``extra`` holds optional figures such as ``mfu`` and ``peak_mem_gib``.

        :param flush: write a part now when ``step`` is a multiple of ``flush_every``; False
            when several steps are added at once (the loop reads losses every
            ``train.log_every`` steps), which then call :meth:`flush_if_due` once, so that
            they make one part, not one per multiple of ``flush_every`` among them.
        """
        self._waiting.append(
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
        self._due = self._due or step % self.flush_every == 0
        if flush:
            self.flush_if_due()

    @property
    def due(self) -> bool:
        """Whether :meth:`flush_if_due` would write now (a multiple of ``flush_every`` was added
        since the last flush)."""
        return self._due

    def flush_if_due(self) -> int:
        """:meth:`flush` if a step added since the last flush was a multiple of ``flush_every``;
        returns how many records are still unwritten."""
        if not self._due:
            return self.unwritten
        self._due = False
        return self.flush()

    def flush(self, *, final: bool = False) -> int:
        """Write what is waiting now, as a new part; never raises. Returns how many records are
        still unwritten.

        :param final: the attempt's last flush: a failure is logged as lost records.
        """
        if not self.unwritten:
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
        self._failures, self._failed_at = 0, None
        return 0

    def _write(self) -> None:
        """Store the part already tried (same number, same bytes), then what waits as the next."""
        while self._part is not None or self._waiting:
            if self._part is None:
                body = part_body(self._waiting)
                self._part = (self._number(), body, len(self._waiting))
                self._waiting = []
            self._store(*self._part)
            self._part = None

    def _store(self, number: int, body: bytes, count: int) -> None:
        for _ in range(MAX_ROUNDS):
            uri = self.layout.metrics_part(self.attempt, number)
            try:
                self.storage.put(uri, body, if_none_match=True)
            except PreconditionFailed:
                try:
                    there = self.storage.get(uri)
                except NotFound:  # deleted between the 412 and the read: the name is free again
                    continue
                if there != body:  # another writer of this attempt took the number
                    self._next = None
                    number = self._number()
                    self._part = (number, body, count)
                    continue
                # else: an earlier try stored these very bytes and its reply was lost
            self._next = number + 1
            self.parts_written += 1
            self.bytes_written += len(body)
            return
        raise PreconditionFailed(
            f"{self.uri}: {MAX_ROUNDS} part numbers of attempt {self.attempt} were taken during one flush"
        )

    def _number(self) -> int:
        """The next part number: after the highest part of this attempt there (listed once, and
        again after a collision), so a rerun of the attempt never collides with the earlier run."""
        if self._next is None:
            highest = 0
            for uri in self.storage.list(self.uri):
                key = metrics_part_key(uri)
                if key is not None and key[0] == self.attempt:
                    highest = max(highest, key[1])
            self._next = highest + 1
        return self._next
