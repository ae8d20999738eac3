"""The suite on a Spark DataFrame: GX for the row expectations, Spark aggregates for the rest.

Row expectations run in GX Core on the whole frame at once (``add_spark`` ->
``add_dataframe_asset`` -> a whole-dataframe batch; GX's Spark engine reuses the active
session, Spark Connect included), asking for the offending rows' numbers and ids. The
dataset expectations are exact Spark aggregations: uniqueness is a group-by over the whole
column, row counts and null shares are counts. Results go through the same
:func:`~trainops.staging.validation.summarize` as the in-worker engine's, so the report and
the failure message are the same.
"""

from __future__ import annotations

import uuid

from trainops.staging.aggregates import NullProportionCheck, RowCountCheck
from trainops.staging.expectations import ROW_EXPECTATIONS
from trainops.staging.gx_batch import add_suite, ephemeral_context, exception_message, plain, sample_values
from trainops.staging.spark.frame import ROW
from trainops.staging.validation import RowResult, label, summarize

_SAMPLES = 5
# Expectations about the table's shape: checked on the frame without the row number column.
_SHAPE = {
    "expect_column_to_exist",
    "expect_table_columns_to_match_set",
    "expect_table_columns_to_match_ordered_list",
    "expect_table_column_count_to_equal",
    "expect_table_column_count_to_be_between",
}


def validate_frame(frame, expectations: list[dict], *, rows: int, id_column: str = "id") -> dict:
    """The validation summary of ``frame`` (with ``ROW``) against the normalized suite."""
    entries, _ = check_rows(frame, expectations, id_column=id_column)
    entries += check_dataset(frame, expectations, rows=rows, id_column=id_column)
    return summarize(expectations, entries, rows)


def check_rows(
    frame, expectations: list[dict], *, id_column: str = "id", quarantine: bool = False
) -> tuple[list[tuple[dict, dict]], dict[int, list[str]]]:
    """The row expectations, in one GX validation over the whole frame: their
    ``(expectation, result)`` entries and, with ``quarantine``, ``{row: [labels]}`` of the
    rows they flag (GX's complete list of offending rows, gathered on the driver)."""
    columns = [c for c in frame.columns if c != ROW]
    entries: list[tuple[dict, dict]] = []
    flagged: dict[int, list[str]] = {}
    row_exps = [e for e in expectations if e["type"] in ROW_EXPECTATIONS]
    shape = [e for e in row_exps if e["type"] in _SHAPE]
    cells = [e for e in row_exps if e["type"] not in _SHAPE]
    index = [ROW, id_column] if id_column in columns else [ROW]
    results: dict[int, dict] = {}
    for group, target, index_columns in ((shape, frame.select(*columns), []), (cells, frame, index)):
        if group:
            found = _gx_results(target, group, index_columns, id_column, complete=quarantine)
            results.update({id(e): r for e, r in zip(group, found, strict=True)})
    for e in row_exps:  # in suite order, as the worker engine lists a row's reasons
        state = RowResult()
        state.add(results[id(e)], quarantine=quarantine)
        entries.append((e, state.summary(e, quarantine)))
        for row in results[id(e)].get("index_list", []) if quarantine else []:
            flagged.setdefault(row, []).append(label(e))
    return entries, flagged


def check_dataset(
    frame, expectations: list[dict], *, rows: int, id_column: str = "id"
) -> list[tuple[dict, dict]]:
    """The dataset expectations over ``frame`` (the rows that will be staged), ``rows`` of them."""
    columns = [c for c in frame.columns if c != ROW and not c.startswith("_trainops_")]
    return [
        (e, _dataset_result(frame, e, rows, columns, id_column))
        for e in expectations
        if e["type"] not in ROW_EXPECTATIONS
    ]


