import pyarrow as pa
import pytest

from tests.trainops.staging.helpers import record_batches
from trainops.staging.aggregates import NullProportionCheck, RowCountCheck


def _row_count(etype: str, **kwargs) -> dict:
    return {"type": f"expect_table_row_count_to_{etype}", "kwargs": kwargs}


def _non_null_share(column: str, **bounds) -> dict:
    return {
        "type": "expect_column_proportion_of_non_null_values_to_be_between",
        "kwargs": {"column": column, **bounds},
    }


def _feed(check, columns: dict, batch_rows: int):
    for batch in record_batches(columns, batch_rows=batch_rows):
        check.update(batch)
    return check.result()


@pytest.mark.parametrize(
    "expectation, success",
    [
        (_row_count("be_between", min_value=25), True),  # each batch has 10 rows, the dataset 30
        (_row_count("be_between", min_value=31), False),
        (_row_count("be_between", max_value=30), True),
        (_row_count("be_between", max_value=29), False),
        (_row_count("be_between", min_value=30, max_value=30), True),
        (_row_count("equal", value=30), True),
        (_row_count("equal", value=10), False),  # one batch's count is not the dataset's
    ],
)
def test_row_count_is_the_sum_over_every_batch(expectation, success):
    result = _feed(RowCountCheck(expectation), {"id": [f"r{i}" for i in range(30)]}, batch_rows=10)
    assert result == {"success": success, "observed_value": 30}


def test_an_empty_dataset_has_zero_rows():
    assert RowCountCheck(_row_count("be_between", max_value=5)).result() == {
        "success": True,
        "observed_value": 0,
    }
    assert RowCountCheck(_row_count("be_between", min_value=1)).result() == {
        "success": False,
        "observed_value": 0,
    }


def test_null_share_is_computed_over_the_whole_dataset():
    expectation = {
        "type": "expect_column_proportion_of_non_null_values_to_be_between",
        "kwargs": {"column": "text", "min_value": 0.9},
    }
    check = NullProportionCheck(expectation)
    for texts in (["a"] * 10, [None] * 3 + ["b"] * 7):  # 30% nulls in one batch, 15% overall
        check.update(pa.RecordBatch.from_pydict({"text": texts}))
    assert check.result() == {"success": False, "observed_value": 0.85, "unexpected_count": 3}
    expectation["kwargs"]["min_value"] = 0.8
    assert NullProportionCheck(expectation).result()["success"] is False  # no rows: no share


def test_null_share_counts_only_its_column_and_is_rounded():
    columns = {
        "id": [None] * 9,  # nulls in another column do not count
        "source": ["news", None, "docs"] * 3,
    }
    result = _feed(NullProportionCheck(_non_null_share("source", min_value=0.6)), columns, batch_rows=4)
    assert result == {"success": True, "observed_value": 0.666667, "unexpected_count": 3}


@pytest.mark.parametrize(
    "texts, bounds, result",
    [
        (["a"] * 6, {"max_value": 0.5}, {"success": False, "observed_value": 1.0, "unexpected_count": 0}),
        ([None] * 6, {"max_value": 0.5}, {"success": True, "observed_value": 0.0, "unexpected_count": 6}),
        ([None] * 6, {"min_value": 0.1}, {"success": False, "observed_value": 0.0, "unexpected_count": 6}),
        (
            ["a", None] * 3,
            {"min_value": 0.5, "max_value": 0.5},
            {"success": True, "observed_value": 0.5, "unexpected_count": 3},
        ),
    ],
)
def test_null_share_bounds_are_inclusive_and_either_may_be_left_out(texts, bounds, result):
    check = NullProportionCheck(_non_null_share("text", **bounds))
    assert _feed(check, {"text": texts}, batch_rows=4) == result
