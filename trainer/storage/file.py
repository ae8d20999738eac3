"""``file://`` storage: the embedded default. Atomic writes, and conditional writes made
atomic with hard links (create-only) and ``flock`` (compare-and-swap).

A local write has no reply to lose: the system call that commits it either did or raised, so
what ``put`` reports is what happened, with no read-back. The write token of a conditional
write is still kept, as the extended attribute ``user.trainops-write-token`` set on the file
before it is linked or renamed into place (so it arrives with the content, atomically), and
``head`` returns it as on S3. Filesystems without user extended attributes keep no token
(``write_token`` is None); nothing depends on it here.

Etags cost no read of the content for files this client wrote: each write records the etag
with the file, as the extended attribute ``user.trainops-etag`` (``<etag> <size> <mtime_ns>``),
set on the temp file before it is moved into place. The etag is the content's md5, computed
while the bytes are written (so, as on S3, it changes whenever the content does, and equal
content has equal etags), or, for a file handed over with ``upload_file(move=True)`` (renamed
in, never read), a random stamp that no other write has. ``head`` and ``get_with_etag`` trust
the record while the file still has the size and ``mtime_ns`` it recorded (every write sets
``mtime_ns`` from the fine-grained clock, so a later change by another program does not share
it); otherwise (a file written by another program or an older version, one changed in place
since, a filesystem without user extended attributes) the etag is the content's md5, read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import time
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
    _Tally,
    _unsupported,
    _write_local,
    new_write_token,
)

_TMP_RE = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")
_LOCK_SUFFIX = ".trainops-lock"
_TOKEN_XATTR = f"user.{WRITE_TOKEN_KEY}"
_ETAG_XATTR = "user.trainops-etag"
_MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


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


def _token_of(path: str | int) -> str | None:
    getxattr = getattr(os, "getxattr", None)
    if getxattr is None:
        return None
    try:
        return getxattr(path, _TOKEN_XATTR).decode()
    except OSError:
        return None


def _recorded_etag(fd: int, st: os.stat_result) -> str | None:
    """The etag recorded by this client's write of the file open at ``fd``, if it still holds
    (the file has the size and mtime_ns recorded with it); None otherwise."""
    getxattr = getattr(os, "getxattr", None)  # Linux only
    if getxattr is None:
        return None
    try:
        etag, size, mtime_ns = getxattr(fd, _ETAG_XATTR).decode().split(" ")
    except (OSError, ValueError):
        return None
    return etag if (size, mtime_ns) == (str(st.st_size), str(st.st_mtime_ns)) else None


def _record_etag(fd: int, etag: str) -> bool:
    """Record ``etag`` with the (temp) file open at ``fd``, for :func:`_recorded_etag`; False
    where the filesystem keeps no user extended attributes (its etags are then read).

    Sets its mtime from the fine-grained clock first, so that no later write by another program
    leaves the same mtime_ns behind.
    """
    now = time.time_ns()
    os.utime(fd, ns=(now, now))
    setxattr = getattr(os, "setxattr", None)
    if setxattr is None:
        return False
    st = os.fstat(fd)
    try:
        setxattr(fd, _ETAG_XATTR, f"{etag} {st.st_size} {st.st_mtime_ns}".encode())
    except OSError:
        return False
    return True


def _md5_of_fd(fd: int) -> str:
    digest = _md5()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, _CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _head_fd(fd: int) -> tuple[os.stat_result, str] | None:
    """``(stat, etag)`` of the regular file open at ``fd`` (one inode: no torn answer when a
    writer replaces the path meanwhile), or None for anything else. Reads the content only when
    no recorded etag holds."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return None
    return st, _recorded_etag(fd, st) or _md5_of_fd(fd)


def _open_for_head(path: str) -> int | None:
    """A read-only descriptor of ``path`` for :func:`_head_fd`, or None when nothing is there."""
    try:  # non-blocking: a FIFO must not hang a head(); a regular file ignores the flag
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except _MISSING:
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
        """Write chunks to a fresh temp file beside ``path``, its md5 (taken on the way) recorded
        as its etag; returns (temp path, etag)."""
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
                _record_etag(f.fileno(), digest.hexdigest())
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
        fd = _open_for_head(path)
        if fd is None:
            return None
        try:
            found = _head_fd(fd)
            return found[1] if found else None
        finally:
            os.close(fd)

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
                st = os.fstat(f.fileno())
                recorded = _recorded_etag(f.fileno(), st) if stat.S_ISREG(st.st_mode) else None
                data = f.read()
        except _MISSING:
            raise NotFound(f"no object at {uri!r}") from None
        return data, recorded or _md5_hex(data)  # the etag of the very bytes read

    def head(self, uri: str) -> dict | None:
        path = _file_path(uri)
        fd = _open_for_head(path)
        if fd is None:
            return None
        try:
            found = _head_fd(fd)
            if found is None:
                return None
            st, etag = found
            return {"size": st.st_size, "etag": etag, "mtime": st.st_mtime, "write_token": _token_of(fd)}
        finally:
            os.close(fd)

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
        # A write killed before its rename leaves its temp file, which list() never shows: a
        # prefix deleted whole takes those too, or they would keep their bytes and the folder.
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if _TMP_RE.match(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(dirpath, name))
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
                # Its bytes are not read again: its etag is a fresh stamp, not their md5.
                etag = f"s{uuid.uuid4().hex}"
                fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    if not _record_etag(fd, etag):  # nowhere to keep a stamp: the md5, read
                        etag = _md5_of_fd(fd)
                    os.fsync(fd)  # durable before it is in place
                finally:
                    os.close(fd)
                self._commit(tmp, path, False, None, uri)
                return etag
        with open(local_path, "rb") as src:
            tmp, etag = self._write_tmp(path, iter(lambda: src.read(_CHUNK), b""))
        self._commit(tmp, path, False, None, uri)
        if move:
            os.unlink(local_path)
        return etag

    def download_file(self, uri: str, local_path: str | os.PathLike) -> None:
        self.download_file_hashed(uri, local_path)

    def download_file_hashed(self, uri: str, local_path: str | os.PathLike) -> tuple[int, str]:
        src = _file_path(uri)
        dst = os.fspath(local_path)
        try:
            f = open(src, "rb")  # noqa: SIM115 - "with" below, once NotFound is told apart
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {uri!r}") from None
        tally = _Tally()
        with f:
            _write_local(dst, tally.counted(iter(lambda: f.read(_CHUNK), b"")))
        return tally.result

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
