"""Quarantine: drop rows that fail row-level checks, count them, keep a sample to look at.

Enabled by ``quarantine={"max_fraction": f}``. A row is quarantined when a row expectation
flags it, or when staging cannot pack it (a record longer than a shard). Dataset-level
expectations (uniqueness, row counts, non-null share) are checked on the rows that remain,
and cannot be fixed by dropping rows, so they still fail the task. More than ``f`` of the
rows read quarantined fails the task too: that much bad data is a broken delivery.

The sample (``quarantine/sample.jsonl`` under the version prefix) holds the first
``sample_rows`` quarantined rows, one JSON object a line: ``row`` (its number in the
source, counting from 0 across objects in URI order), ``object``, ``reasons`` and the
row's ``values`` (long strings cut to 1000 characters).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections import Counter
from typing import IO

SAMPLE_PATH = "quarantine/sample.jsonl"
_MAX_CHARS = 1000


def over_limit(quarantined: int, read: int, max_fraction: float) -> bool:
    """Whether ``quarantined`` of ``read`` rows is more than ``max_fraction`` allows."""
    return read > 0 and quarantined / read > max_fraction


class QuarantineLog:
    """Counts quarantined rows by reason; writes the first ``sample_rows`` to ``path``."""

    def __init__(self, options: dict, path: str):
        self.max_fraction = options["max_fraction"]
        self.sample_rows = options["sample_rows"]
        self.rows = 0
        self.by_reason: Counter = Counter()
        self.sampled = 0
        self._path = path
        self._file: IO[str] | None = None

    def add(self, uri: str, batch, rows, reasons: dict[int, list[str]]) -> None:
        """Record the rows of ``batch`` (numbered ``rows``) with their ``reasons``."""
        self.rows += batch.num_rows
        for row in rows:
            self.by_reason.update(reasons[int(row)])
        room = self.sample_rows - self.sampled
        if room <= 0:
            return
        if self._file is None:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            self._file = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 - open across batches; close() ends it
        values = batch.slice(0, room).to_pylist()
        for row, record in zip(rows[:room], values, strict=False):
            line = {
                "row": int(row),
                "object": uri,
                "reasons": reasons[int(row)],
                "values": {k: _short(v) for k, v in record.items()},
            }
            self._file.write(json.dumps(line, ensure_ascii=False) + "\n")
        self.sampled += len(values)

    def close(self) -> bool:
        """Finish the sample; True if one was written."""
        if self._file is not None:
            self._file.close()
            self._file = None
        return self.sampled > 0

    def summary(self, read: int) -> dict:
        return {
            "rows": self.rows,
            "rows_read": read,
            "fraction": round(self.rows / read, 6) if read else 0.0,
            "max_fraction": self.max_fraction,
            "by_reason": dict(sorted(self.by_reason.items())),
            "sample": SAMPLE_PATH if self.sampled else None,
            "sample_rows": self.sampled,
        }


def _short(value):
    if isinstance(value, str) and len(value) > _MAX_CHARS:
        return value[:_MAX_CHARS] + "..."
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value[:_MAX_CHARS].decode("utf-8", "replace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
