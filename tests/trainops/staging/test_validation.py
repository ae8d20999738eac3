import json

import pytest

from tests.trainops.staging.helpers import record_batches
from trainops.staging.expectations import normalize_expectations
from trainops.staging.validation import describe_failures, failure_lines, validate_batches


def _good(n=30):
    return {
        "id": [f"r{i}" for i in range(n)],
        "text": [f"text {i}" for i in range(n)],
        "source": ["news", "forum", "docs"] * (n // 3),
    }


def test_good_data_passes_every_default_expectation():
    summary = validate_batches(record_batches(_good(), batch_rows=7), normalize_expectations(None))
    results = summary.pop("results")
    assert summary == {
        "success": True,
        "evaluated_expectations": 6,
        "successful_expectations": 6,
        "failed": [],
        "rows": 30,
    }
    assert [(r["expectation"], r["success"]) for r in results] == [
        (e["type"], True) for e in normalize_expectations(None)
    ]


def test_failures_are_listed_with_counts_and_ids_across_batches():
    cols = _good()
    cols["id"][4] = None
    cols["id"][25] = "r2"  # duplicates r2, which sits in another batch
    cols["id"][26] = "r3"
    cols["text"][8] = ""
    cols["text"][21] = ""
    cols["source"][9] = None
    summary = validate_batches(record_batches(cols, batch_rows=10), normalize_expectations(None))
    json.dumps(summary)  # goes into validation.json as is
    assert summary["success"] is False
    assert summary["rows"] == 30
    assert summary["successful_expectations"] == 2
    failed = {(f["expectation"], f["column"]): f for f in summary["failed"]}
    assert list(failed) == [  # suite order
        ("expect_column_values_to_not_be_null", "id"),
        ("expect_column_values_to_be_unique", "id"),
        ("expect_column_value_lengths_to_be_between", "text"),
        ("expect_column_values_to_not_be_null", "source"),
    ]
    null_ids = failed[("expect_column_values_to_not_be_null", "id")]
    assert (null_ids["unexpected_count"], null_ids["sample_rows"], null_ids["sample_ids"]) == (1, [4], [])
    dupes = failed[("expect_column_values_to_be_unique", "id")]
    assert dupes["unexpected_count"] == 4
    assert dupes["sample_ids"] == ["r2", "r3"]
    empty = failed[("expect_column_value_lengths_to_be_between", "text")]
    assert (empty["unexpected_count"], empty["sample_ids"], empty["sample_rows"]) == (
        2,
        ["r8", "r21"],
        [8, 21],
    )
    assert failed[("expect_column_values_to_not_be_null", "source")]["sample_ids"] == ["r9"]

    message = describe_failures("file:///raw", summary)
    assert "failed 4 of 6 expectations over 30 rows, so nothing was staged" in message
    assert "expect_column_values_to_be_unique on 'id': 4 unexpected (ids 'r2', 'r3')" in message
    assert "expect_column_values_to_not_be_null on 'id': 1 unexpected (rows 4)" in message
    # one line each for the stage task's log and the demo's summary: column, expectation,
    # count and one sample (the value, else the row's id, else its number)
    assert failure_lines(summary) == [
        "staging rejected the data: id: expect_column_values_to_not_be_null failed for 1 row (e.g. row 4)",
        "staging rejected the data: id: expect_column_values_to_be_unique failed for 4 rows (e.g. 'r2')",
        "staging rejected the data: text: expect_column_value_lengths_to_be_between failed for 2 rows (e.g. '')",
        "staging rejected the data: source: expect_column_values_to_not_be_null failed for 1 row (e.g. id 'r9')",
    ]


def test_a_failure_without_rows_says_what_was_observed_or_what_went_wrong():
    summary = {
        "failed": [
            {"expectation": "expect_table_row_count_to_be_between", "column": None, "observed_value": 3},
            {
                "expectation": "expect_column_values_to_be_unique",
                "column": "lang",
                "error": "column 'lang' does not exist",
            },
        ]
    }
    assert failure_lines(summary) == [
        "staging rejected the data: expect_table_row_count_to_be_between failed (observed 3)",
        "staging rejected the data: lang: expect_column_values_to_be_unique failed: column 'lang' does not exist",
    ]
    assert failure_lines({"failed": []}) == []


def test_row_count_is_checked_over_the_whole_dataset():
    suite = [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 25}}]
    ok = validate_batches(record_batches(_good(), batch_rows=10), normalize_expectations(suite))
    assert ok["success"]  # every batch has 10 rows, the dataset 30
    suite[0]["kwargs"] = {"max_value": 20}
    bad = validate_batches(record_batches(_good(), batch_rows=10), normalize_expectations(suite))
    assert bad["failed"][0]["observed_value"] == 30


def test_mostly_applies_to_the_whole_dataset_not_each_batch():
    cols = _good()
    for i in (0, 1, 2):  # 3 of the first batch of 10: 30% there, 10% overall
        cols["text"][i] = None
    suite = normalize_expectations(
        [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text", "mostly": 0.85}}]
    )
    summary = validate_batches(record_batches(cols, batch_rows=10), suite)
    assert summary["success"], summary


def test_a_missing_column_fails_with_the_reason():
    suite = normalize_expectations(
        [
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "lang"}},
            {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "url"}},
        ]
    )
    summary = validate_batches(record_batches(_good(), batch_rows=30), suite)
    errors = [f.get("error", "") for f in summary["failed"]]
    assert 'The column "lang" in BatchData does not exist' in errors[0]
    assert "column 'url' does not exist" in errors[1]


def test_bad_kwargs_fail_before_any_batch_is_read():
    def batches():
        raise AssertionError("read data before checking the suite")
        yield

    suite = normalize_expectations(
        [
            {
                "type": "expect_column_value_lengths_to_be_between",
                "kwargs": {"column": "text", "min_value": "one"},
            }
        ]
    )
    with pytest.raises(ValueError, match="expect_column_value_lengths_to_be_between has invalid kwargs"):
        validate_batches(batches(), suite)
