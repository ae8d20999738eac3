"""Record tasks' samples (``trainer.contract.tasks``): one record, one sample, never split across
samples nor packed with another.

A record is a row ``(start, length, aux)`` of the split's ``records.bin``: its tokens are
``[start, start + length)`` of the split's token stream (its shards, as for ``causal_lm``). A
sample is a ``(2, seq_len + 1)`` int64 array, channel 0 the tokens, channel 1 the targets:

- ``sft`` (``aux``: the prompt's tokens): the record's first ``seq_len + 1`` tokens, padded with
  token 0 (never attended to by a real token under causal attention, since it comes after them);
  the targets are the tokens themselves where they carry loss, else ``IGNORE_INDEX`` (the
  prompt, the padding). :meth:`RecordBatches.split` shifts both, as for token windows.
- ``classification`` (``aux``: the label's index): the record's first ``seq_len`` tokens, padded
  with :data:`PADDING` (``trainer.models.hf.ClassifierLogits`` masks it out of attention); the
  targets are the label. :meth:`RecordBatches.split` gives the tokens and one label per sample.

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
from trainer.contract import (
    IGNORE_INDEX,
    RECORD_FIELDS,
    RECORD_TASKS,
    RECORDS_DTYPE,
    TASK_CLASSIFICATION,
    join,
    split_records,
)
from trainer.data import (
    DataError,
    SampleOrder,
    TokenStream,
    cache_dir,
    inputs_and_targets,
    micro_batch_positions,
)
from trainer.storage import Storage

# A classification sample's padding: a token id no tokenizer gives (ClassifierLogits masks it).
PADDING = -1


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


def check_records(rows: np.ndarray, stream_tokens: int, uri: str, labels: int | None = None) -> None:
    """Every record lies inside the stream and has a token; ``aux`` is a prompt shorter than the
    record (``sft``) or, given the label count, a label's index (``classification``)."""
    start, length, aux = rows[:, 0], rows[:, 1], rows[:, 2]
    aux_bad = (aux < 0) | (aux >= labels) if labels is not None else (aux < 0) | (aux >= length)
    bad = np.flatnonzero((start < 0) | (length < 1) | (start + length > stream_tokens) | aux_bad)
    if len(bad):
        i = int(bad[0])
        keep = f"a label index below {labels}" if labels is not None else "a response"
        raise DataError(
            f"record {i} of {uri} is ({', '.join(f'{k} {int(v)}' for k, v in zip(RECORD_FIELDS, rows[i], strict=True))}) "
            f"in a stream of {stream_tokens} tokens: a record must lie inside the stream and keep {keep}; "
            "re-stage the dataset"
        )


def labelled_sample(tokens: np.ndarray, label: int, seq_len: int) -> np.ndarray:
    """One ``classification`` record as a ``(2, seq_len + 1)`` int64 sample: its first
    ``seq_len`` tokens padded with :data:`PADDING` (the last column is always padding), and its
    label in every column of channel 1. Pure."""
    n = min(len(tokens), seq_len)
    out = np.full((2, seq_len + 1), PADDING, dtype=np.int64)
    out[0, :n] = tokens[:n]
    out[1, :] = label
    return out


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
    tensor (:func:`sample`, :func:`labelled_sample`), :meth:`split` its inputs and targets."""

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
        if task not in RECORD_TASKS:
            raise ValueError(f"task {task!r} has no record batches (only {', '.join(RECORD_TASKS)})")
        self.task, self.stream, self.rows, self.seq_len = task, stream, rows, seq_len
        # sft's targets carry IGNORE_INDEX (the loss is their masked mean); a label is always one
        self.masked = task != TASK_CLASSIFICATION
        self.order = SampleOrder(len(rows), seed)
        self.micro_batch_size, self.world_size, self.rank = micro_batch_size, world_size, rank
        self.pin_memory = pin_memory

    def record(self, sample_id: int) -> np.ndarray:
        """Record ``sample_id`` as a sample (:func:`sample`)."""
        start, length, aux = (int(v) for v in self.rows[sample_id])
        tokens = self.stream.read(start, start + min(length, self.seq_len + 1))
        if self.task == TASK_CLASSIFICATION:
            return labelled_sample(tokens, aux, self.seq_len)
        return sample(tokens, aux, self.seq_len)

    def split(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch's (inputs, targets): for ``sft`` the tokens and labels shifted by one
        (``trainer.data.inputs_and_targets``); for ``classification`` the ``seq_len`` tokens and
        one label per sample."""
        return split_samples(windows, self.task)

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


def split_samples(windows: torch.Tensor, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a micro-batch of ``task``'s samples (:meth:`RecordBatches.split`)."""
    if task == TASK_CLASSIFICATION:
        return windows[:, 0, :-1], windows[:, 1, 0]
    return inputs_and_targets(windows)
