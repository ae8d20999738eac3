"""Dataset access: the manifest, shards fetched once per node into its cache, token windows, sample order.

A training sample ``i`` is the window of ``seq_len + 1`` tokens starting at ``i * seq_len``
of the split's concatenated token stream. The cursor is a global sample index (samples
consumed so far, across epochs); each epoch visits every sample once, in a permutation
drawn from a private generator seeded by (seed, epoch). Everything below the I/O helpers
is plain arithmetic, so resume on any world size replays the same global batches; at the
bottom, :class:`DeviceFeed` puts the micro-batches on the training device, one read ahead.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from trainer.checkpoint import node_cache
from trainer.config import samples_in
from trainer.contract import ENV_CACHE_DIR, MANIFEST_FORMAT, MANIFEST_NAME, join
from trainer.storage import NotFound, Storage


class DataError(ValueError):
    """The dataset does not match what the trainer needs."""


def cache_dir() -> Path:
    """Node-local scratch: ``$TRAINOPS_CACHE_DIR`` or a folder under the system temp dir."""
    path = Path(os.environ.get(ENV_CACHE_DIR) or os.path.join(tempfile.gettempdir(), "trainops-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- manifest and shards (I/O) ---------------------------------------------------
def read_manifest(storage: Storage, data_uri: str) -> dict[str, Any]:
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
    (``trainer.checkpoint.node_cache``).

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

    def __init__(self, paths: Sequence[Path | None], dtype: str, lengths: Sequence[int] | None = None):
        """:param paths: each shard's file, in order; None for a shard not fetched (the remaining
            steps never read it, :func:`shards_read`), whose tokens ``lengths`` must then give.
        :param lengths: each shard's tokens (the manifest's); needed only for absent shards.
        """
        order = np.dtype(dtype).newbyteorder("<")
        self._shards = [None if p is None else np.memmap(p, dtype=order, mode="r") for p in paths]
        if lengths is None and any(s is None for s in self._shards):
            raise ValueError("a TokenStream with absent shards needs every shard's length")
        sizes = [len(s) if s is not None else int(lengths[i]) for i, s in enumerate(self._shards)]  # type: ignore[index]
        self.offsets = np.cumsum([0, *sizes])
        self._windows: dict[tuple[int, int], np.ndarray] = {}  # (shard, length): its windows' view

    def shard(self, i: int) -> np.ndarray:
        """Shard ``i``'s tokens; DataError if it was not fetched (nothing should read it)."""
        found = self._shards[i]
        if found is None:
            raise DataError(
                f"train shard {i} was not fetched, because the remaining steps were not expected to read "
                "it, yet a window reads it: this is a trainer bug; report it with the run's config"
            )
        return found

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` as int64, across shard boundaries."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"token range [{start}, {stop}) is outside a stream of {len(self)} tokens")
        parts = []
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        for i in range(first, len(self._shards)):
            lo, hi = max(start, self.offsets[i]), min(stop, self.offsets[i + 1])
            if lo >= hi:
                break
            parts.append(self.shard(i)[lo - self.offsets[i] : hi - self.offsets[i]])
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def gather(self, starts: np.ndarray, length: int, out: np.ndarray | None = None) -> np.ndarray:
        """The windows of ``length`` tokens at global offsets ``starts``, as one
        ``(len(starts), length)`` int64 array.

        The windows are grouped by the shard that holds them, and each group is copied in one
        go, straight into ``out``: a fancy index over a strided view of the shard's windows
        (each row a contiguous copy, no index per token) when it holds several, a slice when it
        holds one. Only a window that crosses a shard boundary (about one in
        ``shard tokens / length``) is read on its own.

        :param out: an int64 array of that shape to fill (a pinned buffer's view), else a new one.
        """
        starts = np.asarray(starts, dtype=np.int64)
        if out is None:
            out = np.empty((len(starts), length), dtype=np.int64)
        if not len(starts):
            return out
        low, high = int(starts.min()), int(starts.max())
        if low < 0 or high + length > len(self):
            bad = low if low < 0 else high
            raise IndexError(f"token range [{bad}, {bad + length}) is outside a stream of {len(self)} tokens")
        first = np.searchsorted(self.offsets, starts, side="right") - 1
        last = np.searchsorted(self.offsets, starts + length - 1, side="right") - 1
        local = starts - self.offsets[first]
        crossing = first != last
        by_shard = np.argsort(np.where(crossing, -1, first), kind="stable")[int(crossing.sum()) :]
        bounds = (
            [0, *(np.flatnonzero(np.diff(first[by_shard])) + 1).tolist(), len(by_shard)]
            if len(by_shard)
            else []
        )
        for lo, hi in itertools.pairwise(bounds):
            if hi - lo == 1:  # a shard holding one window of the batch: a plain slice copies it
                row = int(by_shard[lo])
                out[row] = self.shard(int(first[row]))[local[row] : local[row] + length]
            else:
                rows = by_shard[lo:hi]
                out[rows] = self._shard_windows(int(first[rows[0]]), length)[local[rows]]
        for crosser in np.flatnonzero(crossing).tolist():
            out[crosser] = self.read(int(starts[crosser]), int(starts[crosser]) + length)
        return out

    def _shard_windows(self, shard: int, length: int) -> np.ndarray:
        """Every window of ``length`` tokens inside shard ``shard``, as a strided view (no copy)."""
        view = self._windows.get((shard, length))
        if view is None:
            view = self._windows[shard, length] = np.lib.stride_tricks.sliding_window_view(
                self.shard(shard), length
            )
        return view


def open_split(
    storage: Storage, data_uri: str, manifest: dict[str, Any], split: str, only: Collection[int] | None = None
) -> TokenStream:
    """The split as one token stream, its shards fetched into the node cache.

    :param only: the shards to fetch (:func:`shards_read`), all when None; the others stay
        absent from the stream, their lengths taken from the manifest.
    """
    shards = split_info(manifest, split, data_uri)["shards"]
    dtype = manifest.get("token_dtype", "uint16")
    if only is None:
        return TokenStream(fetch_split(storage, data_uri, manifest, split), dtype)
    wanted = sorted(set(only))
    fetched = dict(zip(wanted, fetch_split(storage, data_uri, manifest, split, wanted), strict=True))
    return TokenStream(
        [fetched.get(i) for i in range(len(shards))], dtype, [int(shard["tokens"]) for shard in shards]
    )


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


# The permutations kept: a micro-batch spans one epoch, or two at an epoch's end.
EPOCHS_KEPT = 2


@dataclass
class SampleOrder:
    """Maps a global position (the cursor's unit) to a sample id, one permutation per epoch."""

    num_samples: int
    seed: int
    _perms: dict[int, np.ndarray] = field(default_factory=dict)

    def permutation(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s order of the sample ids (:func:`sample_order`), drawn once and kept."""
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) >= EPOCHS_KEPT:
                del self._perms[min(self._perms)]
            perm = self._perms[epoch] = sample_order(self.num_samples, self.seed, epoch).numpy()
        return perm

    def sample_ids(self, positions: np.ndarray) -> np.ndarray:
        """The sample id at each global position, as int64 (one gather per epoch touched)."""
        epochs, offsets = np.divmod(np.asarray(positions, dtype=np.int64), self.num_samples)
        if len(epochs) and epochs.min() == epochs.max():  # the common case: one epoch
            return self.permutation(int(epochs[0]))[offsets]
        ids = np.empty(len(offsets), dtype=np.int64)
        for epoch in np.unique(epochs):
            where = epochs == epoch
            ids[where] = self.permutation(int(epoch))[offsets[where]]
        return ids

    def sample_id(self, position: int) -> int:
        epoch, offset = divmod(position, self.num_samples)
        return int(self.permutation(epoch)[offset])


class TrainBatches:
    """Micro-batches of token windows for one rank: ``seq_len + 1`` tokens per sample, inputs
    the first ``seq_len``, targets the last (:func:`inputs_and_targets`).

    Whether the stream holds enough samples for a micro-step is ``trainer.config.check_data_fit``'s
    to say (the operator applies the same rule before launch); the trainer checks it first.

    :param pin_memory: read into page-locked memory, for a ``non_blocking`` copy to a GPU
        (:class:`DeviceFeed` sets it on CUDA; on a CPU-only host pinning fails or wastes).
    """

    masked = False  # every target carries loss (a record task's batches say True)

    def __init__(
        self,
        stream: TokenStream,
        seq_len: int,
        seed: int,
        micro_batch_size: int,
        world_size: int,
        rank: int,
        pin_memory: bool = False,
    ):
        self.stream, self.seq_len = stream, seq_len
        self.order = SampleOrder(samples_in(len(stream), seq_len), seed)
        self.micro_batch_size, self.world_size, self.rank = micro_batch_size, world_size, rank
        self.pin_memory = pin_memory

    def window(self, sample_id: int) -> np.ndarray:
        return self.stream.gather(np.array([sample_id * self.seq_len]), self.seq_len + 1)[0]

    def micro_batch(self, cursor: int, micro_step: int) -> torch.Tensor:
        """The ``(micro_batch_size, seq_len + 1)`` int64 windows of this rank's slice of
        ``micro_step`` in the step starting at ``cursor``, gathered in one go."""
        # Read here, in the training process, from memory-mapped shards: there are no loader worker
        # processes, so none can die on (or ignore) the SIGTERM of a preemption, and the cursor
        # alone says what was read.
        positions = micro_batch_positions(
            cursor, micro_step, self.micro_batch_size, self.world_size, self.rank
        )
        ids = self.order.sample_ids(np.arange(positions.start, positions.stop))
        windows = torch.empty((len(ids), self.seq_len + 1), dtype=torch.int64, pin_memory=self.pin_memory)
        self.stream.gather(ids * self.seq_len, self.seq_len + 1, out=windows.numpy())
        return windows

    def split(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (:func:`inputs_and_targets`)."""
        return inputs_and_targets(windows)


class Batches(Protocol):
    """What :class:`DeviceFeed` reads from: :class:`TrainBatches` (token windows) or
    ``trainer.records.RecordBatches`` (a record task's samples)."""

    pin_memory: bool
    masked: bool  # whether targets carry IGNORE_INDEX (the loss is then a masked mean)

    def micro_batch(self, cursor: int, micro_step: int) -> torch.Tensor: ...

    def split(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch's (inputs, targets)."""
        ...


def inputs_and_targets(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's inputs and targets: the targets are the inputs shifted by one token. A
    record task's micro-batch (``trainer.records``) has two channels, tokens and labels: the
    targets are then the labels, shifted alike."""
    if windows.dim() == 3:
        return windows[:, 0, :-1], windows[:, 1, 1:]
    return windows[:, :-1], windows[:, 1:]


class DeviceFeed:
    """Micro-batches on the training device, read one ahead of the compute.

    The loop calls :meth:`prefetch` for the next micro-batch once the current one's forward and
    backward are issued, and :meth:`get` when it needs it. On CUDA the windows are read into
    pinned memory and copied on a stream of their own (``non_blocking``), so the copy runs while
    the device computes; the compute stream waits for it on the device, the host never does. On
    a CPU the windows are used where they were read. Either way the reads happen at the same
    points, in the training process, in cursor order: a prefetched micro-batch is always the
    next one the loop asks for.
    """

    def __init__(self, batches: Batches, device: torch.device):
        self.batches, self.device = batches, device
        self.cuda = device.type == "cuda"
        batches.pin_memory = self.cuda
        self._copies = torch.cuda.Stream(device) if self.cuda else None
        self._ahead: tuple[tuple[int, int], torch.Tensor] | None = None

    def prefetch(self, cursor: int, micro_step: int) -> None:
        """Read micro-batch ``micro_step`` of the step at ``cursor`` and start its copy to the device."""
        self._ahead = ((cursor, micro_step), self._to_device(self.batches.micro_batch(cursor, micro_step)))

    def get(self, cursor: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """That micro-batch's (inputs, targets) on the device: the prefetched one, else read now.

        Raises ``RuntimeError`` when another micro-batch was prefetched: it would have been read
        for nothing, and the reads would no longer follow the cursor.
        """
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            windows = self._to_device(self.batches.micro_batch(cursor, micro_step))
        elif ahead[0] == (cursor, micro_step):
            windows = ahead[1]
        else:
            raise RuntimeError(
                f"micro-batch {ahead[0][1]} at cursor {ahead[0][0]} was prefetched, but the loop asks for "
                f"micro-batch {micro_step} at cursor {cursor}; the loop's cursor arithmetic is wrong"
            )
        if self._copies is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self._copies)  # on the device: the host does not wait
            windows.record_stream(compute)  # its memory is in use on the compute stream from now on
        return self.batches.split(windows)

    def _to_device(self, windows: torch.Tensor) -> torch.Tensor:
        if self._copies is None:
            return windows
        with torch.cuda.stream(self._copies):
            return windows.to(self.device, non_blocking=True)
