"""The Spark engine against the in-worker one, in local mode: the same verdicts on bad data,
and for accepted data the same version, token counts and bytes."""

from __future__ import annotations

import os
import re

import pytest

from tests.trainops.staging.helpers import assert_nothing_valid_looking
from trainer.storage import open_storage
from trainops.staging.demo_data import demo_rows, write_demo_dataset
from trainops.staging.errors import DataValidationError, QuarantineExceeded, StagingError
from trainops.staging.stage import stage_dataset

pytestmark = pytest.mark.slow


def _spark_stage(spark, root: str, source: str, **kwargs):
    from trainops.staging.spark.stage import stage_dataset_spark

    return stage_dataset_spark(open_storage(root), root, source, "demo", spark=spark, **kwargs)


def _worker_stage(root: str, source: str, **kwargs):
    return stage_dataset(open_storage(root), root, source, "demo", **kwargs)


def _files(uri: str) -> dict[str, bytes]:
    """Every file under a version prefix, by relative path (the manifest without the two
    fields that may differ: when it was made and by which engine)."""
    import json

    top = uri[len("file://") :]
    out = {}
    for folder, _, names in os.walk(top):
        for n in names:
            path = os.path.join(folder, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, top)] = f.read()
    manifest = json.loads(out.pop("manifest.json"))
    out["manifest.json(rest)"] = json.dumps(
        {k: v for k, v in manifest.items() if k not in ("created_at", "engine")}, sort_keys=True
    ).encode()
    return out


def _parquet(uri: str, cols: dict, **options) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(cols), sink, **options)
    open_storage(uri).put(uri, sink.getvalue().to_pybytes())


def test_demo_data_stages_to_the_same_version_and_bytes_on_either_engine(spark, tmp_path):
    raw = f"file://{tmp_path}/raw"
    write_demo_dataset(raw, rows=1500, files=3)
    options = {"shard_tokens": 8192, "slice_columns": ["source", "created_at"]}
    worker = _worker_stage(f"file://{tmp_path}/w", raw, **options)
    on_spark = _spark_stage(spark, f"file://{tmp_path}/s", raw, **options)

    assert on_spark["version"] == worker["version"]
    for key in ("rows", "train_tokens", "eval_tokens", "quarantined_rows"):
        assert on_spark[key] == worker[key], key
    assert on_spark["rows"] == 1500 and on_spark["eval_tokens"] > 0
    spark_files, worker_files = _files(on_spark["uri"]), _files(worker["uri"])
    assert sorted(spark_files) == sorted(worker_files)
    assert len([f for f in spark_files if f.endswith(".bin")]) > 4  # several shards per split
    for name, data in worker_files.items():
        assert spark_files[name] == data, f"{name} differs"
    manifest = open_storage(on_spark["manifest_uri"]).get_json(on_spark["manifest_uri"])
    assert manifest["engine"] == "spark"
    # A version staged by one engine is reused by the other, without reading the data.
    again = _spark_stage(spark, f"file://{tmp_path}/w", raw, **options)
    assert again["reused"] and again["version"] == worker["version"]


def test_the_token_stream_does_not_depend_on_how_spark_splits_the_source(spark, tmp_path):
    raw = f"file://{tmp_path}/raw/a.parquet"
    _parquet(raw, demo_rows(1200, seed=3), row_group_size=100)
    options = {"shard_tokens": 4096}
    from trainops.staging.reader import list_source_objects
    from trainops.staging.spark.frame import read_source

    objects = list_source_objects(open_storage(raw), raw)
    results, parts = [], []
    # the whole file as one split, then a split every few row groups
    for max_bytes, open_cost in (("128m", "128m"), ("4k", "0")):
        spark.conf.set("spark.sql.files.maxPartitionBytes", max_bytes)
        spark.conf.set("spark.sql.files.openCostInBytes", open_cost)
        try:
            frame, *_ = read_source(spark, objects, string_columns=["id", "text", "source"])
            parts.append(frame.rdd.getNumPartitions())
            results.append(_spark_stage(spark, f"file://{tmp_path}/{len(parts)}", raw, **options))
        finally:
            spark.conf.unset("spark.sql.files.maxPartitionBytes")
            spark.conf.unset("spark.sql.files.openCostInBytes")
    assert parts[0] == 1 and parts[1] >= 4, parts
    one, many = (_files(r["uri"]) for r in results)
    assert one == many
    assert one == _files(_worker_stage(f"file://{tmp_path}/w", raw, **options)["uri"])


