"""``file://`` storage: the embedded default. Atomic writes, and conditional writes made
atomic with hard links (create-only) and ``flock`` (compare-and-swap).

A local write has no reply to lose: the system call that commits it either did or raised, so
what ``put`` reports is what happened, with no read-back. The write token of a conditional
write is still kept, as the extended attribute ``user.trainops-write-token`` set on the file
before it is linked or renamed into place (so it arrives with the content, atomically), and
``head`` returns it as on S3. Filesystems without user extended attributes keep no token
(``write_token`` is None); nothing depends on it here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import uuid
from collections.abc import Iterator

from trainer.storage.base import (
    _CHUNK,
    WRITE_TOKEN_KEY,
    NotFound,
    PreconditionFailed,
    Storage,
    StorageError,
    _check_conditions,
    _md5,
    _md5_hex,
    _unsupported,
    _write_local,
    new_write_token,
)

_TMP_RE = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")
_LOCK_SUFFIX = ".trainops-lock"
_TOKEN_XATTR = f"user.{WRITE_TOKEN_KEY}"


def _file_path(uri: str) -> str:
    if not uri.startswith("file://"):
        raise _unsupported(uri)
    path = uri[len("file://") :]
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    if not path.startswith("/"):
        raise StorageError(f"file URI {uri!r} is not absolute: use an absolute path such as file:///abs/path")
    return os.path.normpath(path) if path != "/" else "/"


def _is_internal(name: str) -> bool:
    return name.endswith(_LOCK_SUFFIX) or bool(_TMP_RE.match(name))


def _set_token(path: str, token: str) -> None:
    setxattr = getattr(os, "setxattr", None)  # Linux only
    if setxattr is not None:
        with contextlib.suppress(OSError):  # no user xattrs on this filesystem: no token
            setxattr(path, _TOKEN_XATTR, token.encode())


def _token_of(path: str) -> str | None:
    getxattr = getattr(os, "getxattr", None)
    if getxattr is None:
        return None
    try:
        return getxattr(path, _TOKEN_XATTR).decode()
    except OSError:
        return None


def _fsync_dir(path: str) -> None:
    # Makes the rename durable; not every filesystem allows opening a directory.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class FileStorage(Storage):
    """Objects are files under absolute paths; writes are atomic renames."""

    scheme = "file"

    def _tmp_path(self, path: str) -> str:
        head, name = os.path.split(path)
        return os.path.join(head, f".{name}.tmp-{uuid.uuid4().hex}")

    def _write_tmp(self, path: str, chunks: Iterator[bytes]) -> tuple[str, str]:
        """Write chunks to a fresh temp file beside ``path``; return (tmp path, md5 hex)."""
        digest = _md5()
        # A concurrent delete_prefix may remove the empty parent between makedirs and open.
        for attempt in range(5):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = self._tmp_path(path)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileNotFoundError:
                if attempt == 4:
                    raise
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp, digest.hexdigest()

    @contextlib.contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        """Hold an exclusive lock beside ``path``, valid across processes.

        The lock file may be unlinked by ``delete`` (while holding it); a waiter that
        wakes on an unlinked inode retries, so two holders can never coexist.
        """
        head, name = os.path.split(path)
        lock_path = os.path.join(head, f".{name}{_LOCK_SUFFIX}")
        while True:
            os.makedirs(head, exist_ok=True)
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    try:
                        yield
                    finally:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    return
            finally:
                os.close(fd)

    def _unlink_lock(self, path: str) -> None:
        head, name = os.path.split(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(head, f".{name}{_LOCK_SUFFIX}"))

    def _commit(self, tmp: str, path: str, if_none_match: bool, if_match: str | None, uri: str) -> None:
        try:
            if if_none_match:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise PreconditionFailed(
                        f"object {uri!r} already exists: read it instead of creating it"
                    ) from None
            elif if_match is not None:
                with self._locked(path):
                    current = self._etag_of(path)
                    if current is None:
                        raise PreconditionFailed(
                            f"object {uri!r} does not exist, so etag {if_match!r} cannot match: "
                            "re-read it and retry"
                        )
                    if current != if_match:
                        raise PreconditionFailed(
                            f"object {uri!r} has etag {current!r}, not {if_match!r}: re-read it and retry"
                        )
                    os.replace(tmp, path)
            else:
                os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(os.path.dirname(path))

    def _etag_of(self, path: str) -> str | None:
        try:
            with open(path, "rb") as f:
                digest = _md5()
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
                return digest.hexdigest()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def put(self, uri: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        path = _file_path(uri)
        _check_conditions(uri, if_none_match, if_match)
        tmp, etag = self._write_tmp(path, iter([bytes(data)]))
        if if_none_match or if_match is not None:
            _set_token(tmp, new_write_token())
        self._commit(tmp, path, if_none_match, if_match, uri)
        return etag

    def get_with_etag(self, uri: str) -> tuple[bytes, str]:
        path = _file_path(uri)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {uri!r}") from None
        return data, _md5_hex(data)

    def head(self, uri: str) -> dict | None:
        path = _file_path(uri)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(path):
            return None
        etag = self._etag_of(path)
        if etag is None:
            return None
        return {"size": st.st_size, "etag": etag, "mtime": st.st_mtime, "write_token": _token_of(path)}

    def _walk(self, prefix_uri: str) -> list[str]:
        root = _file_path(prefix_uri)
        found = []
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if not _is_internal(name):
                    found.append(os.path.join(dirpath, name))
        return found

    def list(self, prefix_uri: str) -> list[str]:
        return sorted("file://" + p for p in self._walk(prefix_uri))

    def delete(self, uri: str) -> None:
        path = _file_path(uri)
        if not os.path.lexists(os.path.dirname(path)):
            return
        with self._locked(path):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(path)
            self._unlink_lock(path)

    def delete_prefix(self, prefix_uri: str) -> int:
        root = _file_path(prefix_uri)
        count = 0
        for path in self._walk(prefix_uri):
            if os.path.lexists(path):
                self.delete("file://" + path)
                count += 1
        # Empty folders are invisible to list(); removing them keeps the tree tidy.
        for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        return count

    def upload_file(self, local_path: str | os.PathLike, uri: str, *, move: bool = False) -> str:
        path = _file_path(uri)
        if move:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = self._tmp_path(path)
            try:
                os.rename(local_path, tmp)  # same filesystem: no second copy of the bytes
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
            else:
                with open(tmp, "rb+") as f:
                    digest = _md5()
                    for chunk in iter(lambda: f.read(_CHUNK), b""):
                        digest.update(chunk)
                    os.fsync(f.fileno())
                self._commit(tmp, path, False, None, uri)
                return digest.hexdigest()
        with open(local_path, "rb") as src:
            tmp, etag = self._write_tmp(path, iter(lambda: src.read(_CHUNK), b""))
        self._commit(tmp, path, False, None, uri)
        if move:
            os.unlink(local_path)
        return etag

    def download_file(self, uri: str, local_path: str | os.PathLike) -> None:
        src = _file_path(uri)
        dst = os.fspath(local_path)
        try:
            f = open(src, "rb")  # noqa: SIM115 - "with" below, once NotFound is told apart
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {uri!r}") from None
        with f:
            _write_local(dst, iter(lambda: f.read(_CHUNK), b""))

    def copy(self, src_uri: str, dst_uri: str) -> None:
        src = _file_path(src_uri)
        dst = _file_path(dst_uri)
        try:
            f = open(src, "rb")  # noqa: SIM115 - "with" below, once NotFound is told apart
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {src_uri!r}") from None
        with f:
            tmp, _etag = self._write_tmp(dst, iter(lambda: f.read(_CHUNK), b""))
        self._commit(tmp, dst, False, None, dst_uri)
