"""Validate a stream of record batches against a suite, with GX Core and streaming aggregates.

Row expectations run in GX on every batch and their counts are summed; dataset
expectations (uniqueness, row counts, non-null share) are computed by :mod:`aggregates`
and :mod:`uniqueness` over all batches. Both end up in one plain summary dict, which is
``validation.json``::

    {"success": bool, "evaluated_expectations": int, "successful_expectations": int,
     "failed": [{"expectation", "column", "kwargs", "unexpected_count", "sample_ids", ...}],
     "results": [every expectation, in suite order, as in "failed" plus "success"],
     "rows": int}

With quarantine, rows that a row expectation flags are reported to the caller, which
drops them; dataset expectations then see only the rows that are kept, and a row
expectation whose every offending row was dropped no longer fails the dataset.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable

from trainops.staging.aggregates import NullProportionCheck, RowCountCheck
from trainops.staging.expectations import ROW_EXPECTATIONS, columns_of, scope_of
from trainops.staging.gx_batch import GXBatchValidator
from trainops.staging.uniqueness import MIN_PARTITIONS, UniqueCheck

_SAMPLES = 5


def validate_batches(
    batches: Iterable, expectations: list[dict], *, id_column: str = "id", spill_dir: str | None = None
) -> dict:
    """Check every batch (pyarrow RecordBatches) against ``expectations`` (normalized).

    The GX suite is built before the first batch is pulled, so a bad expectation fails
    before any data is read.
    """
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="trainops-unique-", dir=spill_dir) as spill:
        validator = DatasetValidator(expectations, id_column=id_column, spill_dir=spill)
        offset = 0
        for batch in batches:
            validator.check_rows(batch, offset)
            validator.observe(batch, np.arange(offset, offset + batch.num_rows))
            offset += batch.num_rows
        return validator.summary()


def label(expectation: dict) -> str:
    """``expect_column_values_to_not_be_null(text)``: how a quarantined row names its reason."""
    cols = columns_of(expectation)
    return f"{expectation['type']}({', '.join(cols)})" if cols else expectation["type"]


class DatasetValidator:
    """Row expectations batch by batch (:meth:`check_rows`), dataset expectations over the
    rows that are kept (:meth:`observe`), one summary at the end.

    :param spill_dir: local folder for the uniqueness partitions.
    :param quarantine: ask GX for every offending row so the caller can drop them.
    """

    def __init__(
        self,
        expectations: list[dict],
        *,
        id_column: str = "id",
        spill_dir: str,
        partitions: int = MIN_PARTITIONS,
        quarantine: bool = False,
    ):
        for e in expectations:
            scope_of(e["type"])
        self.expectations = expectations
        self.id_column = id_column
        self.quarantine = quarantine
        self.row_exps = [e for e in expectations if e["type"] in ROW_EXPECTATIONS]
        self._labels = [label(e) for e in self.row_exps]
        if self.row_exps:
            self._gx: GXBatchValidator | None = GXBatchValidator(self.row_exps, complete=quarantine)
        else:
            self._gx = None
        self._row_state = [RowResult() for _ in self.row_exps]
        self._dataset_checks: list[UniqueCheck | NullProportionCheck | RowCountCheck] = []
        for n, e in enumerate(e for e in expectations if e["type"] not in ROW_EXPECTATIONS):
            check: UniqueCheck | NullProportionCheck | RowCountCheck
            if e["type"] == "expect_column_values_to_be_unique":
                check = UniqueCheck(e, id_column, f"{spill_dir}/unique-{n}", partitions)
            elif e["type"] == "expect_column_proportion_of_non_null_values_to_be_between":
                check = NullProportionCheck(e)
            else:
                check = RowCountCheck(e)
            self._dataset_checks.append(check)
        self._missing: dict[int, str] = {}
        self.rows = 0

    def check_rows(self, batch, offset: int) -> dict[int, list[str]]:
        """Run the row expectations on one batch whose first row is row ``offset``.

        Returns ``{row number: [labels of the expectations it fails]}`` for rows that can be
        quarantined (empty unless ``quarantine``).
        """
        self.rows += batch.num_rows
        if self._gx is None:
            return {}
        bad: dict[int, list[str]] = {}
        results = self._gx.validate(batch, offset, self.id_column)
        for name, state, result in zip(self._labels, self._row_state, results, strict=False):
            state.add(result, quarantine=self.quarantine)
            for row in result.get("index_list", []) if self.quarantine else []:
                bad.setdefault(row, []).append(name)
        return bad

    def observe(self, batch, rows) -> None:
        """Feed the dataset expectations the rows that will be staged (``rows``: their numbers)."""
        names = batch.schema.names
        for i, check in enumerate(self._dataset_checks):
            column = getattr(check, "column", None)
            if column is not None and column not in names:
                self._missing[i] = f"column {column!r} does not exist (columns: {names})"
            else:
                check.update(batch, rows)

    def summary(self) -> dict:
        entries = [
            (e, s.summary(e, self.quarantine)) for e, s in zip(self.row_exps, self._row_state, strict=False)
        ]
        for i, check in enumerate(self._dataset_checks):
            res = check.result()
            if i in self._missing:
                res = {"success": False, "unexpected_count": None, "error": self._missing[i]}
            entries.append((check.expectation, res))
        return summarize(self.expectations, entries, self.rows)


def summarize(expectations: list[dict], entries: list[tuple[dict, dict]], rows: int) -> dict:
    """The summary (``validation.json``) from ``(expectation, result)`` pairs, in suite order.

    Both engines end here: the in-worker validator and the Spark one compute the results
    their own way and report them in one shape.
    """
    order = {id(e): n for n, e in enumerate(expectations)}
    entries = sorted(entries, key=lambda item: order[id(item[0])])
    results = [_entry(e, res) for e, res in entries]
    failed = [
        {k: v for k, v in r.items() if k not in ("success", "quarantined")}
        for r in results
        if not r["success"]
    ]
    return {
        "success": not failed,
        "evaluated_expectations": len(expectations),
        "successful_expectations": len(expectations) - len(failed),
        "failed": failed,
        "results": results,
        "rows": rows,
    }


def _entry(expectation: dict, res: dict) -> dict:
    cols = columns_of(expectation)
    out = {
        "expectation": expectation["type"],
        "column": cols[0] if len(cols) == 1 else (cols or None),
        "kwargs": expectation["kwargs"],
        "success": bool(res["success"]),
        "unexpected_count": res.get("unexpected_count"),
        "sample_ids": res.get("sample_ids", []),
    }
    for key in ("sample_rows", "sample_values", "observed_value", "error", "quarantined"):
        if res.get(key) is not None:
            out[key] = res[key]
    return out


class RowResult:
    """Sums one row expectation's per-batch GX results into a dataset result."""

    def __init__(self):
        self.all_ok = True
        self.unexpected = 0
        self.counted = False
        self.elements = 0
        self.missing = 0
        self.all_indexed = True  # every offending row was named, so all can be quarantined
        self.sample_rows: list[int] = []
        self.sample_ids: list[str] = []
        self.sample_values: list = []
        self.observed = None
        self.error = None

    def add(self, r: dict, *, quarantine: bool = False) -> None:
        self.all_ok &= r["success"]
        if r.get("error") and self.error is None:
            self.error = r["error"]
        if not r["success"] and self.observed is None and r.get("observed_value") is not None:
            self.observed = r["observed_value"]
        if not r["success"] and (r.get("error") or "index_list" not in r):
            self.all_indexed = False
        if r.get("unexpected_count") is not None:
            self.counted = True
            self.unexpected += r["unexpected_count"]
            self.elements += r.get("element_count") or 0
            self.missing += r.get("missing_count") or 0
        self.sample_rows += r.get("rows", [])[: _SAMPLES - len(self.sample_rows)]
        self.sample_ids += r.get("ids", [])[: _SAMPLES - len(self.sample_ids)]
        self.sample_values += r.get("values", [])[: _SAMPLES - len(self.sample_values)]

    def summary(self, expectation: dict, quarantine: bool = False) -> dict:
        success = self.all_ok
        mostly = expectation["kwargs"].get("mostly")
        if self.error is None and self.counted and mostly is not None:
            # Per batch, GX applies `mostly` to that batch; the dataset answer needs the sums.
            base = (
                self.elements
                if expectation["type"].endswith("not_be_null")
                else (self.elements - self.missing)
            )
            success = base == 0 or self.unexpected / base <= 1 - mostly
        out = {
            "success": success,
            "unexpected_count": self.unexpected if self.counted else None,
            "sample_ids": self.sample_ids,
            "sample_rows": self.sample_rows or None,
            "sample_values": self.sample_values or None,
            "observed_value": self.observed,
            "error": self.error,
        }
        if quarantine and self.error is None and self.all_indexed and self.unexpected:
            # Every offending row was dropped: what is staged meets the expectation.
            out.update(success=True, quarantined=self.unexpected)
        return out


