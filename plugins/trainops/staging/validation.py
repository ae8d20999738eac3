"""Validate a stream of record batches against a suite, with GX Core and streaming aggregates.

Row expectations run in GX on each batch and their counts are summed; dataset
expectations (uniqueness, row counts) are computed by :mod:`aggregates` over all
batches. Both end up in one plain summary dict::

    {"success": bool, "evaluated_expectations": int, "successful_expectations": int,
     "failed": [{"expectation", "column", "kwargs", "unexpected_count", "sample_ids", ...}],
     "rows": int}
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from trainops.staging.aggregates import RowCountCheck, UniqueCheck
from trainops.staging.expectations import ROW_EXPECTATIONS, columns_of, scope_of

_SAMPLES = 5


def validate_batches(batches: Iterable, expectations: list[dict], *, id_column: str = "id") -> dict:
    """Check every batch (pyarrow RecordBatches) against ``expectations`` (normalized).

    The GX suite is built before the first batch is pulled, so a bad expectation fails
    before any data is read.
    """
    for e in expectations:
        scope_of(e["type"])
    row_exps = [e for e in expectations if e["type"] in ROW_EXPECTATIONS]
    validator = _GXBatchValidator(row_exps) if row_exps else None
    row_state = [_RowResult() for _ in row_exps]
    dataset_checks = [
        UniqueCheck(e, id_column) if e["type"] == "expect_column_values_to_be_unique"
        else RowCountCheck(e)
        for e in expectations if e["type"] not in ROW_EXPECTATIONS
    ]
    missing_columns: dict[int, str] = {}
    rows = 0
    for batch in batches:
        names = batch.schema.names
        ids = batch.column(id_column).to_pylist() if id_column in names else None
        for i, check in enumerate(dataset_checks):
            if isinstance(check, RowCountCheck):
                check.update(batch.num_rows)
            elif check.column not in names:
                missing_columns[i] = f"column {check.column!r} does not exist (columns: {names})"
            else:
                check.update(batch.column(check.column).to_pylist(), ids)
        if validator is not None:
            for state, result in zip(row_state, validator.validate(batch, rows, id_column)):
                state.add(result)
        rows += batch.num_rows

    entries = [(e, s.summary(e)) for e, s in zip(row_exps, row_state)]
    for i, check in enumerate(dataset_checks):
        res = check.result()
        if i in missing_columns:
            res = {"success": False, "unexpected_count": None, "error": missing_columns[i]}
        entries.append((check.expectation, res))
    failed = [_failure(e, res) for e, res in entries if not res["success"]]
    order = {id(e): n for n, e in enumerate(expectations)}
    failed.sort(key=lambda f: order[f.pop("_key")])
    return {
        "success": not failed,
        "evaluated_expectations": len(expectations),
        "successful_expectations": len(expectations) - len(failed),
        "failed": failed,
        "rows": rows,
    }


def _failure(expectation: dict, res: dict) -> dict:
    cols = columns_of(expectation)
    out = {
        "_key": id(expectation),
        "expectation": expectation["type"],
        "column": cols[0] if len(cols) == 1 else (cols or None),
        "kwargs": expectation["kwargs"],
        "unexpected_count": res.get("unexpected_count"),
        "sample_ids": res.get("sample_ids", []),
    }
    for key in ("sample_rows", "sample_values", "observed_value", "error"):
        if res.get(key) is not None:
            out[key] = res[key]
    return out


class _RowResult:
    """Sums one row expectation's per-batch GX results into a dataset result."""

    def __init__(self):
        self.batches = 0
        self.all_ok = True
        self.unexpected = 0
        self.counted = False
        self.elements = 0
        self.missing = 0
        self.sample_rows: list[int] = []
        self.sample_ids: list[str] = []
        self.observed = None
        self.error = None

    def add(self, r: dict) -> None:
        self.batches += 1
        self.all_ok &= r["success"]
        if r.get("error") and self.error is None:
            self.error = r["error"]
        if not r["success"] and self.observed is None and r.get("observed_value") is not None:
            self.observed = r["observed_value"]
        if r.get("unexpected_count") is not None:
            self.counted = True
            self.unexpected += r["unexpected_count"]
            self.elements += r.get("element_count") or 0
            self.missing += r.get("missing_count") or 0
        self.sample_rows += r.get("rows", [])[: _SAMPLES - len(self.sample_rows)]
        self.sample_ids += r.get("ids", [])[: _SAMPLES - len(self.sample_ids)]

    def summary(self, expectation: dict) -> dict:
        success = self.all_ok
        mostly = expectation["kwargs"].get("mostly")
        if self.error is None and self.counted and mostly is not None:
            # Per batch, GX applies `mostly` to that batch; the dataset answer needs the sums.
            base = self.elements if expectation["type"].endswith("not_be_null") else (
                self.elements - self.missing)
            success = base == 0 or self.unexpected / base <= 1 - mostly
        return {
            "success": success,
            "unexpected_count": self.unexpected if self.counted else None,
            "sample_ids": self.sample_ids,
            "sample_rows": self.sample_rows or None,
            "observed_value": self.observed,
            "error": self.error,
        }