def _gx_results(
    frame, expectations: list[dict], index_columns: list[str], id_column: str, *, complete: bool = False
) -> list[dict]:
    """One GX validation over the whole frame; per expectation, in suite order, the dict
    :class:`~trainops.staging.validation.RowResult` takes."""
    context = ephemeral_context()
    name = f"trainops-spark-{uuid.uuid4().hex[:8]}"
    asset = context.data_sources.add_spark(name).add_dataframe_asset(name)
    batch = asset.add_batch_definition_whole_dataframe(name).get_batch(batch_parameters={"dataframe": frame})
    suite = add_suite(context, name, expectations)
    result_format: dict = {
        "result_format": "COMPLETE" if complete else "SUMMARY",
        "partial_unexpected_count": 20,
    }
    if index_columns:
        result_format["unexpected_index_column_names"] = index_columns
    res = batch.validate(suite, result_format=result_format)
    by_id = {r.expectation_config.id: r for r in res.results}
    return [_result(by_id[x.id], id_column, complete) for x in suite.expectations]


def _result(r, id_column: str, complete: bool = False) -> dict:
    out: dict = {"success": bool(r.success)}
    err = exception_message(r.exception_info)
    if err:
        return {"success": False, "error": err}
    result = r.result or {}
    for key in ("unexpected_count", "element_count", "missing_count"):
        if result.get(key) is not None:
            out[key] = int(result[key])
    if "observed_value" in result:
        out["observed_value"] = plain(result["observed_value"])
    hits = [h for h in result.get("partial_unexpected_index_list") or [] if isinstance(h, dict) and ROW in h]
    every = result.get("unexpected_index_list")
    if complete and every is not None:
        indexed = [h for h in every if isinstance(h, dict) and ROW in h]
        if len(indexed) == len(every):  # every offending row named: all can be quarantined
            hits = indexed
            out["index_list"] = sorted(int(h[ROW]) for h in hits)
    hits.sort(key=lambda h: int(h[ROW]))
    out["rows"] = [int(h[ROW]) for h in hits[:_SAMPLES]]
    column = (r.expectation_config.kwargs or {}).get("column")  # GX keeps its value beside the index
    out["values"] = sample_values(h.get(column) for h in hits) if isinstance(column, str) else []
    ids = [h.get(id_column) for h in hits[: _SAMPLES * 4]]
    out["ids"] = [str(v) for v in ids if v is not None][:_SAMPLES]
    return out


def _dataset_result(frame, e: dict, rows: int, columns: list[str], id_column: str) -> dict:
    from pyspark.sql import functions as F

    column = e["kwargs"].get("column")
    if e["type"] in ("expect_table_row_count_to_be_between", "expect_table_row_count_to_equal"):
        check = RowCountCheck(e)
        check.rows = rows
        return check.result()
    if column not in columns:
        return {
            "success": False,
            "unexpected_count": None,
            "error": f"column {column!r} does not exist (columns: {columns})",
        }
    if e["type"] == "expect_column_proportion_of_non_null_values_to_be_between":
        nulls = frame.select(F.count(F.when(F.col(f"`{column}`").isNull(), 1)).alias("n")).first()
        share = NullProportionCheck(e)
        share.rows, share.nulls = rows, int(nulls["n"] if nulls else 0)
        return share.result()
    return _unique(frame, column, id_column)


def _unique(frame, column: str, id_column: str) -> dict:
    """``expect_column_values_to_be_unique`` exactly, as GX counts it: every occurrence of a
    repeated value is unexpected; nulls are ignored; values compared as strings."""
    from pyspark.sql import functions as F

    value = F.col(f"`{column}`").cast("string")
    dupes = (
        frame.where(value.isNotNull())
        .groupBy(value.alias("value"))
        .agg(F.count(F.lit(1)).alias("n"), F.min(ROW).alias("first"))
        .where(F.col("n") > 1)
    )
    total = dupes.agg(F.sum("n").alias("u")).first()
    unexpected = int(total["u"] or 0) if total else 0
    smallest = dupes.orderBy("value").limit(_SAMPLES).collect()
    firsts = [int(r["first"]) for r in smallest]
    ids: dict[int, str] = {}
    if firsts:
        ident = F.col(f"`{id_column}`") if id_column in frame.columns else F.lit(None)
        for r in frame.where(F.col(ROW).isin(firsts)).select(ROW, ident.cast("string").alias("i")).collect():
            ids[int(r[ROW])] = r["i"]
    return {
        "success": unexpected == 0,
        "unexpected_count": unexpected,
        "sample_ids": sorted(str(ids.get(f)) for f in firsts if ids.get(f) is not None),
        "sample_values": [r["value"] for r in smallest],
        "sample_rows": sorted(firsts),
    }
