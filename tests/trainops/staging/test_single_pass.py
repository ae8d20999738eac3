import json
import os
from pathlib import Path

import pytest

from tests.trainops.staging.helpers import snapshot
from trainer.storage import open_storage
from trainops.staging.demo_data import demo_rows
from trainops.staging.errors import StagingError
from trainops.staging.expectations import normalize_expectations
from trainops.staging.reader import list_source_objects
from trainops.staging.single_pass import run_pass

SHARD = 2048


class _Log:
    """A TaskLog that keeps the lines it was given."""

    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg, *args):
        self.lines.append(msg % args)

    def warning(self, msg, *args):
        self.lines.append(msg % args)


def _cols(rows: int = 200, seed: int = 3) -> dict:
    return {k: v for k, v in demo_rows(rows, seed=seed).items() if k != "created_at"}


def _write(raw: str, cols: dict, names=("a", "b")) -> None:
    """``cols`` as one Parquet object per name, rows split evenly in that order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(cols)
    step = table.num_rows // len(names)
    for k, name in enumerate(names):
        sink = pa.BufferOutputStream()
        pq.write_table(table.slice(k * step, step if k < len(names) - 1 else None), sink)
        uri = f"{raw}/{name}.parquet"
        open_storage(uri).put(uri, sink.getvalue().to_pybytes())


def _pass(raw: str, scratch: Path, **kwargs) -> dict:
    storage = open_storage(raw)
    scratch.mkdir(parents=True)  # as stage_dataset's temporary folder
    options = {
        "scratch": str(scratch),
        "out_dir": str(scratch / "out"),
        "eval_percent": 10,
        "shard_tokens": SHARD,
        "slice_columns": ["source"],
        "batch_rows": 64,
    }
    options.update(kwargs)
    return run_pass(storage, list_source_objects(storage, raw), normalize_expectations(None), **options)


def test_one_pass_validates_and_packs_every_object_and_writes_nothing_to_storage(tmp_path, raw_uri):
    cols = _cols()
    _write(raw_uri, cols)
    before = snapshot(open_storage(raw_uri), raw_uri)
    log = _Log()
    done = _pass(raw_uri, tmp_path / "scratch", log=log)
    assert done["summary"]["success"] is True and done["summary"]["rows"] == 200
    assert (done["quarantine"], done["problem"]) == (None, None)
    packed = done["packed"]
    assert packed["rows"]["total"] == 200
    assert packed["splits"]["train"]["tokens"] + packed["splits"]["eval"]["tokens"] == sum(
        len(t.encode()) + 1 for t in cols["text"]
    )
    assert all((tmp_path / "scratch" / "out" / f).is_file() for f in packed["files"])
    assert snapshot(open_storage(raw_uri), raw_uri) == before
    assert log.lines == [f"read {raw_uri}/a.parquet: 100 rows", f"read {raw_uri}/b.parquet: 100 rows"]


def test_empty_text_objects_are_skipped_and_said_so(tmp_path, raw_uri):
    """A zero-byte JSONL or CSV file is an empty file (a zero-byte Parquet one is refused
    before the pass, see test_bad_inputs.py)."""
    _write(raw_uri, _cols(), names=("a", "c"))
    open_storage(raw_uri).put(f"{raw_uri}/b.jsonl", b"")
    log = _Log()
    done = _pass(raw_uri, tmp_path / "scratch", log=log)
    assert done["packed"]["rows"]["total"] == 200
    assert log.lines[0] == f"skipping 1 empty objects (0 bytes, no rows), first {raw_uri}/b.jsonl"
    assert [line.split(": ")[0] for line in log.lines[1:]] == [
        f"read {raw_uri}/a.parquet",
        f"read {raw_uri}/c.parquet",
    ]


def test_a_local_object_with_a_bad_schema_fails_before_any_row_is_read(tmp_path, raw_uri):
    cols = _cols()
    _write(raw_uri, cols, names=("a",))
    del cols["source"]
    _write(raw_uri, cols, names=("b",))
    log = _Log()
    with pytest.raises(StagingError, match=r"b.parquet' lacks columns \['source'\]"):
        _pass(raw_uri, tmp_path / "scratch", log=log)
    assert log.lines == []
    assert not (tmp_path / "scratch" / "out").exists()  # no packing was started


def test_a_downloaded_object_is_checked_when_it_arrives_and_removed_after(tmp_path, s3_root, raw_uri):
    raw = s3_root.replace("/root", "/raw")
    cols = _cols()
    _write(raw, cols)
    _write(raw_uri, cols)
    from_s3, from_file = _pass(raw, tmp_path / "s3"), _pass(raw_uri, tmp_path / "file")
    assert from_s3["packed"] == from_file["packed"]  # the same shards, byte for byte
    assert from_s3["summary"] == from_file["summary"]
    assert not [n for n in os.listdir(tmp_path / "s3") if n.startswith("source")]

    del cols["source"]
    _write(raw, cols, names=("c",))
    log = _Log()
    with pytest.raises(StagingError, match=r"c.parquet' lacks columns \['source'\]"):
        _pass(raw, tmp_path / "s3-bad", log=log)
    assert log.lines == [f"read {raw}/a.parquet: 100 rows", f"read {raw}/b.parquet: 100 rows"]
    assert not [n for n in os.listdir(tmp_path / "s3-bad") if n.startswith("source")]


def _with_bad_rows() -> dict:
    cols = _cols()
    cols["text"][20] = "x" * SHARD  # longer than a shard, with its EOS
    cols["text"][130] = ""  # fails the default suite's length check; in the second object
    return cols


def test_quarantine_sets_rows_aside_numbered_across_objects(tmp_path, raw_uri):
    cols = _with_bad_rows()
    _write(raw_uri, cols)
    out = tmp_path / "scratch" / "out"
    done = _pass(raw_uri, tmp_path / "scratch", quarantine={"max_fraction": 0.05, "sample_rows": 10})
    assert done["quarantine"] == {
        "rows": 2,
        "rows_read": 200,
        "fraction": 0.01,
        "max_fraction": 0.05,
        "by_reason": {
            f"{SHARD + 1} tokens > shard_tokens {SHARD}": 1,
            "expect_column_value_lengths_to_be_between(text)": 1,
        },
        "sample": "quarantine/sample.jsonl",
        "sample_rows": 2,
    }
    assert done["summary"]["quarantine"] == done["quarantine"]
    assert done["summary"]["success"] is True and done["problem"] is None
    sample = [json.loads(line) for line in (out / "quarantine/sample.jsonl").read_text().splitlines()]
    assert [(s["row"], s["object"], s["values"]["id"]) for s in sample] == [
        (20, f"{raw_uri}/a.parquet", cols["id"][20]),
        (130, f"{raw_uri}/b.parquet", cols["id"][130]),
    ]
    packed = done["packed"]
    assert packed["rows"]["total"] == 198
    kept = sum(len(t.encode()) + 1 for i, t in enumerate(cols["text"]) if i not in (20, 130))
    assert packed["splits"]["train"]["tokens"] + packed["splits"]["eval"]["tokens"] == kept


def test_without_quarantine_a_row_it_cannot_pack_is_the_problem(tmp_path, raw_uri):
    cols = _with_bad_rows()
    cols["text"][130] = "not empty"
    _write(raw_uri, cols)
    done = _pass(raw_uri, tmp_path / "scratch")
    assert done["summary"]["success"] is True  # the suite has nothing against long texts
    assert done["problem"].startswith(
        f"record {cols['id'][20]!r} (row 20) has {SHARD + 1} tokens, more than a shard holds"
    )
    assert done["packed"]["rows"]["total"] == 199
    assert not (tmp_path / "scratch" / "out" / "quarantine").exists()


def test_a_failed_expectation_is_in_the_summary_not_raised(tmp_path, raw_uri):
    cols = _cols()
    cols["id"][150] = cols["id"][5]
    _write(raw_uri, cols)
    done = _pass(raw_uri, tmp_path / "scratch")
    failed = done["summary"]["failed"]
    assert [(f["expectation"], f["unexpected_count"]) for f in failed] == [
        ("expect_column_values_to_be_unique", 2)
    ]
