import os

import numpy as np
import pytest

from tests.trainops.staging.helpers import record_batches
from trainops.staging.expectations import normalize_expectations
from trainops.staging.uniqueness import UniqueCheck, partitions_for
from trainops.staging.validation import validate_batches

UNIQUE_ID = {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}}


def _feed(check, columns, batch_rows):
    offset = 0
    for batch in record_batches(columns, batch_rows=batch_rows):
        check.update(batch, np.arange(offset, offset + batch.num_rows))
        offset += batch.num_rows


@pytest.mark.parametrize("partitions", [1, 16])  # one partition: every value collides
def test_duplicates_across_batches_are_counted_exactly_and_named(tmp_path, partitions):
    ids = [f"id-{i:05d}" for i in range(5000)]
    ids[4999] = ids[0]  # first and last batch
    ids[2500] = ids[10]
    ids[2501] = ids[10]  # three of one value
    ids[7] = None  # nulls are not duplicates
    ids[8] = None
    check = UniqueCheck(UNIQUE_ID, "id", str(tmp_path / "spill"), partitions)
    _feed(check, {"id": ids}, batch_rows=600)
    spilled = os.listdir(tmp_path / "spill")
    assert 1 <= len(spilled) <= partitions  # on disk, not in memory, until checked
    result = check.result()
    assert result == {
        "success": False,
        "unexpected_count": 5,
        "sample_ids": ["id-00000", "id-00010"],
        "sample_values": ["id-00000", "id-00010"],
        "sample_rows": [0, 10],
    }
    assert os.listdir(tmp_path / "spill") == []  # spill files are deleted after the check


def test_uniqueness_of_another_column_names_the_rows_ids(tmp_path):
    cols = {"id": ["a", "b", "c", "d"], "url": ["x", "y", "x", None]}
    expectation = {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "url"}}
    check = UniqueCheck(expectation, "id", str(tmp_path), 4)
    _feed(check, cols, batch_rows=2)
    assert check.result() == {
        "success": False,
        "unexpected_count": 2,
        "sample_ids": ["a"],
        "sample_values": ["x"],
        "sample_rows": [0],
    }


def test_integer_ids_and_a_clean_column_pass(tmp_path):
    check = UniqueCheck(UNIQUE_ID, "id", str(tmp_path), 8)
    _feed(check, {"id": list(range(3000))}, batch_rows=1000)
    assert check.result()["success"] is True


def test_partitions_grow_with_the_source_but_stay_bounded():
    assert partitions_for(0) == 16
    assert partitions_for(10 << 30) == 256
    assert partitions_for(2 << 30) == 32


def test_dataset_level_expectations_in_one_summary(tmp_path):
    suite = normalize_expectations(
        [
            UNIQUE_ID,
            {
                "type": "expect_column_proportion_of_non_null_values_to_be_between",
                "kwargs": {"column": "text", "min_value": 0.95},
            },
            {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 10, "max_value": 20}},
        ]
    )
    cols = {"id": [f"r{i}" for i in range(30)], "text": ["t"] * 28 + [None, None]}
    cols["id"][29] = "r0"
    summary = validate_batches(record_batches(cols, batch_rows=8), suite, spill_dir=str(tmp_path))
    failed = {f["expectation"]: f for f in summary["failed"]}
    assert failed["expect_column_values_to_be_unique"]["unexpected_count"] == 2
    assert failed["expect_column_proportion_of_non_null_values_to_be_between"][
        "observed_value"
    ] == pytest.approx(28 / 30, abs=1e-6)
    assert failed["expect_table_row_count_to_be_between"]["observed_value"] == 30
    assert os.listdir(tmp_path) == []
