"""A safetensors file written one tensor at a time: the header first, then each tensor's bytes.

``safetensors.torch.save_file`` needs every tensor in memory at once. The export of a large
model must not hold more than one on the CPU, so this writer takes the names, dtypes and shapes
up front (they fix the header and every offset) and then appends each tensor as it comes.

The layout is what ``save_file`` writes (the format's own rules): an 8-byte little-endian
header length, a compact JSON header padded with spaces to a multiple of 8 bytes, then the
tensors back to back in header order. Entries are ordered by element size, largest first, then
by name, as ``save_file`` orders them, so every tensor starts aligned to its element size; for
one dtype the bytes equal ``save_file``'s.

Above a size limit the tensors go to several files, as Hugging Face shards a checkpoint
(:class:`ShardedWriter`): ``model-00001-of-0000N.safetensors`` and so on, each holding a run of
the tensors in file order, with ``model.safetensors.index.json`` mapping every tensor to its file.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO

import torch

# torch dtype -> the format's dtype code
DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class Entry:
    """One tensor of the file, as the header describes it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` in file order: element size descending, then name (``save_file``'s order)."""
    return sorted(entries, key=lambda e: (-e.dtype.itemsize, e.name))


def header(entries: list[Entry], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix and the padded JSON header for ``entries`` in this order."""
    document: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for entry in entries:
        if entry.dtype not in DTYPES:
            raise ValueError(
                f"tensor {entry.name!r} has dtype {entry.dtype}, which this writer does not store; "
                f"convert it to one of {', '.join(str(d) for d in DTYPES)}"
            )
        document[entry.name] = {
            "dtype": DTYPES[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    text = json.dumps(document, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


class StreamWriter:
    """Writes ``entries`` (in :func:`ordered` order) to ``path``; :meth:`write` each tensor in that order.

    :param path: the file to write.
    :param entries: every tensor of the file; the header is written at once.
    :param metadata: the header's ``__metadata__`` (string values).
    """

    def __init__(self, path: str, entries: Iterable[Entry], metadata: dict[str, str] | None = None):
        if sys.byteorder != "little":
            raise RuntimeError("safetensors stores little-endian bytes; export on a little-endian host")
        self.entries = ordered(entries)
        self._next = 0
        prefix = header(self.entries, metadata)
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close() or __exit__
        self._file.write(prefix)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next tensor; its name, dtype and shape must be the next entry's."""
        if self._next >= len(self.entries):
            raise ValueError(f"tensor {name!r} is one more than the {len(self.entries)} the header declares")
        entry = self.entries[self._next]
        if (name, tensor.dtype, tuple(tensor.shape)) != (entry.name, entry.dtype, entry.shape):
            raise ValueError(
                f"tensor {name!r} ({tensor.dtype}, {tuple(tensor.shape)}) arrived where the header "
                f"declares {entry.name!r} ({entry.dtype}, {entry.shape}); write tensors in entries order"
            )
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        if flat.numel():
            self._file.write(flat.view(torch.uint8).numpy().data)  # the bytes, no copy
        self._next += 1

    def close(self) -> None:
        """Close the file; raises if a declared tensor was never written."""
        self._file.close()
        if self._next != len(self.entries):
            raise ValueError(
                f"{len(self.entries) - self._next} declared tensors were never written, "
                f"the first {self.entries[self._next].name!r}; the file is incomplete"
            )

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._file.close()
        else:
            self.close()


SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def split_shards(entries: Iterable[Entry], max_bytes: int) -> list[list[Entry]]:
    """``entries`` in file order, cut into runs of at most ``max_bytes`` tensor bytes each.

    A tensor larger than the limit is a file of its own (a tensor is never split, as in HF).
    """
    if max_bytes < 1:
        raise ValueError(f"the shard size limit must be a positive number of bytes, got {max_bytes}")
    shards: list[list[Entry]] = [[]]
    size = 0
    for entry in ordered(entries):
        if shards[-1] and size + entry.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += entry.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    """The file names of ``count`` shards: ``model.safetensors`` alone, else HF's numbered names."""
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def index_document(shards: list[list[Entry]], names: list[str]) -> dict[str, object]:
    """``model.safetensors.index.json``: ``metadata.total_size`` (tensor bytes) and ``weight_map``."""
    return {
        "metadata": {"total_size": sum(e.nbytes for shard in shards for e in shard)},
        "weight_map": {e.name: name for shard, name in zip(shards, names, strict=True) for e in shard},
    }


class ShardedWriter:
    """Writes ``entries`` to files of at most ``max_bytes`` in ``folder``, one file at a time.

    :meth:`write` takes the tensors in :func:`ordered` order, as :class:`StreamWriter` does;
    each file is opened when its first tensor comes and handed to ``done(path, name)`` once its
    last one is written (to upload and remove it), so the local disk holds one file at a time.

    :param folder: a local folder for the file being written.
    :param entries: every tensor of the model.
    :param max_bytes: the size limit of one file's tensors.
    :param metadata: each file's ``__metadata__``.
    :param done: called with each finished file's local path and name.
    """

    def __init__(
        self,
        folder: str,
        entries: Iterable[Entry],
        max_bytes: int,
        *,
        metadata: dict[str, str] | None = None,
        done: Callable[[str, str], None],
    ):
        self.shards = split_shards(entries, max_bytes)
        self.names = shard_names(len(self.shards))
        self._folder = folder
        self._metadata = metadata
        self._done = done
        self._shard = 0
        self._left = 0
        self._writer: StreamWriter | None = None

    @property
    def index(self) -> dict[str, object] | None:
        """The index document when the model takes several files; None for one file."""
        return index_document(self.shards, self.names) if len(self.shards) > 1 else None

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next tensor (in entries order) to its file."""
        if self._writer is None:
            if self._shard >= len(self.shards):
                raise ValueError(f"tensor {name!r} is one more than the model's tensors the files declare")
            entries = self.shards[self._shard]
            self._writer = StreamWriter(self._path(), entries, self._metadata)
            self._left = len(entries)
        self._writer.write(name, tensor)
        self._left -= 1
        if not self._left:
            self._writer.close()
            self._writer = None
            self._done(self._path(), self.names[self._shard])
            self._shard += 1

    def close(self) -> None:
        """Raise if a declared tensor was never written (the files are then incomplete)."""
        if self._writer is not None:
            self._writer.close()  # raises, naming the first missing tensor
        if self.shards == [[]]:  # a model without tensors: one file with a header only
            StreamWriter(self._path(), [], self._metadata).close()
            self._done(self._path(), self.names[0])
            self._shard = 1
        if self._shard != len(self.shards):
            raise ValueError(
                f"{len(self.shards) - self._shard} of {len(self.shards)} files were never written; "
                f"the export is incomplete"
            )

    def _path(self) -> str:
        return os.path.join(self._folder, self.names[self._shard])

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            if self._writer is not None:
                self._writer.__exit__(*exc)  # close the file, raise nothing over the error
        else:
            self.close()
