"""The storage interface both halves share: errors, the ``Storage`` base and local helpers.

Standard library only: imported at DAG-parse time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Iterator

_CHUNK = 1024 * 1024
_PART_SIZE = 8 * 1024 * 1024
_UPLOAD_WORKERS = 4


class StorageError(Exception):
    """A storage operation failed."""


class NotFound(StorageError, FileNotFoundError):
    """The object does not exist."""


class PreconditionFailed(StorageError):
    """A conditional write lost the race (the object exists, or its etag changed)."""


class StorageUnavailable(StorageError, ConnectionError):
    """Storage kept failing (throttled, unreachable, resetting, timing out) for longer than the
    client's outage tolerance: an infrastructure failure, not the caller's."""


# The metadata key (``x-amz-meta-trainops-write-token`` on S3, the extended attribute
# ``user.trainops-write-token`` on file://) holding the token of the write that made an object.
WRITE_TOKEN_KEY = "trainops-write-token"


def new_write_token() -> str:
    """A token unique to one write, so that the writer can recognise its own object on read-back."""
    return uuid.uuid4().hex


def _md5() -> hashlib._Hash:
    return hashlib.md5(usedforsecurity=False)


def _md5_hex(data: bytes) -> str:
    digest = _md5()
    digest.update(data)
    return digest.hexdigest()


def _check_conditions(uri: str, if_none_match: bool, if_match: str | None) -> None:
    if if_none_match and if_match is not None:
        raise ValueError(f"put of {uri!r} got both if_none_match and if_match={if_match!r}: pass only one")


def _unsupported(uri: str) -> StorageError:
    return StorageError(f"unsupported storage URI {uri!r}: use file:///abs/path or s3://bucket/prefix")


class Storage:
    """Common helpers; subclasses implement the primitive operations."""

    scheme = ""

    def put(self, uri: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        """Store ``data`` at ``uri``; its etag.

        :param if_none_match: create only: PreconditionFailed if an object is there already.
        :param if_match: compare-and-swap: PreconditionFailed unless the object has this etag.

        A conditional write that returns took effect, and one that raises PreconditionFailed
        did not: the object there is someone else's. Each carries a fresh write token, so a
        retry that finds the write already done (its first reply lost) reports it as done.
        """
        raise NotImplementedError

    def get(self, uri: str) -> bytes:
        return self.get_with_etag(uri)[0]

    def get_with_etag(self, uri: str) -> tuple[bytes, str]:
        raise NotImplementedError

    def put_json(self, uri: str, obj: object, **conditions: object) -> str:
        data = json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"
        return self.put(uri, data, **conditions)  # type: ignore[arg-type]

    def get_json(self, uri: str) -> object:
        data = self.get(uri)
        try:
            return json.loads(data)
        except ValueError as exc:
            raise StorageError(f"object {uri!r} is not valid JSON ({exc}): rewrite it or delete it") from exc

    def head(self, uri: str) -> dict | None:
        """``{"size", "etag", "mtime", "write_token"}`` of the object, or None when there is none.

        The etag is the one ``put`` returned and ``get_with_etag`` gives; it changes whenever
        the content does. It costs no read of the content on S3, nor on ``file://`` for files
        this client wrote (``trainer.storage.file``).

        ``write_token`` is the token of the conditional write (or multipart upload) that made
        the object, None for other writes and where the backend cannot keep one.
        """
        raise NotImplementedError

    def exists(self, uri: str) -> bool:
        return self.head(uri) is not None

    def list(self, prefix_uri: str) -> list[str]:
        raise NotImplementedError

    def delete(self, uri: str) -> None:
        raise NotImplementedError

    def delete_prefix(self, prefix_uri: str) -> int:
        raise NotImplementedError

    def upload_file(self, local_path: str | os.PathLike, uri: str, *, move: bool = False) -> str:
        """Store a local file at ``uri``; its etag.

        :param move: the caller hands the file over (it is gone afterwards). On ``file://`` and
            the same filesystem it is then renamed into place instead of copied: a checkpoint's
            shards are written once, not twice.
        """
        raise NotImplementedError

    def download_file(self, uri: str, local_path: str | os.PathLike) -> None:
        raise NotImplementedError

    def download_file_hashed(self, uri: str, local_path: str | os.PathLike) -> tuple[int, str]:
        """Download like :meth:`download_file`; the file's ``(size, sha256)``.

        ``file://`` and ``s3://`` take both from the bytes as they arrive, so the file is not
        read again to checksum it; this fallback (for other subclasses) reads it once.
        """
        self.download_file(uri, local_path)
        return os.path.getsize(local_path), sha256_file(local_path)

    def copy(self, src_uri: str, dst_uri: str) -> None:
        raise NotImplementedError


class _Tally:
    """The size and sha256 of the chunks passed through :meth:`counted`."""

    def __init__(self) -> None:
        self.size, self._digest = 0, hashlib.sha256()

    def counted(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            self._digest.update(chunk)
            self.size += len(chunk)
            yield chunk

    @property
    def result(self) -> tuple[int, str]:
        return self.size, self._digest.hexdigest()


def _write_local(dst: str, chunks: Iterator[bytes]) -> None:
    """Write a local file atomically: temp file beside it, then rename."""
    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(dst)}.tmp-{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 of a local file, read in chunks (checkpoint markers and dataset shards use it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