class _GXBatchValidator:
    """One ephemeral GX context and suite, reused for every batch."""

    def __init__(self, expectations: list[dict]):
        import great_expectations as gx
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )

        logging.getLogger("great_expectations").setLevel(logging.ERROR)
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        )
        context = gx.get_context(mode="ephemeral", project_config=config)
        name = f"trainops-{uuid.uuid4().hex[:8]}"
        asset = context.data_sources.add_pandas(name).add_dataframe_asset(name)
        self._batch_definition = asset.add_batch_definition_whole_dataframe(name)
        suite = gx.ExpectationSuite(name=name)
        for e in expectations:
            cls = getattr(gx.expectations, ROW_EXPECTATIONS[e["type"]])
            try:
                suite.add_expectation(cls(**e["kwargs"]))
            except Exception as exc:
                detail = " ".join(str(exc).split())
                raise ValueError(
                    f"expectation {e['type']} has invalid kwargs {e['kwargs']!r}: {detail}"
                ) from None
        self._suite = context.suites.add(suite)
        self._ids = [x.id for x in self._suite.expectations]

    def validate(self, batch, offset: int, id_column: str) -> list[dict]:
        """Per-expectation results for one batch, in suite order; rows numbered from offset."""
        import pandas as pd

        df = batch.to_pandas()
        df.index = pd.RangeIndex(offset, offset + len(df))
        gx_batch = self._batch_definition.get_batch(batch_parameters={"dataframe": df})
        res = gx_batch.validate(
            self._suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": 20}
        )
        by_id = {r.expectation_config.id: r for r in res.results}
        return [_batch_result(by_id[i], df, id_column) for i in self._ids]


def _batch_result(r, df, id_column: str) -> dict:
    out = {"success": bool(r.success)}
    err = _exception_message(r.exception_info)
    if err:
        out["success"] = False
        out["error"] = err
        return out
    result = r.result or {}
    for key in ("unexpected_count", "element_count", "missing_count"):
        if result.get(key) is not None:
            out[key] = int(result[key])
    if "observed_value" in result:
        out["observed_value"] = _plain(result["observed_value"])
    rows = [int(i) for i in result.get("partial_unexpected_index_list") or [] if _is_int(i)]
    out["rows"] = rows[:_SAMPLES]
    if id_column in df.columns:
        ids = (df.at[i, id_column] for i in rows)
        out["ids"] = [str(v) for v in ids if isinstance(v, str) or (v is not None and v == v)]
        out["ids"] = out["ids"][:_SAMPLES]
    return out


def _exception_message(info) -> str | None:
    if not isinstance(info, dict):
        return None
    if "raised_exception" in info:
        return info.get("exception_message") if info.get("raised_exception") else None
    for value in info.values():
        msg = _exception_message(value)
        if msg:
            return msg
    return None


def _is_int(value) -> bool:
    try:
        return int(value) == value
    except (TypeError, ValueError):
        return False


def _plain(value):
    """Make a GX observed value JSON-safe."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "item"):  # numpy scalars
        return _plain(value.item())
    return str(value)


def describe_failures(source_uri: str, summary: dict) -> str:
    """One message naming every failed expectation with its column, count and sample ids."""
    parts = []
    for f in summary["failed"]:
        where = f" on {f['column']!r}" if isinstance(f.get("column"), str) else (
            f" on {f['column']}" if f.get("column") else "")
        text = f"{f['expectation']}{where}"
        if f.get("error"):
            text += f": error {f['error']}"
        elif f.get("unexpected_count") is not None:
            text += f": {f['unexpected_count']} unexpected"
        elif "observed_value" in f:
            text += f": observed {f['observed_value']!r}"
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
