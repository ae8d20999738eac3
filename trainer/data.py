"""Dataset access: the manifest, shards fetched once per node into its cache, token windows, sample order.

A training sample ``i`` is the window of ``seq_len + 1`` tokens starting at ``i * seq_len``
of the split's concatenated token stream. The cursor is a global sample index (samples
consumed so far, across epochs); each epoch visits every sample once, in a permutation
drawn from a private generator seeded by (seed, epoch). Everything below the I/O helpers
is plain arithmetic, so resume on any world size replays the same global batches.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import node_cache
from trainer.config import samples_in
from trainer.contract import ENV_CACHE_DIR, MANIFEST_FORMAT, MANIFEST_NAME, join
from trainer.storage import Storage


class DataError(ValueError):
    """The dataset does not match what the trainer needs."""


def cache_dir() -> Path:
    """Node-local scratch: ``$TRAINOPS_CACHE_DIR`` or a folder under the system temp dir."""
    path = Path(os.environ.get(ENV_CACHE_DIR) or os.path.join(tempfile.gettempdir(), "trainops-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- manifest and shards (I/O) ---------------------------------------------------
def read_manifest(storage: Storage, data_uri: str) -> dict[str, Any]:
    from trainer.storage import NotFound

    uri = join(data_uri, MANIFEST_NAME)
    try:
        manifest = storage.get_json(uri)
    except NotFound:
        raise DataError(
            f"data_uri {data_uri!r} holds no {MANIFEST_NAME}: point it at a staged "
            "dataset version (<root>/datasets/<name>/<version>)"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise DataError(
            f"{uri} is not a {MANIFEST_FORMAT} manifest; point data_uri at a staged dataset version"
        )
    return manifest


def split_info(manifest: dict, split: str, data_uri: str) -> dict:
    info = manifest.get("splits", {}).get(split)
    if not info or not info.get("shards"):
        raise DataError(f"dataset {data_uri} has no {split!r} split; stage it with a non-empty {split} split")
    return info


def manifest_numbers(manifest: dict[str, Any], data_uri: str) -> tuple[int, int]:
    """``(train tokens, tokenizer vocabulary size)`` as the manifest states them: what
    ``trainer.config.check_data_fit`` needs to tell whether the dataset can feed a config."""
    try:
        return int(split_info(manifest, "train", data_uri)["tokens"]), int(
            manifest["tokenizer"]["vocab_size"]
        )
    except (KeyError, TypeError, ValueError):
        raise DataError(
            f"the manifest of dataset {data_uri!r} lacks splits.train.tokens or tokenizer.vocab_size: "
            "re-stage the dataset"
        ) from None


def fetch_split(
    storage: Storage, data_uri: str, manifest: dict[str, Any], split: str, only: Collection[int] | None = None
) -> list[Path]:
    """The split's shards in the node cache, each fetched once per node and verified.

    A shard is content-addressed by its sha256 (``shards/<sha256>.bin``), so runs and dataset
    versions that share a shard share its file, and any other content gets another name. The
    rank of the node that asks first downloads it, the others wait and find it verified
    (``trainer.node_cache``).

    :param only: the indices of the shards to fetch (:func:`shards_read` says which the
        remaining steps read); all of them when None. The paths are those shards', in order.
    """
    folder = cache_dir() / "shards"
    size = np.dtype(manifest.get("token_dtype", "uint16")).itemsize
    paths = []
    shards = split_info(manifest, split, data_uri)["shards"]
    for shard in shards if only is None else [shards[i] for i in sorted(set(only))]:
        sha, uri = shard["sha256"], join(data_uri, shard["path"])
        path = folder / f"{sha}.bin"
        tokens = shard.get("tokens")
        try:
            node_cache.fetch(
                storage, uri, path, sha256=sha, size=None if tokens is None else int(tokens) * size
            )
        except node_cache.Mismatch as bad:
            wrong_size = bad.want_size is not None and bad.size != bad.want_size
            sizes = f" ({bad.size} bytes, {bad.want_size} expected)" if wrong_size else ""
            raise DataError(
                f"shard {uri} has sha256 {bad.sha256}, the manifest says {sha}{sizes}; re-stage the dataset"
            ) from None
        paths.append(path)
    return paths


def read_eval_index(
    storage: Storage, data_uri: str, manifest: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The eval records (id, slice columns, start, end) and the slice column names."""
    index = manifest.get("eval_index")
    if not index:
        return [], []
    text = storage.get(join(data_uri, index["path"])).decode("utf-8")
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return records, list(index.get("slice_columns", []))


def remaining_positions(cursor: int, step: int, max_steps: int, global_batch: int) -> range:
    """The global sample positions the steps from ``step`` (at ``cursor``) to ``max_steps`` read."""
    return range(cursor, cursor + max(0, max_steps - step) * global_batch)


