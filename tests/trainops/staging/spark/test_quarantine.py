"""The rows quarantine sets aside on Spark, with the worker engine's reasons."""

import pytest

pytestmark = pytest.mark.slow


def test_unpackable_rows_get_the_worker_engines_reasons_unless_already_flagged(spark):
    from trainops.staging.spark.frame import ROW
    from trainops.staging.spark.pack import SPLIT, TOKENS
    from trainops.staging.spark.quarantine import drop_rows, unpackable

    rows = [
        ("a", "t", 0, False, 2),
        (None, "t", 1, None, -1),
        ("c", None, 2, None, -1),
        ("d", "x" * 9, 3, False, 10),
        ("e", None, 4, None, -1),
    ]
    frame = spark.createDataFrame(rows, f"id string, text string, {ROW} long, {SPLIT} boolean, {TOKENS} long")
    found = unpackable(frame, {4: ["expect_column_values_to_not_be_null(text)"]}, "id", "text", 8)
    assert found == {1: ["null 'id'"], 2: ["null 'text'"], 3: ["10 tokens > shard_tokens 8"]}
    kept = drop_rows(spark, frame, {**found, 4: ["x"]})
    assert [r[ROW] for r in kept.collect()] == [0]
    assert drop_rows(spark, frame, {}) is frame
