"""Dataset-level expectations, computed with streaming aggregates over batches.

GX sees one batch at a time, so it cannot tell whether an id in batch 7 repeats one
from batch 2, nor what the dataset's row count is. These aggregates can. Plain
Python over plain values; no GX here.
"""

from __future__ import annotations

from collections import Counter

_SAMPLES = 5


class UniqueCheck:
    """``expect_column_values_to_be_unique`` over the whole dataset.

    Counts like GX: every occurrence of a repeated value is unexpected (two rows sharing
    an id give an unexpected_count of 2), nulls are ignored.
    """

    def __init__(self, expectation: dict, id_column: str):
        self.expectation = expectation
        self.column = expectation["kwargs"]["column"]
        self.id_column = id_column
        # Holds every value in memory: fine for the skeleton's datasets; a later issue
        # replaces it with hash partitions spilled to disk for datasets larger than memory.
        self._counts: Counter = Counter()
        # For a column other than the id, remember one id per value to name offending rows.
        self._first_id: dict = {}

    def update(self, values: list, ids: list | None = None) -> None:
        track_ids = ids is not None and self.column != self.id_column
        for i, value in enumerate(values):
            if value is None:
                continue
            self._counts[value] += 1
            if track_ids and value not in self._first_id:
                self._first_id[value] = ids[i]

    def result(self) -> dict:
        dupes = [(v, c) for v, c in self._counts.items() if c > 1]
        unexpected = sum(c for _, c in dupes)
        sample_values = sorted(str(v) for v, _ in dupes)[:_SAMPLES]
        if self.column == self.id_column:
            sample_ids = sample_values
        else:
            sample_ids = sorted(str(self._first_id.get(v)) for v, _ in dupes)[:_SAMPLES]
        return {
            "success": unexpected == 0,
            "unexpected_count": unexpected,
            "sample_ids": sample_ids,
            "sample_values": sample_values,
        }


class RowCountCheck:
    """``expect_table_row_count_to_be_between`` / ``_to_equal`` over the whole dataset."""

    def __init__(self, expectation: dict):
        self.expectation = expectation
        kw = expectation["kwargs"]
        if expectation["type"] == "expect_table_row_count_to_equal":
            self.low = self.high = kw["value"]
        else:
            self.low, self.high = kw.get("min_value"), kw.get("max_value")
        self.rows = 0

    def update(self, n_rows: int) -> None:
        self.rows += n_rows

    def result(self) -> dict:
        ok = (self.low is None or self.rows >= self.low) and (
            self.high is None or self.rows <= self.high
        )
        return {"success": ok, "observed_value": self.rows}
