"""Committed checkpoints as files: where a rank keeps them, how one is verified, picked and fetched.

A checkpoint ``checkpoints/step_<N>/`` is trusted only if its ``_COMMITTED`` lists files that
all exist with their sizes (``trainer.checkpoint.commit`` decides) and the run's fence does not void it
(``trainer.checkpoint.fence``: written by a stale attempt); every file fetched is checked against the
listed sha256 too, taken as it arrives. Any single process can read them: the
:class:`trainer.checkpoint.save.Checkpointer` on rank 0 when it picks one to resume from, and
``trainer export`` / ``trainer evaluate`` (:func:`download`). The training ranks fetch the
files they read into their node's shared folder instead (:func:`node_dir`, :func:`fetch_listed`).

Files of a checkpoint: DCP's ``.metadata`` and ``__<r>_<i>.distcp`` shards (the model and the
optimizer), and one ``extra_rank<r>.pt`` per rank holding the per-rank states by name. A save
learns each file's size and sha256 from the bytes as they are written (:class:`Written`,
:func:`hashing_writer`): nothing is read back to checksum it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystem

from trainer.checkpoint import commit, node_cache
from trainer.checkpoint.fence import FenceEntry, fence_of, marker_attempt, read_latest, void_reason
from trainer.contract import RunLayout, join
from trainer.data import cache_dir
from trainer.storage import NotFound, Storage

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger("trainer.checkpoint")  # one logger for everything about checkpoints


class CorruptCheckpoint(RuntimeError):
    """A committed checkpoint's file does not match the checksum in its ``_COMMITTED``."""


def fresh_dir(path: Path) -> Path:
    """``path`` as a new empty folder (whatever was there is gone)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class Written:
    """The size and sha256 of every file a save wrote, by name, learnt while writing them.

    Thread-safe: DCP writes its shards from several threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, str]] = {}

    def record(self, path: str | os.PathLike, size: int, sha256: str) -> None:
        with self._lock:
            self._files[os.path.basename(path)] = (size, sha256)

    def rename(self, old: str | os.PathLike, new: str | os.PathLike) -> None:
        with self._lock:
            found = self._files.pop(os.path.basename(old), None)
            if found is not None:
                self._files[os.path.basename(new)] = found

    def get(self, name: str) -> tuple[int, str] | None:
        """``(size, sha256)`` of the file ``name`` as written, or None if it was not seen."""
        with self._lock:
            return self._files.get(name)


class _HashingStream(io.RawIOBase):
    """A write-only file that hashes and counts what goes through it, recording both on close.

    It cannot seek: a checksum taken while writing holds only for bytes written once, in order.
    """

    def __init__(self, raw: BinaryIO, path: str | os.PathLike, written: Written):
        super().__init__()
        self._raw, self._path, self._written = raw, path, written
        self._digest = hashlib.sha256()
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: ReadableBuffer) -> int:
        view = memoryview(b).cast("B")
        count = self._raw.write(view)
        self._digest.update(view[:count])
        self._size += count
        return count

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if self.closed:
            return
        super().close()  # flushes first
        self._raw.close()
        self._written.record(self._path, self._size, self._digest.hexdigest())


@contextmanager
def hashing_open(path: str | os.PathLike, written: Written) -> Iterator[_HashingStream]:
    """``path`` opened for writing anew; its size and sha256 land in ``written`` when it closes."""
    stream = _HashingStream(open(path, "wb"), path, written)  # noqa: SIM115 - closed just below
    try:
        yield stream
    finally:
        stream.close()


class _HashingFileSystem(FileSystem):
    """DCP's local filesystem, with every file it writes checksummed on the way out."""

    def __init__(self, written: Written):
        super().__init__()
        self.written = written

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if mode.startswith("r") and "+" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        if mode != "wb":  # an append or an update would leave the checksum of a part
            raise ValueError(f"a checkpoint file is written whole (mode 'wb'), not opened with mode {mode!r}")
        with hashing_open(path, self.written) as stream:
            yield stream

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)  # .metadata is written as .metadata.tmp, then renamed
        self.written.rename(path, new_path)


def hashing_writer(folder: Path, written: Written, **options: Any) -> dcp.FileSystemWriter:
    """DCP's writer into ``folder``, recording each file's size and sha256 in ``written``.

    :param options: passed on to ``dcp.FileSystemWriter`` (``thread_count``, ...).
    """
    writer = dcp.FileSystemWriter(folder, **options)
    writer.fs = _HashingFileSystem(written)
    return writer


