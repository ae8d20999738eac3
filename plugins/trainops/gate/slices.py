"""Per-slice gate checks: great-expectations expectations over the per-slice metrics table.

The evaluation reports, for every slice column of the dataset (for example ``source``) and
every value of it, the candidate's and the production model's loss on the eval records of
that slice. The gate lays them out as one table, a row per slice:

==================== ==========================================================
column               meaning
==================== ==========================================================
slice_column         the dataset column that defines the slice (``source``)
slice                its value (``wiki``)
eval_loss            the candidate's mean token loss on the slice
perplexity           ``exp(eval_loss)``
tokens               tokens of the slice that were scored
production_*         the same three for the production model (null if none)
regression_ratio     ``eval_loss / production_eval_loss`` (1.02: 2% worse)
perplexity_ratio     ``perplexity / production_perplexity``
==================== ==========================================================

Any other metric the slices hold (a classifier's ``accuracy``, a team's own from
``EvaluateModelOperator(metrics=...)``) adds three columns: ``<metric>``,
``production_<metric>`` and ``<metric>_ratio`` (candidate over production).

Two check kinds use it (checks are data, see docs/promotion.md):

- ``slices``: any expectation of :data:`SLICE_EXPECTATIONS` over the table,
  ``{"kind": "slices", "expectation": {"type": "expect_column_values_to_be_between",
  "kwargs": {"column": "eval_loss", "max_value": 3.0}}}``;
- ``slice_no_regression``: no slice worse than production by more than ``tolerance``,
  ``{"kind": "slice_no_regression", "tolerance": 0.05}``, which is the expectation
  ``regression_ratio <= 1 + tolerance`` (``perplexity_ratio`` with ``"metric": "perplexity"``).
  "Worse" follows the metric's direction: ``{"kind": "slice_no_regression", "metric":
  "accuracy", "tolerance": 0.05}`` is ``accuracy_ratio >= 1 - tolerance``; a team's own metric
  says its ``direction``, as in ``no_regression``.

Both take ``slice_column`` to look at the slices of one column only. Null cells (a slice
the production model has no figure for, a slice with no scored token) are not checked, as
GX does for every column-value expectation. Without a production model yet, checks on
production columns pass with a note, like ``no_regression``.

Validation here is GX-free (it runs at DAG parse); :func:`run_slice_checks` imports pandas
and GX when the gate runs and instantiates every expectation before checking any.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from trainops.gate.errors import GateConfigError
from trainops.gate.fields import NumberRule, fmt, is_number, show
from trainops.gate.metrics import BUILTIN, LOWER, check_direction
from trainops.gate.records import Check, FailingSlice, Outcome
from trainops.staging.gx_batch import ephemeral_context

__all__ = [
    "PRODUCTION_COLUMNS",
    "SLICE_EXPECTATIONS",
    "SLICE_KINDS",
    "TABLE_COLUMNS",
    "build_expectations",
    "default_name",
    "run_slice_checks",
    "slice_rows",
    "validate_slice_check",
]

SLICE_KINDS = ("slices", "slice_no_regression")

TABLE_COLUMNS = (
    "slice_column",
    "slice",
    "eval_loss",
    "perplexity",
    "tokens",
    "production_eval_loss",
    "production_perplexity",
    "production_tokens",
    "regression_ratio",
    "perplexity_ratio",
)
PRODUCTION_COLUMNS = (
    "production_eval_loss",
    "production_perplexity",
    "production_tokens",
    "regression_ratio",
    "perplexity_ratio",
)
_RATIO_COLUMN = {"eval_loss": "regression_ratio", "perplexity": "perplexity_ratio"}
_BASE_METRICS = ("eval_loss", "perplexity")  # always in the table (TABLE_COLUMNS)


def ratio_column(metric: str) -> str:
    """The table column of ``metric`` on the candidate over production."""
    return _RATIO_COLUMN.get(metric, f"{metric}_ratio")


def metric_columns(metric: str) -> tuple[str, str, str]:
    """The three table columns of a metric beyond the base ones."""
    return metric, f"production_{metric}", ratio_column(metric)


# Columns a ``slices`` expectation may name: the base table, and each built-in metric's three.
KNOWN_COLUMNS = TABLE_COLUMNS + tuple(c for m in BUILTIN if m not in _BASE_METRICS for c in metric_columns(m))

_BETWEEN = ("column", "min_value", "max_value", "strict_min", "strict_max")
# type -> (GX class name, allowed kwargs). Column expectations only: the table is small and
# whole, so aggregates (max, mean) are as meaningful as per-row ones.
SLICE_EXPECTATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "expect_column_values_to_be_between": ("ExpectColumnValuesToBeBetween", (*_BETWEEN, "mostly")),
    "expect_column_max_to_be_between": ("ExpectColumnMaxToBeBetween", _BETWEEN),
    "expect_column_min_to_be_between": ("ExpectColumnMinToBeBetween", _BETWEEN),
    "expect_column_mean_to_be_between": ("ExpectColumnMeanToBeBetween", _BETWEEN),
    "expect_column_median_to_be_between": ("ExpectColumnMedianToBeBetween", _BETWEEN),
    "expect_column_sum_to_be_between": ("ExpectColumnSumToBeBetween", _BETWEEN),
    "expect_column_values_to_not_be_null": ("ExpectColumnValuesToNotBeNull", ("column", "mostly")),
    "expect_column_values_to_be_in_set": ("ExpectColumnValuesToBeInSet", ("column", "value_set", "mostly")),
    "expect_column_pair_values_a_to_be_greater_than_b": (
        "ExpectColumnPairValuesAToBeGreaterThanB",
        ("column_A", "column_B", "or_equal", "mostly"),
    ),
    "expect_table_row_count_to_be_between": ("ExpectTableRowCountToBeBetween", ("min_value", "max_value")),
}
_NUMERIC_KWARGS = ("min_value", "max_value")
_COLUMN_KWARGS = ("column", "column_A", "column_B")
_FIELDS = {
    "slices": {"name", "kind", "expectation", "slice_column"},
    "slice_no_regression": {"name", "kind", "metric", "tolerance", "slice_column", "direction"},
}
_SHOWN_SLICES = 5


# ------------------------------------------------------------------------- validation


def validate_slice_check(where: str, check: Check, number: NumberRule) -> Check:
    """Normalise one ``slices`` or ``slice_no_regression`` check (no GX import).

    ``number(where, field, value)`` is the gate's numeric-field rule (templates allowed or not).
    """
    kind = check["kind"]
    unknown = sorted(set(check) - _FIELDS[kind])
    if unknown:
        raise GateConfigError(
            f"{where} has unknown field {unknown[0]!r} for kind {kind!r}; "
            f"allowed fields are {sorted(_FIELDS[kind])}"
        )
    slice_column = check.get("slice_column")
    if slice_column is not None and (not isinstance(slice_column, str) or not slice_column):
        raise GateConfigError(
            f"{where} has slice_column {slice_column!r}; give the dataset column that "
            "defines the slices (for example 'source') or omit it for all of them"
        )
    out: Check = {"kind": kind, "slice_column": slice_column}
    if kind == "slice_no_regression":
        metric = check.get("metric", "eval_loss")
        direction = check_direction(where, metric, check.get("direction"))
        tolerance = number(where, "tolerance", check.get("tolerance", 0.0))
        if isinstance(tolerance, float) and tolerance < 0:
            raise GateConfigError(
                f"{where} needs field 'tolerance' to be a number >= 0 (a fraction: "
                f"0.05 is 5%), got {tolerance!r}"
            )
        out.update(metric=metric, tolerance=tolerance)
        if metric not in BUILTIN:
            out["direction"] = direction
        return out
    out["expectation"] = _validate_expectation(where, check.get("expectation"), number)
    return out


def _validate_expectation(where: str, expectation: object, number: NumberRule) -> dict[str, Any]:
    example = (
        '{"type": "expect_column_values_to_be_between", "kwargs": {"column": "eval_loss", "max_value": 3.0}}'
    )
    if not isinstance(expectation, dict) or not isinstance(expectation.get("type"), str):
        raise GateConfigError(
            f"{where} needs field 'expectation' as a dict such as {example}, got {expectation!r}"
        )
    extra = sorted(set(expectation) - {"type", "kwargs", "meta"})
    if extra:
        raise GateConfigError(f"{where} expectation has unknown key {extra[0]!r}; use 'type' and 'kwargs'")
    etype = expectation["type"]
    if etype not in SLICE_EXPECTATIONS:
        raise GateConfigError(
            f"{where} has expectation type {etype!r}, which the per-slice table does "
            f"not support; use one of {sorted(SLICE_EXPECTATIONS)}"
        )
    kwargs = expectation.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise GateConfigError(f"{where} expectation {etype} has kwargs {kwargs!r}; kwargs must be a dict")
    allowed = SLICE_EXPECTATIONS[etype][1]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise GateConfigError(
            f"{where} expectation {etype} has unknown kwarg {unknown[0]!r}; "
            f"allowed kwargs are {list(allowed)}"
        )
    for key in _COLUMN_KWARGS:
        if key in allowed and kwargs.get(key) not in KNOWN_COLUMNS:
            raise GateConfigError(
                f"{where} expectation {etype} has {key} {kwargs.get(key)!r}, which is "
                f"not a column of the per-slice table; use one of {list(KNOWN_COLUMNS)}"
            )
    out = copy.deepcopy(kwargs)
    for key in _NUMERIC_KWARGS:
        if out.get(key) is not None:
            out[key] = number(where, key, out[key])
    if "min_value" in allowed and out.get("min_value") is None and out.get("max_value") is None:
        raise GateConfigError(f"{where} expectation {etype} needs 'min_value', 'max_value' or both")
    mostly = out.get("mostly")
    if mostly is not None and (not is_number(mostly) or not 0 <= mostly <= 1):
        raise GateConfigError(f"{where} expectation {etype} has mostly {mostly!r}; give a fraction in [0, 1]")
    return {"type": etype, "kwargs": out}


def default_name(check: Check) -> str:
    """The name of a validated slice check that has none."""
    where = f" of {check['slice_column']}" if check.get("slice_column") else ""
    if check["kind"] == "slice_no_regression":
        return f"no slice{where} regresses in {check['metric']} (tolerance {show(check['tolerance'])})"
    e = check["expectation"]
    column = ",".join(str(e["kwargs"][k]) for k in _COLUMN_KWARGS if k in e["kwargs"])
    return f"slices{where}: {e['type']}({column}) {expected_text(e)}".rstrip()


def expectation_of(check: Check) -> dict[str, Any]:
    """The GX expectation (as data) that a validated slice check stands for."""
    if check["kind"] == "slices":
        expectation: dict[str, Any] = check["expectation"]
        return expectation
    metric = check["metric"]
    if BUILTIN[metric].direction == LOWER if metric in BUILTIN else check.get("direction") == LOWER:
        bound = {"max_value": 1.0 + check["tolerance"]}
    else:
        bound = {"min_value": 1.0 - check["tolerance"]}
    return {"type": "expect_column_values_to_be_between", "kwargs": {"column": ratio_column(metric), **bound}}


def expected_text(expectation: Mapping[str, Any]) -> str:
    """The condition an expectation sets, as text (``<= 3 for 90% of slices``)."""
    kwargs = expectation["kwargs"]
    parts = []
    if kwargs.get("min_value") is not None:
        parts.append(f"{'>' if kwargs.get('strict_min') else '>='} {show(kwargs['min_value'])}")
    if kwargs.get("max_value") is not None:
        parts.append(f"{'<' if kwargs.get('strict_max') else '<='} {show(kwargs['max_value'])}")
    if "value_set" in kwargs:
        parts.append(f"in {kwargs['value_set']!r}")
    if expectation["type"] == "expect_column_pair_values_a_to_be_greater_than_b":
        parts.append(f"{kwargs['column_A']} {'>=' if kwargs.get('or_equal') else '>'} {kwargs['column_B']}")
    if expectation["type"] == "expect_column_values_to_not_be_null":
        parts.append("not null")
    if kwargs.get("mostly") is not None:
        parts.append(f"for {kwargs['mostly']:.0%} of slices")
    return " and ".join(parts)


# ------------------------------------------------------------------------- the table


def _figures(entry: object) -> dict[str, float | None]:
    """A slice's finite numeric figures (JSON has no NaN), the base ones always (None: none)."""
    entry = entry if isinstance(entry, dict) else {}
    out: dict[str, float | None] = dict.fromkeys((*_BASE_METRICS, "tokens"))
    for key, value in entry.items():
        if isinstance(key, str) and is_number(value) and math.isfinite(value):
            out[key] = float(value)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``; None (unchecked) when either is missing or ``b`` is not positive: a ratio
    says how much worse only of a positive figure (every built-in one; a team's may not be,
    and :func:`run_slice_checks` refuses a ratio check on such a slice rather than skip it)."""
    if a is None or b is None or b <= 0:
        return None
    return a / b


def slice_rows(candidate: Mapping[str, Any], production: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The per-slice metrics table as plain rows, in slice-column then slice order.

    ``candidate["slices"]`` is the evaluation's ``{column: {value: {eval_loss, perplexity,
    tokens, ...}}}``; ``production`` is the production model's metrics or None. Every row has
    the base columns (:data:`TABLE_COLUMNS`) and the three of each other metric any candidate
    slice holds.
    """
    ours = candidate.get("slices") or {}
    theirs = (production or {}).get("slices") or {}
    extra: dict[str, None] = {}
    for values in ours.values():
        for entry in (values or {}).values() if isinstance(values, dict) else ():
            for key in _figures(entry):
                if key not in (*_BASE_METRICS, "tokens"):
                    extra[key] = None
    rows = []
    for column in sorted(ours):
        base_slices = theirs[column] if isinstance(theirs.get(column), dict) else {}
        for value in sorted(ours[column]):
            mine, base = _figures(ours[column][value]), _figures(base_slices.get(value))
            row = {
                "slice_column": column,
                "slice": str(value),
                **{k: mine[k] for k in (*_BASE_METRICS, "tokens")},
                "production_eval_loss": base["eval_loss"],
                "production_perplexity": base["perplexity"],
                "production_tokens": base["tokens"],
                "regression_ratio": _ratio(mine["eval_loss"], base["eval_loss"]),
                "perplexity_ratio": _ratio(mine["perplexity"], base["perplexity"]),
            }
            for metric in extra:
                ours_value, theirs_value = mine.get(metric), base.get(metric)
                row.update(
                    zip(
                        metric_columns(metric),
                        (ours_value, theirs_value, _ratio(ours_value, theirs_value)),
                        strict=True,
                    )
                )
            rows.append(row)
    return rows


