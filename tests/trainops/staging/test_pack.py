import datetime as dt
import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.trainops.staging.helpers import record_batches
from trainops.staging.encoders import ByteTokenizer
from trainops.staging.errors import StagingError
from trainops.staging.pack import Packer, pack_batches
from trainops.staging.tokenize import decode, split_of

IDS = [f"r{i}" for i in range(40)]
TEXTS = [f"text number {i}" for i in range(40)]


def _stream(out_dir, split_info) -> bytes:
    data = b""
    for shard in split_info["shards"]:
        blob = Path(out_dir, shard["path"]).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == shard["sha256"]
        data += blob
    return data


def _index(out_dir) -> list[dict]:
    return [json.loads(line) for line in Path(out_dir, "eval/index.jsonl").read_text().splitlines()]


def test_records_are_split_by_their_id_and_packed_in_order(tmp_path):
    batches = record_batches({"id": IDS, "text": TEXTS, "source": ["news", "docs"] * 20}, batch_rows=15)
    out = pack_batches(batches, str(tmp_path), eval_percent=20, shard_tokens=64)
    wanted = {
        s: [t for i, t in zip(IDS, TEXTS, strict=True) if split_of(i, 20) == s] for s in ("train", "eval")
    }
    assert out["rows"] == {"total": 40, "train": len(wanted["train"]), "eval": len(wanted["eval"])}
    assert out["eval_records"] == len(wanted["eval"]) > 0
    for split in ("train", "eval"):
        info = out["splits"][split]
        assert info["tokens"] == sum(len(t) + 1 for t in wanted[split])
        assert [s["tokens"] for s in info["shards"][:-1]] == [64] * (len(info["shards"]) - 1)
        assert decode(_stream(tmp_path, info)) == wanted[split]
    assert out["files"] == [
        *(s["path"] for split in ("train", "eval") for s in out["splits"][split]["shards"]),
        "eval/index.jsonl",
    ]
    assert all(Path(tmp_path, f).is_file() for f in out["files"])


def test_the_eval_index_names_each_record_its_slices_and_its_span(tmp_path):
    created = [dt.datetime(2024, 1, 1, 0, i) for i in range(40)]
    columns = {"id": IDS, "text": TEXTS, "source": ["news"] * 39 + [None], "created": created}
    out = pack_batches(
        record_batches(columns, batch_rows=7),
        str(tmp_path),
        eval_percent=30,
        shard_tokens=50,
        slice_columns=["source", "created"],
    )
    index = _index(tmp_path)
    eval_rows = [n for n, i in enumerate(IDS) if split_of(i, 30) == "eval"]
    assert [r["id"] for r in index] == [IDS[n] for n in eval_rows]
    assert list(index[0]) == ["id", "source", "created", "start", "end"]
    assert [r["created"] for r in index] == [created[n].isoformat() for n in eval_rows]
    assert index[0]["start"] == 0 and index[-1]["end"] == out["splits"]["eval"]["tokens"]
    assert [r["start"] for r in index[1:]] == [r["end"] for r in index[:-1]]
    stream = _stream(tmp_path, out["splits"]["eval"])
    for record, n in zip(index, eval_rows, strict=True):
        assert decode(stream[2 * record["start"] : 2 * record["end"]]) == [TEXTS[n]]
    assert (index[-1]["id"], index[-1]["source"]) == ("r39", None)  # a null slice value stays null


def test_rows_it_cannot_pack_are_returned_by_their_number_and_left_out(tmp_path):
    packer = Packer(str(tmp_path), ByteTokenizer(), eval_percent=10, shard_tokens=8)
    batch = pa.RecordBatch.from_pydict(
        {"id": ["a", None, "c", "d"], "text": ["x", "y", None, "fourteen chars"], "source": ["s"] * 4}
    )
    assert packer.add(batch, np.arange(100, 104)) == {
        101: "null 'id'",
        102: "null 'text'",
        103: "15 tokens > shard_tokens 8",
    }
    assert packer.problem == (
        "row 101 has a null 'id', which staging cannot split or tokenize: add "
        "expect_column_values_to_not_be_null for 'id' to the expectations, quarantine such rows, "
        "or clean the data"
    )
    out = packer.close()
    assert out["rows"]["total"] == 1
    split = split_of("a", 10)
    assert decode(_stream(tmp_path, out["splits"][split])) == ["x"]


def test_a_batch_of_only_unpackable_rows_packs_nothing(tmp_path):
    packer = Packer(str(tmp_path), ByteTokenizer(), eval_percent=10, shard_tokens=8, slice_columns=[])
    batch = pa.RecordBatch.from_pydict({"id": [None, None], "text": ["a", "b"]})
    assert packer.add(batch, [0, 1]) == {0: "null 'id'", 1: "null 'id'"}
    assert packer.close()["rows"] == {"total": 0, "train": 0, "eval": 0}


def test_a_record_as_long_as_a_shard_fits_and_one_token_more_does_not(tmp_path):
    packer = Packer(str(tmp_path), ByteTokenizer(), eval_percent=10, shard_tokens=8, slice_columns=[])
    batch = pa.RecordBatch.from_pydict({"id": ["fits", "over"], "text": ["7 bytes", "8 bytes!"]})
    assert packer.add(batch, [0, 1]) == {1: "9 tokens > shard_tokens 8"}
    out = packer.close()
    assert out["splits"][split_of("fits", 10)]["shards"][0]["tokens"] == 8


def test_a_record_longer_than_a_shard_fails_naming_it_and_its_row(tmp_path):
    texts = list(TEXTS)
    texts[17] = "y" * 80
    with pytest.raises(
        StagingError,
        match=r"^record 'r17' \(row 17\) has 81 tokens, more than a shard holds \(shard_tokens=64\): "
        r"raise shard_tokens, cap the text with expect_column_value_lengths_to_be_between, or "
        r"quarantine such rows$",
    ):
        pack_batches(
            record_batches({"id": IDS, "text": texts, "source": ["s"] * 40}, batch_rows=15),
            str(tmp_path),
            eval_percent=10,
            shard_tokens=64,
        )


def test_other_id_and_text_columns(tmp_path):
    columns = {"doc": list(range(30)), "body": TEXTS[:30]}
    out = pack_batches(
        record_batches(columns, batch_rows=8),
        str(tmp_path),
        eval_percent=50,
        shard_tokens=1000,
        slice_columns=[],
        id_column="doc",
        text_column="body",
    )
    assert out["rows"]["total"] == 30
    index = _index(tmp_path)
    assert [r["id"] for r in index] == [str(i) for i in range(30) if split_of(str(i), 50) == "eval"]
    assert set(index[0]) == {"id", "start", "end"}


def test_no_batches_give_no_shards_and_an_empty_index(tmp_path):
    out = pack_batches([], str(tmp_path), eval_percent=10, shard_tokens=64)
    assert out == {
        "splits": {"train": {"tokens": 0, "shards": []}, "eval": {"tokens": 0, "shards": []}},
        "rows": {"total": 0, "train": 0, "eval": 0},
        "eval_records": 0,
        "files": ["eval/index.jsonl"],
    }
    assert Path(tmp_path, "eval/index.jsonl").read_text() == ""
