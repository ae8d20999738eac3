"""The suite on a Spark DataFrame: the row number column is invisible to the suite, and a
dataset expectation on a missing column fails naming it."""

import pytest

pytestmark = pytest.mark.slow


def _frame(spark, ids, texts):
    from trainops.staging.spark.frame import ROW

    return spark.createDataFrame(
        [(i, t, n) for n, (i, t) in enumerate(zip(ids, texts, strict=True))],
        f"id string, text string, {ROW} long",
    )


def test_table_shape_expectations_see_only_the_data_columns(spark):
    from trainops.staging.spark.validate import validate_frame

    frame = _frame(spark, ["a", "b", "c"], ["x", "yy", None])
    suite = [
        {"type": "expect_table_columns_to_match_set", "kwargs": {"column_set": ["id", "text"]}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}},
        {
            "type": "expect_column_proportion_of_non_null_values_to_be_between",
            "kwargs": {"column": "lang", "min_value": 0.5},
        },
    ]
    summary = validate_frame(frame, suite, rows=3)
    assert [r["success"] for r in summary["results"]] == [True, False, False]
    null_text = summary["results"][1]
    assert (null_text["unexpected_count"], null_text["sample_ids"], null_text["sample_rows"]) == (
        1,
        ["c"],
        [2],
    )
    assert summary["results"][2]["error"] == "column 'lang' does not exist (columns: ['id', 'text'])"


def test_uniqueness_counts_every_occurrence_and_names_the_first_row(spark):
    from trainops.staging.spark.validate import validate_frame

    frame = _frame(spark, ["a", "b", "a", None, None, "b", "c"], ["t"] * 7)
    summary = validate_frame(
        frame, [{"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}}], rows=7
    )
    (result,) = summary["failed"]
    assert (result["unexpected_count"], result["sample_ids"], result["sample_rows"]) == (
        4,
        ["a", "b"],
        [0, 1],
    )
