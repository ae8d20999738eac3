"""Record tasks' samples (``trainer.contract.tasks``): one record, one sample, never split across
samples nor packed with another.

A record is a row ``(start, length, aux)`` of the split's ``records.bin``: its tokens are
``[start, start + length)`` of the split's token stream (its shards, as for ``causal_lm``). For
``sft`` the first ``aux`` of them are the prompt's. A sample is the record's first
``seq_len + 1`` tokens, padded to that length: channel 0 of a micro-batch holds the tokens (the
padding is token 0, never attended to by a real token under causal attention, since it comes
after them), channel 1 the labels: the tokens themselves where they carry loss, else
``IGNORE_INDEX`` (the prompt, the padding). ``trainer.data.inputs_and_targets`` shifts both.

The sample order is :class:`trainer.data.SampleOrder` over the records, so a resume replays the
same global batches on any world size, as for token windows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.checkpoint import node_cache
from trainer.contract import IGNORE_INDEX, RECORD_FIELDS, RECORDS_DTYPE, TASK_SFT, join, split_records
from trainer.data import DataError, SampleOrder, TokenStream, cache_dir, micro_batch_positions
from trainer.storage import Storage


def read_records(storage: Storage, data_uri: str, manifest: dict[str, Any], split: str) -> np.ndarray:
    """The split's ``(count, 3)`` int64 record rows, fetched once per node into its cache and
    verified against the manifest's sha256 and count."""
    info = split_records(manifest, split)
    if info is None or "path" not in info:
        raise DataError(
            f"dataset {data_uri} was staged for a record task but its {split!r} split lists no records; "
            "stage it again"
        )
    uri, count = join(data_uri, str(info["path"])), int(info.get("count", -1))
    sha = str(info.get("sha256") or hashlib.sha256(uri.encode()).hexdigest())
    path = cache_dir() / "records" / f"{sha}.bin"
    row_bytes = np.dtype(RECORDS_DTYPE).itemsize * len(RECORD_FIELDS)
    try:
        node_cache.fetch(
            storage, uri, path, sha256=info.get("sha256"), size=count * row_bytes if count >= 0 else None
        )
    except node_cache.Mismatch as bad:
        raise DataError(f"records {uri} do not match the manifest ({bad}); re-stage the dataset") from None
    rows = np.fromfile(Path(path), dtype=RECORDS_DTYPE).reshape(-1, len(RECORD_FIELDS))
    if count >= 0 and len(rows) != count:
        raise DataError(
            f"records {uri} hold {len(rows)} rows, the manifest says {count}; re-stage the dataset"
        )
    return rows


def check_records(rows: np.ndarray, stream_tokens: int, uri: str) -> None:
    """Every record lies inside the stream, has a token, and (``aux``) a prompt shorter than itself."""
    start, length, aux = rows[:, 0], rows[:, 1], rows[:, 2]
    bad = np.flatnonzero(
        (start < 0) | (length < 1) | (start + length > stream_tokens) | (aux < 0) | (aux >= length)
    )
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"record {i} of {uri} is ({', '.join(f'{k} {int(v)}' for k, v in zip(RECORD_FIELDS, rows[i], strict=True))}) "
            f"in a stream of {stream_tokens} tokens: a record must lie inside the stream and keep a response; "
            "re-stage the dataset"
        )


def sample(tokens: np.ndarray, prompt: int, seq_len: int) -> np.ndarray:
    """One record as a ``(2, seq_len + 1)`` int64 sample: its tokens (truncated, padded with 0)
    and its labels (the tokens from ``prompt`` on; ``IGNORE_INDEX`` before and on the padding).
    Pure."""
    n = min(len(tokens), seq_len + 1)
    out = np.zeros((2, seq_len + 1), dtype=np.int64)
    out[0, :n] = tokens[:n]
    out[1, :] = IGNORE_INDEX
    out[1, prompt:n] = tokens[prompt:n]
    return out


class RecordBatches:
    """Micro-batches of records for one rank, as :class:`trainer.data.TrainBatches` gives token
    windows: ``micro_batch(cursor, micro_step)`` is a ``(micro_batch_size, 2, seq_len + 1)``
    tensor (tokens, labels; :func:`sample`)."""

    masked = True  # the labels carry IGNORE_INDEX: the loss is their masked mean

    def __init__(
        self,
        stream: TokenStream,
        rows: np.ndarray,
        task: str,
        seq_len: int,
        seed: int,
        micro_batch_size: int,
        world_size: int,
        rank: int,
        pin_memory: bool = False,
    ):
        if task != TASK_SFT:
            raise ValueError(f"task {task!r} has no record batches in this trainer (sft only)")
        self.stream, self.rows, self.seq_len = stream, rows, seq_len
        self.order = SampleOrder(len(rows), seed)
        self.micro_batch_size, self.world_size, self.rank = micro_batch_size, world_size, rank
        self.pin_memory = pin_memory

    def record(self, sample_id: int) -> np.ndarray:
        """Record ``sample_id`` as a sample (:func:`sample`)."""
        start, length, prompt = (int(v) for v in self.rows[sample_id])
        tokens = self.stream.read(start, start + min(length, self.seq_len + 1))
        return sample(tokens, prompt, self.seq_len)

    def micro_batch(self, cursor: int, micro_step: int) -> torch.Tensor:
        positions = micro_batch_positions(
            cursor, micro_step, self.micro_batch_size, self.world_size, self.rank
        )
        ids = self.order.sample_ids(np.arange(positions.start, positions.stop))
        out = torch.empty((len(ids), 2, self.seq_len + 1), dtype=torch.int64, pin_memory=self.pin_memory)
        batch = out.numpy()
        for row, sample_id in enumerate(ids.tolist()):
            batch[row] = self.record(sample_id)
        return out
