"""A safetensors file written one tensor at a time: the header first, then each tensor's bytes.

``safetensors.torch.save_file`` needs every tensor in memory at once. The export of a large
model must not hold more than one on the CPU, so this writer takes the names, dtypes and shapes
up front (they fix the header and every offset) and then appends each tensor as it comes.

The layout is what ``save_file`` writes (the format's own rules): an 8-byte little-endian
header length, a compact JSON header padded with spaces to a multiple of 8 bytes, then the
tensors back to back in header order. Entries are ordered by element size, largest first, then
by name, as ``save_file`` orders them, so every tensor starts aligned to its element size; for
one dtype the bytes equal ``save_file``'s.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Iterable
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