def local_root(run_uri: str, rank: int) -> Path:
    """This rank's node-local folder for one run's checkpoint files (staging and downloads).

    Rank-specific: ranks sharing a node must not clobber each other's files.
    """
    return cache_dir() / "checkpoints" / hashlib.sha256(run_uri.encode()).hexdigest()[:16] / f"rank{rank}"


def per_rank_file(rank: int) -> str:
    """The name of the file that holds ``rank``'s per-rank states."""
    return f"extra_rank{rank}.pt"


def per_rank_state_dicts(saved: dict[str, Any]) -> dict[str, Any]:
    """The per-rank states of an ``extra_rank<r>.pt``, by state name.

    Checkpoints written before the states had names hold one flat dict (``step``, ``cursor``,
    ``rng``, ``scheduler``, ``scaler``, ``world_size``); they are read as the same states.
    """
    if "train_state" in saved:
        return saved
    named = {"train_state": {k: saved[k] for k in ("step", "cursor", "rng")}, "scheduler": saved["scheduler"]}
    if saved.get("scaler"):
        named["scaler"] = saved["scaler"]
    return named


def file_uri(layout: RunLayout, step: int, marker: dict[str, Any], name: str) -> str:
    """Where a file listed by ``step``'s ``_COMMITTED`` is stored."""
    return join(layout.checkpoint(step), commit.files_dir(marker), name)


