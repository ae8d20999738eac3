"""The streaming safetensors writer: the bytes ``save_file`` writes, one tensor at a time, in header order."""

import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer.safetensors_writer import Entry, StreamWriter, ordered


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
