"""Expectation suites as plain data, checked without importing great_expectations.

A suite is a list of ``{"type": "expect_...", "kwargs": {...}}`` dicts, the same
shape GX serializes. Staging reads data in batches, so only two kinds of
expectation are meaningful:

* ``row`` expectations hold for a dataset iff they hold for every row; GX checks them
  batch by batch and their unexpected counts add up;
* ``dataset`` expectations (uniqueness across the whole dataset, row counts, the share of
  non-null values) need every batch at once; staging computes them itself with streaming
  aggregates (uniqueness with hash partitions spilled to local disk, so memory stays flat).

Aggregate expectations such as ``expect_column_mean_to_be_between`` are neither:
checking them per batch would give a different answer than over the dataset, so
they are refused rather than silently misapplied.
"""

from __future__ import annotations

import copy

DEFAULT_EXPECTATIONS: list[dict] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}},
    {
        "type": "expect_column_value_lengths_to_be_between",
        "kwargs": {"column": "text", "min_value": 1, "max_value": 20000},
    },
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "source"}},
    {
        "type": "expect_table_row_count_to_be_between",
        "kwargs": {"min_value": 1, "max_value": 100_000_000},
    },
]

# An sft source's default suite: ids as for text, a prompt and a response in every record.
DEFAULT_SFT_EXPECTATIONS: list[dict] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
    *(
        expectation
        for column in ("prompt", "response")
        for expectation in (
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": column}},
            {
                "type": "expect_column_value_lengths_to_be_between",
                "kwargs": {"column": column, "min_value": 1, "max_value": 20000},
            },
        )
    ),
    {
        "type": "expect_table_row_count_to_be_between",
        "kwargs": {"min_value": 1, "max_value": 100_000_000},
    },
]

# A classification source's default suite: ids as for text, a text and a label in every record
# (the label set is the data's; a user who knows it adds expect_column_values_to_be_in_set).
DEFAULT_CLASSIFICATION_EXPECTATIONS: list[dict] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}},
    {
        "type": "expect_column_value_lengths_to_be_between",
        "kwargs": {"column": "text", "min_value": 1, "max_value": 20000},
    },
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "label"}},
    {
        "type": "expect_column_value_lengths_to_be_between",
        "kwargs": {"column": "label", "min_value": 1, "max_value": 200},
    },
    {
        "type": "expect_table_row_count_to_be_between",
        "kwargs": {"min_value": 1, "max_value": 100_000_000},
    },
]
DEFAULT_SUITES = {
    "causal_lm": DEFAULT_EXPECTATIONS,
    "sft": DEFAULT_SFT_EXPECTATIONS,
    "classification": DEFAULT_CLASSIFICATION_EXPECTATIONS,
}

# type -> gx.expectations class name, for expectations GX checks batch by batch.
ROW_EXPECTATIONS: dict[str, str] = {
    "expect_column_to_exist": "ExpectColumnToExist",
    "expect_column_values_to_not_be_null": "ExpectColumnValuesToNotBeNull",
    "expect_column_values_to_be_null": "ExpectColumnValuesToBeNull",
    "expect_column_values_to_be_in_set": "ExpectColumnValuesToBeInSet",
    "expect_column_values_to_not_be_in_set": "ExpectColumnValuesToNotBeInSet",
    "expect_column_values_to_be_between": "ExpectColumnValuesToBeBetween",
    "expect_column_value_lengths_to_be_between": "ExpectColumnValueLengthsToBeBetween",
    "expect_column_value_lengths_to_equal": "ExpectColumnValueLengthsToEqual",
    "expect_column_values_to_match_regex": "ExpectColumnValuesToMatchRegex",
    "expect_column_values_to_not_match_regex": "ExpectColumnValuesToNotMatchRegex",
    "expect_column_values_to_match_regex_list": "ExpectColumnValuesToMatchRegexList",
    "expect_column_values_to_not_match_regex_list": "ExpectColumnValuesToNotMatchRegexList",
    "expect_column_values_to_be_of_type": "ExpectColumnValuesToBeOfType",
    "expect_column_values_to_be_in_type_list": "ExpectColumnValuesToBeInTypeList",
    "expect_column_values_to_match_strftime_format": "ExpectColumnValuesToMatchStrftimeFormat",
    "expect_column_values_to_be_dateutil_parseable": "ExpectColumnValuesToBeDateutilParseable",
    "expect_column_values_to_be_json_parseable": "ExpectColumnValuesToBeJsonParseable",
    "expect_column_values_to_match_json_schema": "ExpectColumnValuesToMatchJsonSchema",
    "expect_column_pair_values_to_be_equal": "ExpectColumnPairValuesToBeEqual",
    "expect_column_pair_values_a_to_be_greater_than_b": "ExpectColumnPairValuesAToBeGreaterThanB",
    "expect_column_pair_values_to_be_in_set": "ExpectColumnPairValuesToBeInSet",
    "expect_multicolumn_sum_to_equal": "ExpectMulticolumnSumToEqual",
    "expect_select_column_values_to_be_unique_within_record": (
        "ExpectSelectColumnValuesToBeUniqueWithinRecord"
    ),
    "expect_table_columns_to_match_set": "ExpectTableColumnsToMatchSet",
    "expect_table_columns_to_match_ordered_list": "ExpectTableColumnsToMatchOrderedList",
    "expect_table_column_count_to_equal": "ExpectTableColumnCountToEqual",
    "expect_table_column_count_to_be_between": "ExpectTableColumnCountToBeBetween",
}