def _message(err) -> str:
    """The error without the report's location (the roots differ)."""
    return re.sub(r"\. Full report: .*$", "", str(err.value))


def _both_fail(spark, tmp_path, source: str, error=DataValidationError, **kwargs) -> str:
    with pytest.raises(error) as on_worker:
        _worker_stage(f"file://{tmp_path}/w", source, **kwargs)
    root = f"file://{tmp_path}/s"
    with pytest.raises(error) as on_spark:
        _spark_stage(spark, root, source, **kwargs)
    assert _message(on_spark) == _message(on_worker)
    assert_nothing_valid_looking(open_storage(root), root)
    if error is DataValidationError:
        assert on_spark.value.summary["failed"] == on_worker.value.summary["failed"]
    return _message(on_spark)


def test_corrupt_demo_data_fails_the_same_way(spark, tmp_path):
    raw = f"file://{tmp_path}/raw"
    write_demo_dataset(raw, rows=400, files=2, corrupt=True)
    message = _both_fail(spark, tmp_path, raw)
    assert "expect_column_values_to_not_be_null on 'id': 2 unexpected (rows 3, 133)" in message
    assert "expect_column_values_to_be_unique on 'id': 4 unexpected" in message
    assert "expect_column_value_lengths_to_be_between on 'text': 3 unexpected" in message


def test_nulls_over_a_threshold_and_duplicates_across_files_fail_the_same_way(spark, tmp_path):
    cols = {k: v for k, v in demo_rows(300, seed=1).items() if k != "created_at"}
    for i in range(0, 300, 8):
        cols["source"][i] = None
    second = {k: v[150:] for k, v in cols.items()}
    second["id"][149] = cols["id"][0]
    _parquet(f"file://{tmp_path}/raw/a.parquet", {k: v[:150] for k, v in cols.items()})
    _parquet(f"file://{tmp_path}/raw/b.parquet", second)
    suite = [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "source", "mostly": 0.9}},
        {
            "type": "expect_column_proportion_of_non_null_values_to_be_between",
            "kwargs": {"column": "source", "min_value": 0.95},
        },
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1000}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "text"}},
    ]
    message = _both_fail(spark, tmp_path, f"file://{tmp_path}/raw", expectations=suite)
    assert "failed 4 of 5 expectations over 300 rows" in message
    assert f"expect_column_values_to_be_unique on 'id': 2 unexpected (ids {cols['id'][0]!r})" in message
    assert "expect_table_row_count_to_be_between: observed 300" in message


def test_a_record_longer_than_a_shard_is_refused_the_same_way(spark, tmp_path):
    cols = {k: v for k, v in demo_rows(100, seed=2).items() if k != "created_at"}
    cols["text"][42] = "y" * 3000
    _parquet(f"file://{tmp_path}/raw/a.parquet", cols)
    message = _both_fail(spark, tmp_path, f"file://{tmp_path}/raw", error=StagingError, shard_tokens=2048)
    assert f"record '{cols['id'][42]}' (row 42) has 3001 tokens" in message


