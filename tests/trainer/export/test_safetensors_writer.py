"""The streaming safetensors writer: the bytes ``save_file`` writes, one tensor at a time, in header order."""

import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer.export.safetensors_writer import (
    Entry,
    ShardedWriter,
    StreamWriter,
    index_document,
    ordered,
    shard_names,
    split_shards,
)


def tensors(dtype):
    torch.manual_seed(0)
    return {
        "b.weight": torch.randn(3, 5).to(dtype),
        "a": torch.randn(7).to(dtype),
        "z.x": torch.randn(2, 2, 3).to(dtype),
        "empty": torch.zeros(0, 4, dtype=dtype),
    }


def entries_of(values):
    return [Entry(name, t.dtype, tuple(t.shape)) for name, t in values.items()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_the_file_is_byte_for_byte_what_save_file_writes(tmp_path, dtype):
    values = tensors(dtype)
    save_file(values, tmp_path / "reference.safetensors", metadata={"format": "pt"})
    with StreamWriter(str(tmp_path / "streamed.safetensors"), entries_of(values), {"format": "pt"}) as writer:
        for entry in writer.entries:
            writer.write(entry.name, values[entry.name])
    streamed = (tmp_path / "streamed.safetensors").read_bytes()
    assert streamed == (tmp_path / "reference.safetensors").read_bytes()
    loaded = load_file(tmp_path / "streamed.safetensors")
    assert loaded.keys() == values.keys() and all(torch.equal(loaded[k], v) for k, v in values.items())


def test_mixed_dtypes_are_ordered_largest_element_first_and_load_back(tmp_path):
    values = {"mask": torch.tensor([True, False, True]), "half": torch.ones(3, dtype=torch.bfloat16)}
    values["full"] = torch.arange(5, dtype=torch.float32)
    entries = entries_of(values)
    assert [e.name for e in ordered(entries)] == ["full", "half", "mask"]
    with StreamWriter(str(tmp_path / "mixed.safetensors"), entries) as writer:
        for entry in writer.entries:
            writer.write(entry.name, values[entry.name])
    loaded = load_file(tmp_path / "mixed.safetensors")
    assert all(torch.equal(loaded[k], v) for k, v in values.items())


def test_a_tensor_out_of_order_or_missing_is_refused_by_name(tmp_path):
    values = tensors(torch.float32)
    path = str(tmp_path / "bad.safetensors")
    out_of_order = r"tensor 'z\.x' .* arrived where the header declares 'a'"
    with pytest.raises(ValueError, match=out_of_order), StreamWriter(path, entries_of(values)) as writer:
        writer.write("z.x", values["z.x"])
    wrong_dtype = re.escape(
        "tensor 'a' (torch.bfloat16, (7,)) arrived where the header declares 'a' (torch.float32"
    )
    with pytest.raises(ValueError, match=wrong_dtype), StreamWriter(path, entries_of(values)) as writer:
        writer.write("a", values["a"].to(torch.bfloat16))
    writer = StreamWriter(path, entries_of(values))
    writer.write("a", values["a"])
    with pytest.raises(
        ValueError, match=re.escape("3 declared tensors were never written, the first 'b.weight'")
    ):
        writer.close()
    with pytest.raises(
        ValueError, match=re.escape("dtype torch.complex64, which this writer does not store")
    ):
        StreamWriter(path, [Entry("c", torch.complex64, (2,))])


def test_shards_are_runs_in_file_order_under_the_limit_and_a_large_tensor_is_alone():
    entries = [Entry(f"t{i}", torch.float32, (n,)) for i, n in enumerate([10, 10, 30, 5, 5])]  # 4 B each
    shards = split_shards(entries, max_bytes=80)
    assert [[e.name for e in shard] for shard in shards] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert [e for shard in shards for e in shard] == ordered(entries)
    assert split_shards(entries, max_bytes=240) == [ordered(entries)]  # the whole model fits: one file
    assert shard_names(1) == ["model.safetensors"]
    assert shard_names(3) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = index_document(shards, shard_names(3))
    assert index["metadata"] == {"total_size": 240}
    assert index["weight_map"]["t2"] == "model-00002-of-00003.safetensors"
    with pytest.raises(ValueError, match="shard size limit must be a positive number of bytes, got 0"):
        split_shards(entries, 0)


def test_the_sharded_writer_hands_over_each_file_when_done_and_they_hold_every_tensor(tmp_path):
    values = {**tensors(torch.float32), "big": torch.randn(40)}
    done = []

    def handed(path, name):
        done.append(name)
        assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # one file on disk at a time
        (tmp_path / name).rename(tmp_path.parent / name)

    with ShardedWriter(str(tmp_path), entries_of(values), 64, metadata={"format": "pt"}, done=handed) as w:
        for entry in ordered(entries_of(values)):
            w.write(entry.name, values[entry.name])
    assert done == w.names and len(done) == 4 and w.index is not None  # a | b.weight | big | empty, z.x
    loaded = {}
    for name in done:
        part = load_file(tmp_path.parent / name)
        assert set(part) == {k for k, v in w.index["weight_map"].items() if v == name}
        loaded.update(part)
    assert loaded.keys() == values.keys() and all(torch.equal(loaded[k], v) for k, v in values.items())


def test_a_sharded_writer_left_short_says_so(tmp_path):
    entries = [Entry("a", torch.float32, (1,)), Entry("b", torch.float32, (1,))]
    short = pytest.raises(ValueError, match=r"1 declared tensors were never written, the first 'b'")
    with short, ShardedWriter(str(tmp_path), entries, 100, done=lambda path, name: None) as writer:
        writer.write("a", torch.zeros(1))
    unwritten = pytest.raises(ValueError, match=r"2 of 2 files were never written; the export is incomplete")
    with unwritten, ShardedWriter(str(tmp_path), entries, 4, done=lambda path, name: None):
        pass