def shards_read(shard_tokens: Sequence[int], seq_len: int, seed: int, positions: range) -> list[int]:
    """The indices of the shards that the windows of the sample ``positions`` read. Pure.

    The samples are those :class:`TrainBatches` reads (:class:`SampleOrder` over the split's
    concatenated shards): sample ``i`` is tokens ``[i * seq_len, (i + 1) * seq_len + 1)``, so a
    window may span two shards (more when shards are shorter than a window).

    :param shard_tokens: the tokens of each shard of the split, in order (the manifest's).
    """
    offsets = np.cumsum([0, *shard_tokens])
    n = samples_in(int(offsets[-1]), seq_len)
    if n <= 0 or not len(positions):
        return []
    touched = np.zeros(len(shard_tokens), dtype=bool)
    for epoch in range(positions.start // n, (positions.stop - 1) // n + 1):
        lo, hi = max(positions.start, epoch * n) - epoch * n, min(positions.stop, (epoch + 1) * n) - epoch * n
        starts = sample_order(n, seed, epoch)[lo:hi].numpy().astype(np.int64) * seq_len
        first = np.searchsorted(offsets, starts, side="right") - 1
        last = np.searchsorted(offsets, starts + seq_len, side="right") - 1  # the window's last token
        for a, b in set(zip(first.tolist(), last.tolist(), strict=True)):
            touched[a : b + 1] = True
    return [int(i) for i in np.flatnonzero(touched)]


# --- token stream -----------------------------------------------------------------
class TokenStream:
    """The concatenation of memory-mapped shards, read by global token offsets."""

    def __init__(self, paths: list[Path], dtype: str):
        self.shards = [np.memmap(p, dtype=np.dtype(dtype).newbyteorder("<"), mode="r") for p in paths]
        self.offsets = np.cumsum([0] + [len(s) for s in self.shards])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` as int64, across shard boundaries."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"token range [{start}, {stop}) is outside a stream of {len(self)} tokens")
        parts = []
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        for i in range(first, len(self.shards)):
            lo, hi = max(start, self.offsets[i]), min(stop, self.offsets[i + 1])
            if lo >= hi:
                break
            parts.append(self.shards[i][lo - self.offsets[i] : hi - self.offsets[i]])
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def open_split(storage: Storage, data_uri: str, manifest: dict[str, Any], split: str) -> TokenStream:
    return TokenStream(fetch_split(storage, data_uri, manifest, split), manifest.get("token_dtype", "uint16"))


# --- sample arithmetic (pure) -------------------------------------------------------
def sample_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    # A private generator: the data order never draws from (or disturbs) the global RNG that the
    # checkpoint saves per rank, so it depends on (seed, epoch) alone, on any world size.
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def micro_batch_positions(
    cursor: int, micro_step: int, micro_batch_size: int, world_size: int, rank: int
) -> range:
    """Global sample positions that ``rank`` trains on in ``micro_step`` of the step starting at ``cursor``.

    Each micro-batch spans ``micro_batch_size * world_size`` consecutive positions; every rank
    takes its contiguous slice, so the ranks together consume the global batch exactly once.
    """
    start = cursor + (micro_step * world_size + rank) * micro_batch_size
    return range(start, start + micro_batch_size)


def global_batch_size(micro_batch_size: int, grad_accum_steps: int, world_size: int) -> int:
    return micro_batch_size * grad_accum_steps * world_size


@dataclass
class SampleOrder:
    """Maps a global position (the cursor's unit) to a sample id, one permutation per epoch."""

    num_samples: int
    seed: int
    _epoch: int = -1
    _perm: torch.Tensor | None = None

    def sample_id(self, position: int) -> int:
        epoch, offset = divmod(position, self.num_samples)
        perm = self._perm
        if epoch != self._epoch or perm is None:
            perm = sample_order(self.num_samples, self.seed, epoch)
            self._epoch, self._perm = epoch, perm
        return int(perm[offset])


class TrainBatches:
    """Micro-batches of (input, target) token tensors for one rank.

    Whether the stream holds enough samples for a micro-step is ``trainer.config.check_data_fit``'s
    to say (the operator applies the same rule before launch); the trainer checks it first.
    """

    def __init__(
        self, stream: TokenStream, seq_len: int, seed: int, micro_batch_size: int, world_size: int, rank: int
    ):
        self.stream, self.seq_len = stream, seq_len
        self.order = SampleOrder(samples_in(len(stream), seq_len), seed)
        self.micro_batch_size, self.world_size, self.rank = micro_batch_size, world_size, rank

    def window(self, sample_id: int) -> np.ndarray:
        start = sample_id * self.seq_len
        return self.stream.read(start, start + self.seq_len + 1)

    def micro_batch(self, cursor: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Read here, in the training process, from memory-mapped shards: there are no loader worker
        # processes, so none can die on (or ignore) the SIGTERM of a preemption, and the cursor
        # alone says what was read.
        positions = micro_batch_positions(
            cursor, micro_step, self.micro_batch_size, self.world_size, self.rank
        )
        windows = torch.from_numpy(np.stack([self.window(self.order.sample_id(p)) for p in positions]))
        return windows[:, :-1], windows[:, 1:]