def checked_marker(
    storage: Storage,
    layout: RunLayout,
    step: int,
    listed: bool = True,
    fence: list[FenceEntry] | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """``(marker, problem)`` for the checkpoint at ``step``: problem is None when it can be trusted.

    :param listed: whether a listing showed a ``_COMMITTED`` (False: it is not fetched).
    :param fence: the run's fence (from ``latest.json``); a marker it voids is refused.
    """
    marker: object = None
    if listed:
        try:
            marker = json.loads(storage.get(layout.committed_marker(step)))
        except NotFound:
            marker = None
        except ValueError:
            return None, "_COMMITTED is not valid JSON"
    found = marker if isinstance(marker, dict) else None
    if listed and marker is not None and found is None:
        return None, f"_COMMITTED is not a {commit.MARKER_FORMAT} document"
    shape = commit.marker_problem(found, None, step)
    if shape is not None or found is None:
        return found, shape
    void = void_reason(fence or [], marker_attempt(found), step)
    if void is not None:
        return found, void
    sizes: dict[str, int | None] = {}
    for entry in found["files"]:
        head = storage.head(file_uri(layout, step, found, entry["name"]))
        sizes[entry["name"]] = head["size"] if head else None
    return found, commit.marker_problem(found, sizes, step)


@dataclass(frozen=True)
class Survey:
    """What a run's ``checkpoints/`` holds, newest first.

    :param picked: the newest trustworthy checkpoint as ``(step, marker)``, or None.
    :param refused: every newer checkpoint that was passed over, as ``(step, why)``.
    :param ever_committed: a checkpoint was committed here once (a ``_COMMITTED`` that the
        fence does not void, or ``latest.json`` naming a step): a run with none to resume from
        must then not start over from step 0.
    """

    picked: tuple[int, dict[str, Any]] | None
    refused: tuple[tuple[int, str], ...]
    ever_committed: bool


def survey(storage: Storage, layout: RunLayout, corrupt: Mapping[int, str] | None = None) -> Survey:
    """Pick the newest trustworthy checkpoint; the log names it and why each newer one was skipped.

    :param corrupt: steps already found bad (a checksum failed on download), with the reason.
    """
    corrupt = corrupt or {}
    latest, _ = read_latest(storage, layout)
    fence = fence_of(latest)
    by_step = commit.group_by_step(storage.list(layout.checkpoints), layout.checkpoints)
    refused: list[tuple[int, str]] = []
    picked = None
    ever = bool(latest and latest["step"] > 0)
    for step in commit.newest_first(by_step):
        listed = commit.COMMITTED in by_step[step]
        if step in corrupt:
            refused.append((step, corrupt[step]))
            ever = True
            continue
        marker, problem = checked_marker(storage, layout, step, listed=listed, fence=fence)
        voided = marker is not None and void_reason(fence, marker_attempt(marker), step) is not None
        ever = ever or (listed and not voided)
        if problem is None and marker is not None:
            picked = step, marker
            break
        refused.append((step, problem or "no _COMMITTED marker"))
    for old_step, reason in refused:
        log.warning("checkpoint: skipped step %d: %s", old_step, reason)
    if picked is not None:
        log.info("checkpoint: picked step %d at %s", picked[0], layout.checkpoint(picked[0]))
    return Survey(picked, tuple(refused), ever)


def find_latest(storage: Storage, layout: RunLayout) -> tuple[int, dict[str, Any]] | None:
    """The newest trustworthy checkpoint as ``(step, marker)``; None when there is none."""
    return survey(storage, layout).picked


def nothing_to_resume(layout: RunLayout, found: Survey) -> str:
    """The error of an attempt that finds committed checkpoints but none it can resume from."""
    reasons = "; ".join(f"step {step}: {why}" for step, why in found.refused) or (
        "latest.json names a committed step, but no step folder holds a _COMMITTED"
    )
    return (
        f"checkpoints were committed under {layout.checkpoints} but none can be resumed ({reasons}); "
        "refusing to start over from step 0: restore the damaged files, delete the _COMMITTED of each "
        "bad checkpoint to fall back to an older one (delete them all, and latest.json, to start from "
        "step 0), or start the run under a new run prefix"
    )


def download(storage: Storage, layout: RunLayout, step: int, marker: dict[str, Any], root: Path) -> Path:
    """Fetch every file of the committed checkpoint into ``root/load/step_<N>``, checksummed.

    For a single process (``trainer export``, ``trainer evaluate``); each file's sha256 is taken
    as it arrives. The training ranks fetch through the node cache instead (:func:`fetch_listed`).
    """
    local = fresh_dir(root / "load" / f"step_{step:08d}")
    for entry in marker["files"]:
        uri = file_uri(layout, step, marker, entry["name"])
        _size, got = storage.download_file_hashed(uri, local / entry["name"])
        if got != entry["sha256"]:
            raise CorruptCheckpoint(_corrupt(uri, f"has sha256 {got}, _COMMITTED says {entry['sha256']}"))
    return local


def _corrupt(uri: str, what: str) -> str:
    return (
        f"checkpoint file {uri} {what}; the checkpoint is corrupt: delete its _COMMITTED to fall back "
        "to an older one"
    )


def node_dir(run_uri: str, step: int, marker: dict[str, Any]) -> Path:
    """The node's folder for the files of checkpoint ``step`` while it is loaded: one for all the
    ranks of the node (``trainer.checkpoint.node_cache``), keyed by run, step and the attempt that wrote it."""
    run = hashlib.sha256(run_uri.encode()).hexdigest()[:16]
    return (
        cache_dir() / "checkpoints" / run / "node" / f"step_{step:08d}" / (commit.files_dir(marker) or "step")
    )


def listed(marker: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``_COMMITTED`` entry of the file ``name``, or None when the checkpoint has no such file."""
    return next((entry for entry in marker["files"] if entry["name"] == name), None)


def fetch_listed(
    storage: Storage, layout: RunLayout, step: int, marker: dict[str, Any], name: str, folder: Path
) -> bool:
    """Make ``folder/name`` hold the listed file of checkpoint ``step``, verified against the size
    and sha256 in its ``_COMMITTED``, fetching it only if no rank of this node did; True when
    this call downloaded it.

    Raises CorruptCheckpoint when storage holds other bytes, or when the file is not listed.
    """
    uri = file_uri(layout, step, marker, name)
    entry = listed(marker, name)
    if entry is None:
        raise CorruptCheckpoint(_corrupt(uri, "is not listed in _COMMITTED, yet the checkpoint needs it"))
    try:
        return node_cache.fetch(storage, uri, folder / name, sha256=entry["sha256"], size=entry["size"])
    except node_cache.Mismatch as bad:
        if bad.size != entry["size"]:
            raise CorruptCheckpoint(
                _corrupt(uri, f"has {bad.size} bytes, _COMMITTED says {entry['size']}")
            ) from None
        raise CorruptCheckpoint(
            _corrupt(uri, f"has sha256 {bad.sha256}, _COMMITTED says {entry['sha256']}")
        ) from None


def load_model_weights(local_dir: Path, model: nn.Module) -> None:
    """Fill a plain (unsharded) model from a downloaded DCP checkpoint, in a single process."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        # DCP warns that it found no process group; a single process is exactly what we mean.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=dcp.FileSystemReader(local_dir), no_dist=True)
    model.load_state_dict(state["model"])
