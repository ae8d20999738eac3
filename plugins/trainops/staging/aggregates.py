"""Dataset-level expectations computed with streaming aggregates over batches.

GX sees one batch at a time, so it cannot tell what the dataset's row count or overall
null share is. These counters can: each keeps a few integers, whatever the dataset's
size. Uniqueness across batches needs more than counters; see :mod:`uniqueness`.
Plain Python over plain values; no GX here.
"""

from __future__ import annotations


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

    def update(self, batch, rows=None) -> None:
        self.rows += batch.num_rows

    def result(self) -> dict:
        ok = (self.low is None or self.rows >= self.low) and (self.high is None or self.rows <= self.high)
        return {"success": ok, "observed_value": self.rows}


class NullProportionCheck:
    """``expect_column_proportion_of_non_null_values_to_be_between`` over the whole dataset.

    The share of non-null values among all rows (GX's definition); an empty dataset has
    no share and fails.
    """

    def __init__(self, expectation: dict):
        self.expectation = expectation
        self.column = expectation["kwargs"]["column"]
        self.low = expectation["kwargs"].get("min_value")
        self.high = expectation["kwargs"].get("max_value")
        self.rows = 0
        self.nulls = 0

    def update(self, batch, rows=None) -> None:
        self.rows += batch.num_rows
        self.nulls += batch.column(batch.schema.get_field_index(self.column)).null_count

    def result(self) -> dict:
        if self.rows == 0:
            return {"success": False, "observed_value": None, "unexpected_count": 0}
        share = (self.rows - self.nulls) / self.rows
        ok = (self.low is None or share >= self.low) and (self.high is None or share <= self.high)
        return {"success": ok, "observed_value": round(share, 6), "unexpected_count": self.nulls}