def table_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The table's columns: the base ones, then each other metric's three."""
    return list(TABLE_COLUMNS) + [c for c in (rows[0] if rows else {}) if c not in TABLE_COLUMNS]


def _is_production_column(column: str) -> bool:
    return column in PRODUCTION_COLUMNS or column.startswith("production_") or column.endswith("_ratio")


# ------------------------------------------------------------------------- GX


def build_expectations(checks: list[Check]) -> list[Any]:
    """GX expectation objects for validated slice checks; GateConfigError names a bad one.

    Called before any check runs, so a definition GX refuses stops the gate up front.
    """
    import great_expectations as gx

    out = []
    for check in checks:
        e = expectation_of(check)
        cls = getattr(gx.expectations, SLICE_EXPECTATIONS[e["type"]][0])
        try:
            out.append(cls(**e["kwargs"]))
        except Exception as exc:
            detail = " ".join(str(exc).split())
            raise GateConfigError(
                f"check {check['name']!r}: GX refuses expectation {e['type']} with "
                f"kwargs {e['kwargs']!r}: {detail}"
            ) from None
    return out


def run_slice_checks(
    checks: list[Check],
    candidate: Mapping[str, Any],
    production: Mapping[str, Any] | None,
    production_version: int | None = None,
) -> list[Outcome]:
    """Outcomes (``observed``, ``expected``, ``passed``, ``note``, ``slices``) of validated
    slice checks, in order; ``slices`` lists the failing slices."""
    if not checks:
        return []
    # pandas and GX (through staging's context builder) only when slice checks run.
    import pandas as pd

    expectations = build_expectations(checks)
    rows = slice_rows(candidate, production)
    columns_held = table_columns(rows)
    frame = pd.DataFrame(rows, columns=columns_held)
    numeric = [c for c in columns_held if c not in ("slice_column", "slice")]
    frame[numeric] = frame[numeric].astype("float64")
    definition = None
    label = "production" if production_version is None else f"production v{production_version}"
    out: list[Outcome] = []
    for check, expectation in zip(checks, expectations, strict=False):
        e = expectation_of(check)
        expected = expected_text(e)
        table = frame
        if check.get("slice_column"):
            table = frame[frame["slice_column"] == check["slice_column"]].reset_index(drop=True)
        columns = {e["kwargs"][k] for k in _COLUMN_KWARGS if k in e["kwargs"]}
        absent = sorted(columns - set(columns_held))
        if absent and rows:
            held = sorted(
                {
                    c
                    for c in columns_held
                    if c not in ("slice_column", "slice") and not _is_production_column(c)
                }
            )
            out.append(
                _outcome(
                    None, expected, False, f"the slices hold no {absent[0]} (they hold {', '.join(held)})"
                )
            )
            continue
        if production is None and any(_is_production_column(c) for c in columns):
            out.append(_outcome(None, expected, True, "no production model yet"))
            continue
        unsigned = _not_positive(check, table)
        if unsigned:
            out.append(_outcome(None, expected, False, unsigned))
            continue
        if table.empty:
            have = sorted({r["slice_column"] for r in rows})
            where = (
                f"no slice of column {check['slice_column']!r} (slice columns: {have})"
                if check.get("slice_column")
                else "no slices in the evaluation (the dataset declares no slice columns)"
            )
            out.append(_outcome(None, expected, False, where))
            continue
        if definition is None:
            definition = (
                ephemeral_context()
                .data_sources.add_pandas("trainops-slices")
                .add_dataframe_asset("slices")
                .add_batch_definition_whole_dataframe("slices")
            )
        batch = definition.get_batch(batch_parameters={"dataframe": table})
        result = batch.validate(expectation, result_format="COMPLETE")
        out.append(_read_result(e, result, table, label))
    return out


def _not_positive(check: Check, table: Any) -> str | None:
    """Why a ``slice_no_regression`` cannot judge its metric by ratio on some slice: production's
    figure there is zero or negative (None: it can)."""
    if check["kind"] != "slice_no_regression":
        return None
    column = f"production_{check['metric']}"
    if column not in table.columns:
        return None
    bad = table[table[column].notna() & (table[column] <= 0)]
    if bad.empty:
        return None
    row = bad.iloc[0]
    return (
        f"production's {check['metric']} on slice {row['slice_column']}={row['slice']} is "
        f"{fmt(float(row[column]))}: a ratio cannot say how much worse; check the slices with a "
        "'slices' expectation on the metric's own column instead"
    )


def _outcome(
    observed: float | None, expected: str, passed: bool, note: str, slices: list[FailingSlice] | None = None
) -> Outcome:
    return {
        "observed": observed,
        "expected": expected or None,
        "passed": passed,
        "note": note,
        "slices": slices or [],
    }


def _gx_error(result: Any) -> str | None:
    info = result.exception_info or {}
    if info.get("raised_exception"):
        return str(info.get("exception_message") or "GX raised an error")
    for value in info.values():
        if isinstance(value, dict) and value.get("raised_exception"):
            return str(value.get("exception_message") or "GX raised an error")
    return None


def _read_result(e: dict[str, Any], result: Any, table: Any, label: str) -> Outcome:
    expected = expected_text(e)
    error = _gx_error(result)
    if error:
        return _outcome(None, expected, False, f"GX error: {' '.join(error.split())[:300]}")
    details = result.result or {}
    column = e["kwargs"].get("column")
    failing: list[FailingSlice] = []
    for index in details.get("unexpected_index_list") or []:
        row = table.iloc[int(index)]
        value = row[column] if column else None
        failing.append(
            {
                "slice_column": row["slice_column"],
                "slice": row["slice"],
                "value": None if value is None or value != value else float(value),
            }
        )
    if "observed_value" in details:
        value = details["observed_value"]
        observed = float(value) if is_number(value) or hasattr(value, "__float__") else None
    elif e["type"] == "expect_column_values_to_be_between":
        values = table[column].dropna()
        if values.empty:
            observed = None
        else:
            observed = float(values.max() if e["kwargs"].get("max_value") is not None else values.min())
    else:
        observed = float(details.get("unexpected_count") or 0)
    passed = bool(result.success)
    checked = int(table[column].notna().sum()) if column else len(table)
    if failing:
        shown = ", ".join(
            f"{f['slice_column']}={f['slice']} ({fmt(f['value'])})" for f in failing[:_SHOWN_SLICES]
        )
        more = f" and {len(failing) - _SHOWN_SLICES} more" if len(failing) > _SHOWN_SLICES else ""
        note = f"{len(failing)}/{checked} slices fail: {shown}{more}"
    elif passed:
        note = f"{checked}/{len(table)} slices checked"
    else:
        note = "the table as a whole fails"
    if any(_is_production_column(c) for c in e["kwargs"].values() if isinstance(c, str)):
        note += f"; against {label}"
    return _outcome(observed, expected, passed, note, failing)
