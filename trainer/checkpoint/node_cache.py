"""Fetch once per node: a file from storage into the node's cache, verified, whichever rank asks first.

The ranks of one node share one cache folder (``trainer.data.cache_dir()``, one per node or
pod). :func:`fetch` makes ``path`` hold the object at ``uri`` with the wanted size and sha256
(or, where no checksum is known, such as a warm start's Hugging Face folder, the wanted size):

- a file already there with its sidecar (``.<name>.verified``: the size and sha256 it was
  verified with) that records the wanted checksum is used as it is: nothing is fetched;
- otherwise the caller takes an exclusive ``flock`` on ``.<name>.lock`` beside it (so ranks
  that ask at the same time wait for the first, then find the file verified), downloads into a
  temporary name (``.<name>.part-<pid>-<hex>``), takes the size and sha256 from the bytes as
  they arrive (``Storage.download_file_hashed``), and only when both match renames it into place
  and writes the sidecar.

No collective is needed, and a crash mid-download leaves only a temporary file, which the
next fetch of that name removes (it holds the lock, so no live process is writing it). The
caller keys ``path`` so that two runs or two checkpoints never share a name unless they share
the content (a checkpoint: run, step and attempt; a shard: its sha256).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from trainer.storage import Storage, sha256_file


class Mismatch(RuntimeError):
    """The object in storage is not the one wanted: its size or sha256 differs.

    :param uri: what was fetched; ``size``/``sha256``: what it had; ``want_*``: what was wanted.
    """

    def __init__(self, uri: str, size: int, sha256: str, want_size: int | None, want_sha256: str | None):
        self.uri, self.size, self.sha256 = uri, size, sha256
        self.want_size, self.want_sha256 = want_size, want_sha256
        if want_size is not None and size != want_size:
            what = f"has {size} bytes, {want_size} were wanted"
        else:
            what = f"has sha256 {sha256}, {want_sha256} was wanted"
        super().__init__(f"{uri} {what}")


def sidecar(path: Path) -> Path:
    """Where the size and sha256 that ``path`` was verified with are recorded."""
    return path.with_name(f".{path.name}.verified")


def lock_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.part-"


def is_verified(path: Path, sha256: str | None, size: int | None = None) -> bool:
    """Whether ``path`` holds content verified to have ``sha256`` (and ``size``), by its sidecar;
    ``sha256`` None: whatever content a completed fetch left (and ``size``). A file modified
    since it was verified (its mtime moved: written in place) is not."""
    try:
        record = json.loads(sidecar(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and (sha256 is None or record.get("sha256") == sha256)
        and record.get("size") == stat.st_size
        and record.get("mtime_ns", stat.st_mtime_ns) == stat.st_mtime_ns  # older sidecars have none
        and (size is None or size == stat.st_size)
    )


def record_verified(path: Path, size: int, sha256: str) -> None:
    """Record that ``path`` holds ``size`` bytes with ``sha256``, as learnt while it was written
    (a checkpoint file this node saved: the node-local tier), so that :func:`fetch` uses it."""
    _record(path, size, sha256)


def _record(path: Path, size: int, sha256: str) -> None:
    side = sidecar(path)
    tmp = side.with_name(f"{side.name}.tmp-{uuid.uuid4().hex}")
    tmp.write_text(json.dumps({"size": size, "sha256": sha256, "mtime_ns": path.stat().st_mtime_ns}))
    os.replace(tmp, side)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(lock_file(path), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
        yield
    finally:
        os.close(fd)


def fetch(storage: Storage, uri: str, path: Path, *, sha256: str | None, size: int | None = None) -> bool:
    """Make ``path`` hold the object at ``uri``, verified to have ``sha256`` (and ``size``).

    ``sha256`` None: no checksum is known, so only ``size`` is verified; the caller then keys
    ``path`` by what identifies the object's version (its size and etag), and a file found
    there without a sidecar is fetched again rather than adopted.

    True when this call downloaded it; False when the node had it already (fetched by another
    rank, or earlier). Raises :class:`Mismatch` when storage holds other bytes (nothing is left
    at ``path`` then), and the storage's own errors when the download fails.
    """
    if is_verified(path, sha256, size):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        if is_verified(path, sha256, size):  # another rank fetched it while we waited
            return False
        for stale in path.parent.glob(f"{_temp_prefix(path)}*"):  # a dead fetcher's; we hold the lock
            stale.unlink(missing_ok=True)
        if _adopt(path, sha256, size):
            return False
        tmp = path.with_name(f"{_temp_prefix(path)}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            got_size, got_sha = storage.download_file_hashed(uri, tmp)
            if (sha256 is not None and got_sha != sha256) or (size is not None and got_size != size):
                raise Mismatch(uri, got_size, got_sha, size, sha256)
            sidecar(path).unlink(missing_ok=True)  # never a sidecar beside other content
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        _record(path, got_size, got_sha)
        return True


def _adopt(path: Path, sha256: str | None, size: int | None) -> bool:
    """Whether a file at ``path`` with no (or another) sidecar already holds the wanted bytes.

    That is a file put there by an earlier version, which kept no sidecar, or one whose
    fetcher died between the rename and the sidecar: reading it once costs less than fetching
    it again. Anything else at ``path`` is removed.
    """
    try:
        on_disk = path.stat().st_size
    except FileNotFoundError:
        return False
    if sha256 is not None and (size is None or on_disk == size) and sha256_file(path) == sha256:
        _record(path, on_disk, sha256)
        return True
    sidecar(path).unlink(missing_ok=True)
    path.unlink()
    return False