def test_jsonl_with_integer_ids_stages_to_the_same_bytes(spark, tmp_path):
    """Spark infers JSON types itself (and orders the columns by name): the ids are still the
    same strings, so the split and the bytes are the worker engine's."""
    import json

    cols = demo_rows(400, seed=5)
    lines = [
        json.dumps({"id": 1000 + i, "text": cols["text"][i], "source": cols["source"][i]}) for i in range(400)
    ]
    for part in range(2):
        uri = f"file://{tmp_path}/raw/part-{part}.jsonl"
        open_storage(uri).put(uri, ("\n".join(lines[part * 200 : (part + 1) * 200]) + "\n").encode())
    source = f"file://{tmp_path}/raw"
    worker = _worker_stage(f"file://{tmp_path}/w", source, shard_tokens=4096)
    on_spark = _spark_stage(spark, f"file://{tmp_path}/s", source, shard_tokens=4096)
    assert on_spark["version"] == worker["version"]
    assert _files(on_spark["uri"]) == _files(worker["uri"])
    index = _files(on_spark["uri"])["eval/index.jsonl"].decode().splitlines()
    assert index and all(json.loads(line)["id"].isdigit() for line in index)


def test_a_source_mixing_formats_is_refused_naming_them(spark, tmp_path):
    _parquet(
        f"file://{tmp_path}/raw/a.parquet", {k: v for k, v in demo_rows(50).items() if k != "created_at"}
    )
    uri = f"file://{tmp_path}/raw/b.jsonl"
    open_storage(uri).put(uri, b'{"id": "x", "text": "t", "source": "s"}\n')
    root = f"file://{tmp_path}/s"
    with pytest.raises(StagingError, match=r"mixes \['jsonl', 'parquet'\]: stage each format separately"):
        _spark_stage(spark, root, f"file://{tmp_path}/raw")
    assert_nothing_valid_looking(open_storage(root), root)


def test_csv_with_an_empty_text_fails_the_same_way(spark, tmp_path):
    """CSV has no types: both engines read every column as text, an empty field as ''."""
    cols = demo_rows(60, seed=6)
    rows = [f"{cols['id'][i]},{cols['text'][i].replace(',', ' ')},{cols['source'][i]}" for i in range(60)]
    rows[7] = f"{cols['id'][7]},,{cols['source'][7]}"
    uri = f"file://{tmp_path}/raw/a.csv"
    open_storage(uri).put(uri, ("id,text,source\n" + "\n".join(rows) + "\n").encode())
    message = _both_fail(spark, tmp_path, f"file://{tmp_path}/raw")
    assert (
        f"expect_column_value_lengths_to_be_between on 'text': 1 unexpected (ids {cols['id'][7]!r})"
        in message
    )


def _bad_rows_source(tmp_path, n_bad: int) -> str:
    cols = demo_rows(300, seed=7)
    for i in range(n_bad):
        cols["text"][10 + 13 * i] = ""  # fails the length expectation
    cols["source"][5] = None  # fails not-null on source
    cols["text"][200] = "z" * 5000  # longer than a shard
    _parquet(f"file://{tmp_path}/raw/a.parquet", {k: v[:150] for k, v in cols.items()})
    _parquet(f"file://{tmp_path}/raw/b.parquet", {k: v[150:] for k, v in cols.items()})
    return f"file://{tmp_path}/raw"


def test_quarantine_drops_the_same_rows_and_writes_the_same_sample(spark, tmp_path):
    source = _bad_rows_source(tmp_path, 4)
    options = {"shard_tokens": 4096, "quarantine": {"max_fraction": 0.05, "sample_rows": 3}}
    worker = _worker_stage(f"file://{tmp_path}/w", source, **options)
    on_spark = _spark_stage(spark, f"file://{tmp_path}/s", source, **options)
    assert (
        (on_spark["rows"], on_spark["quarantined_rows"])
        == (worker["rows"], worker["quarantined_rows"])
        == (294, 6)
    )
    files = _files(on_spark["uri"])
    assert files == _files(worker["uri"])
    assert len(files["quarantine/sample.jsonl"].splitlines()) == 3


def test_too_many_quarantined_rows_fail_the_same_way(spark, tmp_path):
    source = _bad_rows_source(tmp_path, 12)
    message = _both_fail(
        spark,
        tmp_path,
        source,
        error=QuarantineExceeded,
        shard_tokens=4096,
        quarantine={"max_fraction": 0.02},
    )
    assert "has 14 bad rows of 300 read" in message
