import json

import pytest

from tests.trainops.staging.helpers import assert_nothing_valid_looking
from trainer.contract import join
from trainer.storage import open_storage
from trainops.staging.demo_data import demo_rows
from trainops.staging.errors import DataValidationError, QuarantineExceeded
from trainops.staging.quarantine import over_limit
from trainops.staging.stage import stage_dataset

ROWS = 1000
SHARD = 4096


def _write_parquet(uri: str, cols: dict, files: int = 2) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(cols)
    storage = open_storage(uri)
    step = -(-table.num_rows // files)
    for k in range(files):
        sink = pa.BufferOutputStream()
        pq.write_table(table.slice(k * step, step), sink)
        storage.put(join(uri, f"part-{k}.parquet"), sink.getvalue().to_pybytes())
    return uri


def _bad_rows(tmp_path) -> tuple[str, dict]:
    """1000 rows with 6 bad ones: 3 empty texts, 1 null text, 1 null source, 1 text longer
    than a shard (SHARD tokens) but within the suite's 20000 characters."""
    cols = {k: v for k, v in demo_rows(ROWS, seed=8).items() if k != "created_at"}
    for i in (10, 520, 990):
        cols["text"][i] = ""
    cols["text"][300] = None
    cols["source"][700] = None
    cols["text"][650] = "x" * (SHARD + 10)
    return _write_parquet(f"file://{tmp_path}/raw", cols), cols


def test_bad_rows_are_dropped_counted_and_sampled(file_root, tmp_path):
    source, cols = _bad_rows(tmp_path)
    storage = open_storage(file_root)
    result = stage_dataset(
        storage,
        file_root,
        source,
        "q",
        shard_tokens=SHARD,
        quarantine={"max_fraction": 0.01, "sample_rows": 4},
    )
    assert result["rows"] == ROWS - 6 and result["quarantined_rows"] == 6
    manifest = storage.get_json(result["manifest_uri"])
    bad_ids = {cols["id"][i] for i in (10, 300, 520, 650, 700, 990)}
    assert manifest["quarantine"] == {
        "rows": 6,
        "rows_read": ROWS,
        "fraction": 0.006,
        "max_fraction": 0.01,
        "by_reason": {
            "expect_column_value_lengths_to_be_between(text)": 3,
            "expect_column_values_to_not_be_null(source)": 1,
            "expect_column_values_to_not_be_null(text)": 1,
            f"{SHARD + 11} tokens > shard_tokens {SHARD}": 1,
        },
        "sample": "quarantine/sample.jsonl",
        "sample_rows": 4,
    }
    sample = [
        json.loads(line)
        for line in storage.get(join(result["uri"], "quarantine/sample.jsonl")).decode().splitlines()
    ]
    assert [s["row"] for s in sample] == [10, 300, 520, 650]
    assert sample[3]["reasons"] == [f"{SHARD + 11} tokens > shard_tokens {SHARD}"]
    assert sample[3]["values"]["text"].endswith("...") and sample[0]["values"]["text"] == ""
    assert sample[0]["object"].endswith("/raw/part-0.parquet")
    # nothing of a quarantined row reached the shards or the eval index
    staged = sum(len(t.encode()) + 1 for i, t in enumerate(cols["text"]) if cols["id"][i] not in bad_ids)
    assert result["train_tokens"] + result["eval_tokens"] == staged
    index = storage.get(join(result["uri"], "eval/index.jsonl")).decode()
    assert not [i for i in bad_ids if f'"{i}"' in index]
    report = storage.get_json(result["validation_uri"])
    assert report["success"] is True
    lengths = next(
        r for r in report["results"] if r["expectation"] == "expect_column_value_lengths_to_be_between"
    )
    assert lengths["quarantined"] == 3 and lengths["success"] is True
    assert lengths["sample_ids"] == [cols["id"][i] for i in (10, 520, 990)]


def test_too_many_bad_rows_fail_naming_both_numbers(file_root, tmp_path):
    source, _ = _bad_rows(tmp_path)
    storage = open_storage(file_root)
    with pytest.raises(QuarantineExceeded) as err:
        stage_dataset(storage, file_root, source, "q", shard_tokens=SHARD, quarantine={"max_fraction": 0.005})
    message = str(err.value)
    assert (
        "has 6 bad rows of 1000 read (0.60%), more than quarantine max_fraction 0.005 "
        "(0.50%) allows, so nothing was staged"
    ) in message
    assert "expect_column_value_lengths_to_be_between(text): 3" in message
    assert "fix the data or raise max_fraction" in message
    added = assert_nothing_valid_looking(storage, file_root)
    assert [u.split("/q/")[1].split("/", 1)[1] for u in added] == [
        "quarantine/sample.jsonl",
        "validation.json",
    ]
    assert storage.get_json(err.value.report_uri)["quarantine"]["exceeded"] is True


def test_quarantine_cannot_hide_duplicate_ids(file_root, tmp_path):
    cols = {k: v for k, v in demo_rows(200, seed=2).items() if k != "created_at"}
    cols["id"][150] = cols["id"][3]  # in the other file
    source = _write_parquet(f"file://{tmp_path}/raw", cols)
    storage = open_storage(file_root)
    with pytest.raises(DataValidationError, match="expect_column_values_to_be_unique on 'id': 2 unexpected"):
        stage_dataset(storage, file_root, source, "q", quarantine={"max_fraction": 0.5})
    assert_nothing_valid_looking(storage, file_root)


def test_the_quarantine_limit_is_exclusive():
    assert not over_limit(1, 100, 0.01) and over_limit(2, 100, 0.01)
    assert not over_limit(0, 0, 0.0)