# Checked by staging over the whole dataset (see aggregates.py), with these kwargs.
DATASET_EXPECTATIONS: dict[str, tuple[str, ...]] = {
    "expect_column_values_to_be_unique": ("column",),
    "expect_table_row_count_to_be_between": ("min_value", "max_value"),
    "expect_table_row_count_to_equal": ("value",),
    "expect_column_proportion_of_non_null_values_to_be_between": ("column", "min_value", "max_value"),
}

# GX bookkeeping keys that may appear in a serialized suite and carry no meaning here.
_IGNORED_KWARGS = {"batch_id", "result_format", "catch_exceptions", "include_config"}
_IGNORED_KEYS = {"meta", "id", "severity", "notes", "description", "rendered_content"}


def scope_of(expectation_type: str) -> str:
    """``"row"`` or ``"dataset"``; raises ValueError for a type staging cannot check."""
    if expectation_type in ROW_EXPECTATIONS:
        return "row"
    if expectation_type in DATASET_EXPECTATIONS:
        return "dataset"
    supported = sorted([*ROW_EXPECTATIONS, *DATASET_EXPECTATIONS])
    raise ValueError(
        f"unknown or unsupported expectation type {expectation_type!r}: staging checks data in "
        f"batches and supports only {', '.join(supported)}"
    )


def normalize_expectations(expectations: list[dict] | None, task: str = "causal_lm") -> list[dict]:
    """Check a suite's shape and types; return a clean copy (``None`` means the default suite of
    ``task``: text records', prompt/response records' for ``sft``, text/label records' for
    ``classification``).

    Cheap and GX-free, so an operator can call it at DAG-parse time.
    """
    if expectations is None:
        return copy.deepcopy(DEFAULT_SUITES.get(task, DEFAULT_EXPECTATIONS))
    if not isinstance(expectations, (list, tuple)):
        raise ValueError(
            f"expectations must be a list of {{'type': ..., 'kwargs': {{...}}}} dicts, "
            f"got {type(expectations).__name__}"
        )
    out = []
    for i, item in enumerate(expectations):
        if isinstance(item, dict) and "type" not in item and "expectation_type" in item:
            # GX 0.x serialized the type under this name; the meaning is the same.
            item = {("type" if k == "expectation_type" else k): v for k, v in item.items()}
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise ValueError(f"expectation #{i} must be a dict with a string 'type', got {item!r}")
        kwargs = item.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise ValueError(
                f"expectation #{i} ({item['type']}) has kwargs {kwargs!r}: kwargs must be a dict"
            )
        extra = set(item) - {"type", "kwargs"} - _IGNORED_KEYS
        if extra:
            raise ValueError(
                f"expectation #{i} ({item['type']}) has unknown keys {sorted(extra)}: "
                "use only 'type', 'kwargs' and 'meta'"
            )
        kind = scope_of(item["type"])
        kwargs = {k: v for k, v in kwargs.items() if k not in _IGNORED_KWARGS}
        if kind == "dataset":
            _check_dataset_kwargs(i, item["type"], kwargs)
        out.append({"type": item["type"], "kwargs": copy.deepcopy(kwargs)})
    return out


def _check_dataset_kwargs(i: int, etype: str, kwargs: dict) -> None:
    allowed = DATASET_EXPECTATIONS[etype]
    extra = set(kwargs) - set(allowed)
    if extra:
        raise ValueError(
            f"expectation #{i} ({etype}) has unsupported kwargs {sorted(extra)}: "
            f"staging accepts only {list(allowed)} for it"
        )
    if "column" in allowed and not isinstance(kwargs.get("column"), str):
        raise ValueError(f"expectation #{i} ({etype}) needs a string 'column', got {kwargs!r}")
    if etype == "expect_table_row_count_to_equal" and not isinstance(kwargs.get("value"), int):
        raise ValueError(f"expectation #{i} ({etype}) needs an integer 'value', got {kwargs!r}")
    if etype == "expect_table_row_count_to_be_between":
        lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
        if lo is None and hi is None:
            raise ValueError(f"expectation #{i} ({etype}) needs min_value or max_value, got none")
        for v in (lo, hi):
            if v is not None and not isinstance(v, int):
                raise ValueError(f"expectation #{i} ({etype}) bounds must be integers, got {v!r}")
    if etype == "expect_column_proportion_of_non_null_values_to_be_between":
        lo, hi = kwargs.get("min_value"), kwargs.get("max_value")
        if lo is None and hi is None:
            raise ValueError(f"expectation #{i} ({etype}) needs min_value or max_value, got none")
        for v in (lo, hi):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1):
                raise ValueError(
                    f"expectation #{i} ({etype}) bounds must be proportions from 0 to 1, got {v!r}"
                )


def columns_of(expectation: dict) -> list[str]:
    """The columns an expectation names, for reports (empty for table-level ones)."""
    kw = expectation.get("kwargs", {})
    if isinstance(kw.get("column"), str):
        return [kw["column"]]
    cols = [kw[k] for k in ("column_A", "column_B") if isinstance(kw.get(k), str)]
    if isinstance(kw.get("column_list"), list):
        cols += [c for c in kw["column_list"] if isinstance(c, str)]
    return cols
