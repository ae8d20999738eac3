"""Per-step training metrics in ``<run_uri>/metrics.jsonl``, rewritten whole at flush points.

S3 has no append, so rank 0 keeps every record (earlier attempts' too) in memory and
rewrites the file. Records carry their attempt number; readers keep, for each step, the
record of the last attempt that reached it (:func:`latest_by_step`).
"""

from __future__ import annotations

import json
import logging

from trainer.storage import NotFound

log = logging.getLogger("trainer.metrics")


def parse_jsonl(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn line from a writer that did not finish; the rest still counts
    return records


def latest_by_step(records: list[dict]) -> dict[int, dict]:
    """``{step: record}``, the record of the highest attempt winning (file order breaks ties)."""
    out: dict[int, dict] = {}
    for record in records:
        step = record.get("step")
        if step is None:
            continue
        if step not in out or record.get("attempt", 0) >= out[step].get("attempt", 0):
            out[step] = record
    return out


class MetricsLog:
    """Rank 0's metrics file writer."""

    def __init__(self, storage, uri: str, attempt: int, flush_every: int):
        self.storage, self.uri, self.attempt, self.flush_every = storage, uri, attempt, flush_every
        try:
            self.records = parse_jsonl(storage.get(uri).decode("utf-8"))
        except NotFound:
            self.records = []
        self._dirty = False

    def add(self, *, step: int, loss: float, lr: float, tokens_per_s: float, time: float,
            **extra: float) -> None:
        """Record one step; ``extra`` holds optional figures such as ``mfu`` and ``peak_mem_gib``."""
        self.records.append({"step": step, "loss": loss, "lr": lr, "tokens_per_s": tokens_per_s,
                             "attempt": self.attempt, "time": time, **extra})
        self._dirty = True
        if step % self.flush_every == 0:
            self.flush()

    def flush(self) -> None:
        if not self._dirty:
            return
        text = "".join(json.dumps(r) + "\n" for r in self.records)
        self.storage.put(self.uri, text.encode("utf-8"))
        self._dirty = False
