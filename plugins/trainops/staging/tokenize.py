"""The byte-level token format, the id-hash split rule, and packing into fixed-size shards.

A record's tokens are its text's tokens followed by EOS (for the built-in byte-level
tokenizer: the UTF-8 bytes of its text, then 256). Each split is one token stream cut into
shards of ``shard_tokens`` little-endian tokens of the manifest's ``token_dtype`` (uint16
when the vocabulary fits, else uint32; the last shard may be shorter). Records run across
shard boundaries, because the trainer reads windows from the stream, not records.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, BinaryIO

BYTE_VOCAB_SIZE, BYTE_EOS_ID = 257, 256  # UTF-8 bytes, then EOS
TOKENIZER = {"kind": "byte", "vocab_size": BYTE_VOCAB_SIZE, "eos_id": BYTE_EOS_ID}
TOKEN_DTYPE = "uint16"
DEFAULT_SHARD_TOKENS = 1 << 20
DEFAULT_EVAL_PERCENT = 10


def token_dtype_for(vocab_size: int) -> str:
    """The narrowest shard dtype that holds every token id of a vocabulary this size."""
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise ValueError(f"a vocabulary of {vocab_size} tokens does not fit in uint32 shards")


def split_rule(eval_percent: int = DEFAULT_EVAL_PERCENT) -> dict:
    return {"kind": "id_hash", "hash": "sha256", "eval_percent": int(eval_percent)}


def split_of(record_id: str, eval_percent: int = DEFAULT_EVAL_PERCENT) -> str:
    """``"eval"`` or ``"train"``.

    Depends only on the id, so a record stays on its side across dataset versions.
    """
    bucket = int(hashlib.sha256(str(record_id).encode("utf-8")).hexdigest()[:8], 16) % 100
    return "eval" if bucket < eval_percent else "train"


def eval_mask(record_ids: list[str], eval_percent: int = DEFAULT_EVAL_PERCENT):
    """:func:`split_of` for many ids at once: a numpy bool array, True for ``"eval"``."""
    import numpy as np

    sha = hashlib.sha256
    # The first 4 digest bytes, big-endian, are the first 8 hex digits as an integer.
    heads = b"".join([sha(i.encode("utf-8")).digest()[:4] for i in record_ids])
    return np.frombuffer(heads, dtype=">u4") % 100 < eval_percent


def encode(text: str) -> bytes:
    """The record's tokens as little-endian uint16 bytes: its UTF-8 bytes, then EOS."""
    import numpy as np

    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    tokens = np.empty(len(raw) + 1, dtype="<u2")
    tokens[:-1] = raw
    tokens[-1] = BYTE_EOS_ID
    return tokens.tobytes()


def decode(data: bytes) -> list[str]:
    """Texts of a token stream (inverse of :func:`encode` over concatenated records)."""
    import numpy as np

    tokens = np.frombuffer(data, dtype="<u2")
    out, start = [], 0
    for end in np.flatnonzero(tokens == TOKENIZER["eos_id"]):
        out.append(tokens[start:end].astype(np.uint8).tobytes().decode("utf-8"))
        start = int(end) + 1
    return out


class ShardPacker:
    """Appends records to one split's token stream, writing ``<out_dir>/<split>/NNNNN.bin``."""

    def __init__(
        self, out_dir: str, split: str, shard_tokens: int = DEFAULT_SHARD_TOKENS, dtype: str = TOKEN_DTYPE
    ):
        if shard_tokens < 1:
            raise ValueError(f"shard_tokens must be at least 1, got {shard_tokens}")
        if dtype not in ("uint16", "uint32"):
            raise ValueError(f"token dtype must be uint16 or uint32, got {dtype!r}")
        self.out_dir = out_dir
        self.split = split
        self.shard_tokens = int(shard_tokens)
        self.dtype = dtype
        self._width = 2 if dtype == "uint16" else 4
        self.tokens = 0
        self.records = 0
        self.shards: list[dict] = []
        self._file: BinaryIO | None = None
        self._hash: Any = None  # hashlib's sha256 object, while a shard is open
        self._in_shard = 0

    def add(self, token_bytes: bytes, records: int = 1) -> tuple[int, int]:
        """Append the tokens of ``records`` records (little-endian bytes of this packer's
        dtype); return their span ``(start, end)`` in the stream."""
        start = self.tokens
        view = memoryview(token_bytes).cast("B")
        added = len(view) // self._width
        while view:
            if self._file is None:
                self._file = self._open()
            room = (self.shard_tokens - self._in_shard) * self._width
            chunk, view = view[:room], view[room:]
            self._file.write(chunk)
            self._hash.update(chunk)
            self._in_shard += len(chunk) // self._width
            if self._in_shard == self.shard_tokens:
                self._close_shard()
        self.tokens += added
        self.records += records
        return start, self.tokens

    def close(self) -> dict:
        """Finish the last shard; return ``{"tokens", "shards": [{"path", "tokens", "sha256"}]}``."""
        if self._file is not None:
            self._close_shard()
        return {"tokens": self.tokens, "shards": list(self.shards)}

    def _open(self) -> BinaryIO:
        rel = f"{self.split}/{len(self.shards):05d}.bin"
        os.makedirs(os.path.join(self.out_dir, self.split), exist_ok=True)
        self._hash = hashlib.sha256()
        self._in_shard = 0
        self._rel = rel
        return open(os.path.join(self.out_dir, rel), "wb")

    def _close_shard(self) -> None:
        assert self._file is not None
        self._file.close()
        self.shards.append({"path": self._rel, "tokens": self._in_shard, "sha256": self._hash.hexdigest()})
        self._file = None


def index_line(record_id: str, slices: dict, start: int, end: int) -> str:
    """One ``eval/index.jsonl`` line: id, slice columns, then the token span (end exclusive)."""
    return json.dumps({"id": record_id, **slices, "start": start, "end": end}, ensure_ascii=False) + "\n"
