import hashlib
from pathlib import Path

import pytest

from trainops.staging.tokenize import (
    TOKENIZER,
    ShardPacker,
    decode,
    encode,
    eval_mask,
    index_line,
    split_of,
    split_rule,
)


def test_split_rule_is_the_documented_hash():
    # Recomputed from the rule in the manifest, so the trainer or a notebook can re-derive it.
    for rid in ["a", "n000-0000001", "ünïcode-id", "42"]:
        bucket = int(hashlib.sha256(rid.encode()).hexdigest()[:8], 16) % 100
        assert split_of(rid, 10) == ("eval" if bucket < 10 else "train")
    assert split_rule(7) == {"kind": "id_hash", "hash": "sha256", "eval_percent": 7}
    ids = [f"rec-{i}" for i in range(3000)] + ["ünïcode-id"]
    assert eval_mask(ids, 10).tolist() == [split_of(i, 10) == "eval" for i in ids]


def test_split_is_stable_and_grows_monotonically_with_eval_percent():
    ids = [f"rec-{i}" for i in range(20000)]
    at10 = {i for i in ids if split_of(i, 10) == "eval"}
    at20 = {i for i in ids if split_of(i, 20) == "eval"}
    assert at10 == {i for i in ids if split_of(i, 10) == "eval"}
    assert at10 < at20  # raising the percentage only moves records from train to eval
    assert 0.09 < len(at10) / len(ids) < 0.11


def test_encode_is_utf8_bytes_then_eos_and_decodes_back():
    data = encode("hé!")
    tokens = [int.from_bytes(data[i : i + 2], "little") for i in range(0, len(data), 2)]
    assert tokens == [104, 0xC3, 0xA9, 33, TOKENIZER["eos_id"]]
    assert decode(encode("one") + encode("") + encode("twö")) == ["one", "", "twö"]


def test_packer_spans_are_contiguous_and_shards_are_full_but_the_last(tmp_path):
    packer = ShardPacker(str(tmp_path), "train", shard_tokens=8)
    spans = [packer.add(encode(t)) for t in ["abc", "defghij", "k", "lmnopqrstu"]]
    assert spans == [(0, 4), (4, 12), (12, 14), (14, 25)]
    out = packer.close()
    assert out["tokens"] == 25
    assert [s["tokens"] for s in out["shards"]] == [8, 8, 8, 1]
    assert [s["path"] for s in out["shards"]] == [f"train/{i:05d}.bin" for i in range(4)]
    stream = b""
    for shard in out["shards"]:
        data = Path(tmp_path, shard["path"]).read_bytes()
        assert len(data) == 2 * shard["tokens"]
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        stream += data
    assert decode(stream) == ["abc", "defghij", "k", "lmnopqrstu"]


def test_packer_with_no_records_has_no_shards(tmp_path):
    assert ShardPacker(str(tmp_path), "eval", 16).close() == {"tokens": 0, "shards": []}
    with pytest.raises(ValueError, match="shard_tokens must be at least 1, got 0"):
        ShardPacker(str(tmp_path), "eval", 0)


def test_index_line_orders_id_slices_span():
    assert index_line("x1", {"source": "news"}, 5, 9) == (
        '{"id": "x1", "source": "news", "start": 5, "end": 9}\n'
    )