def describe_failures(source_uri: str, summary: dict) -> str:
    """One message naming every failed expectation with its column, count and sample ids."""
    parts = []
    for f in summary["failed"]:
        where = (
            f" on {f['column']!r}"
            if isinstance(f.get("column"), str)
            else (f" on {f['column']}" if f.get("column") else "")
        )
        text = f"{f['expectation']}{where}"
        count = f.get("unexpected_count")
        if f.get("error"):
            text += f": error {f['error']}"
        elif "observed_value" in f:
            text += f": observed {f['observed_value']!r}" + (f" ({count} unexpected)" if count else "")
        elif count is not None:
            text += f": {count} unexpected"
        if f.get("sample_ids"):
            text += f" (ids {', '.join(repr(i) for i in f['sample_ids'][:_SAMPLES])})"
        elif f.get("sample_rows"):
            text += f" (rows {', '.join(str(r) for r in f['sample_rows'][:_SAMPLES])})"
        parts.append(text)
    return (
        f"source {source_uri!r} failed {len(summary['failed'])} of "
        f"{summary['evaluated_expectations']} expectations over {summary['rows']} rows, so "
        f"nothing was staged: {'; '.join(parts)}; fix the data or the expectations"
    )


def failure_lines(summary: dict) -> list[str]:
    """One line per failed expectation, for a log and the demo's summary:
    ``staging rejected the data: text: expect_column_value_lengths_to_be_between failed for 3
    rows (e.g. '')``; the column, the expectation, what failed and one sample."""
    return [f"staging rejected the data: {_failure(f)}" for f in summary.get("failed") or []]


def _failure(f: dict) -> str:
    column = f.get("column")
    where = f"{', '.join(column) if isinstance(column, list) else column}: " if column else ""
    text = f"{where}{f['expectation']} failed"
    count = f.get("unexpected_count")
    if f.get("error"):
        return f"{text}: {f['error']}"
    if count:
        text += f" for {count:,} row{'s' if count != 1 else ''}"
    if f.get("observed_value") is not None:
        text += f" (observed {f['observed_value']!r})"
    sample = _sample(f)
    return f"{text} (e.g. {sample})" if sample else text


def _sample(f: dict) -> str | None:
    """One offending value (``''``), else its row's id or number; None when none was kept."""
    if f.get("sample_values"):
        return repr(f["sample_values"][0])
    if f.get("sample_ids"):
        return f"id {f['sample_ids'][0]!r}"
    if f.get("sample_rows"):
        return f"row {f['sample_rows'][0]}"
    return None
