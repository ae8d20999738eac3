"""Per-step training metrics in ``<run_uri>/metrics.jsonl``, rewritten whole at flush points.

S3 has no append, so rank 0 keeps every record (earlier attempts' too) in memory and
rewrites the file. Records carry their attempt number; readers keep, for each step, the
record of the last attempt that reached it (:func:`trainer.contract.metrics_by_step`).
"""

from __future__ import annotations

import json
import logging

from trainer.contract import metrics_records
from trainer.storage import NotFound, Storage

log = logging.getLogger("trainer.metrics")


class MetricsLog:
    """Rank 0's metrics file writer."""

    def __init__(self, storage: Storage, uri: str, attempt: int, flush_every: int):
        self.storage, self.uri, self.attempt, self.flush_every = storage, uri, attempt, flush_every
        try:
            self.records = metrics_records(storage.get(uri).decode("utf-8"))
        except NotFound:
            self.records = []
        self._dirty = False

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

    def flush(self) -> None:
        if not self._dirty:
            return
        text = "".join(json.dumps(r) + "\n" for r in self.records)
        self.storage.put(self.uri, text.encode("utf-8"))
        self._dirty = False
