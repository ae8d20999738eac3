"""One storage interface for both halves: ``file://`` (the embedded default) and ``s3://``.

Methods take full URIs. Conditional writes (``if_none_match`` / ``if_match``) are the
only coordination primitive the project uses, so both backends make them atomic.
Imported at DAG-parse time: standard library only at module top; boto3 is imported
inside :class:`S3Storage`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
import uuid
from collections.abc import Iterator

__all__ = [
    "FileStorage",
    "NotFound",
    "PreconditionFailed",
    "S3Storage",
    "Storage",
    "StorageError",
    "open_storage",
]

_CHUNK = 1024 * 1024
_PART_SIZE = 8 * 1024 * 1024
_UPLOAD_WORKERS = 4


class StorageError(Exception):
    """A storage operation failed."""


class NotFound(StorageError, FileNotFoundError):
    """The object does not exist."""


class PreconditionFailed(StorageError):
    """A conditional write lost the race (the object exists, or its etag changed)."""


def _md5() -> hashlib._Hash:
    return hashlib.md5(usedforsecurity=False)


def _check_conditions(uri: str, if_none_match: bool, if_match: str | None) -> None:
    if if_none_match and if_match is not None:
        raise ValueError(
            f"put of {uri!r} got both if_none_match and if_match={if_match!r}: pass only one"
        )


def _unsupported(uri: str) -> StorageError:
    return StorageError(
        f"unsupported storage URI {uri!r}: use file:///abs/path or s3://bucket/prefix"
    )


class Storage:
    """Common helpers; subclasses implement the primitive operations."""

    scheme = ""

    def put(
        self, uri: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
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
            raise StorageError(
                f"object {uri!r} is not valid JSON ({exc}): rewrite it or delete it"
            ) from exc

    def head(self, uri: str) -> dict | None:
        raise NotImplementedError

    def exists(self, uri: str) -> bool:
        return self.head(uri) is not None

    def list(self, prefix_uri: str) -> list[str]:
        raise NotImplementedError

    def delete(self, uri: str) -> None:
        raise NotImplementedError

    def delete_prefix(self, prefix_uri: str) -> int:
        raise NotImplementedError

    def upload_file(self, local_path: str | os.PathLike, uri: str) -> str:
        raise NotImplementedError

    def download_file(self, uri: str, local_path: str | os.PathLike) -> None:
        raise NotImplementedError

    def copy(self, src_uri: str, dst_uri: str) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- file://

_TMP_RE = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")
_LOCK_SUFFIX = ".trainops-lock"


def _file_path(uri: str) -> str:
    if not uri.startswith("file://"):
        raise _unsupported(uri)
    path = uri[len("file://") :]
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    if not path.startswith("/"):
        raise StorageError(
            f"file URI {uri!r} is not absolute: use an absolute path such as file:///abs/path"
        )
    return os.path.normpath(path) if path != "/" else "/"


def _is_internal(name: str) -> bool:
    return name.endswith(_LOCK_SUFFIX) or bool(_TMP_RE.match(name))


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

    def _commit(
        self, tmp: str, path: str, if_none_match: bool, if_match: str | None, uri: str
    ) -> None:
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
                            f"object {uri!r} has etag {current!r}, not {if_match!r}: "
                            "re-read it and retry"
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

    def put(
        self, uri: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        path = _file_path(uri)
        _check_conditions(uri, if_none_match, if_match)
        tmp, etag = self._write_tmp(path, iter([bytes(data)]))
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
        return {"size": st.st_size, "etag": etag, "mtime": st.st_mtime}

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

    def upload_file(self, local_path: str | os.PathLike, uri: str) -> str:
        path = _file_path(uri)
        with open(local_path, "rb") as src:
            tmp, etag = self._write_tmp(path, iter(lambda: src.read(_CHUNK), b""))
        self._commit(tmp, path, False, None, uri)
        return etag

    def download_file(self, uri: str, local_path: str | os.PathLike) -> None:
        src = _file_path(uri)
        dst = os.fspath(local_path)
        try:
            f = open(src, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {uri!r}") from None
        with f:
            _write_local(dst, iter(lambda: f.read(_CHUNK), b""))

    def copy(self, src_uri: str, dst_uri: str) -> None:
        src = _file_path(src_uri)
        dst = _file_path(dst_uri)
        try:
            f = open(src, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at {src_uri!r}") from None
        with f:
            tmp, etag = self._write_tmp(dst, iter(lambda: f.read(_CHUNK), b""))
        self._commit(tmp, dst, False, None, dst_uri)


def _md5_hex(data: bytes) -> str:
    digest = _md5()
    digest.update(data)
    return digest.hexdigest()


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


# --------------------------------------------------------------------------- s3://



def _split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise _unsupported(uri)
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise StorageError(f"S3 URI {uri!r} has no bucket: use s3://bucket/prefix")
    return bucket, key


def _folder(key: str) -> str:
    return key if not key or key.endswith("/") else key + "/"


def _strip_etag(etag: str) -> str:
    return etag.strip('"')


class S3Storage(Storage):
    """Objects in S3 or an S3-compatible store (MinIO, Ceph) through one boto3 client."""

    scheme = "s3"

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.endpoint_url = endpoint_url
        self.region = region or "us-east-1"
        s3_options = {"addressing_style": "path"} if endpoint_url else {}
        config = Config(
            retries={"max_attempts": 10, "mode": "adaptive"},
            max_pool_connections=32,
            s3=s3_options,
        )
        # A private session: the default session is not thread-safe to create clients from.
        session = boto3.session.Session()
        self._client = session.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=self.region,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            config=config,
        )

    def __repr__(self) -> str:
        return f"S3Storage(endpoint_url={self.endpoint_url!r}, region={self.region!r})"

    def _error(self, exc: Exception, uri: str, action: str) -> StorageError:
        code, status = _error_code(exc)
        if code in ("NoSuchKey", "404", "NotFound"):
            return NotFound(f"no object at {uri!r}")
        if code == "NoSuchBucket":
            return StorageError(f"the bucket of {uri!r} does not exist: create it or fix the storage root")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            return PreconditionFailed(f"conditional {action} of {uri!r} lost: re-read it and retry")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return StorageError(
                f"access denied to {uri!r} ({code}) during {action}: check the credentials "
                "and the bucket policy"
            )
        return StorageError(f"{action} of {uri!r} failed: {exc}")

    def put(
        self, uri: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        bucket, key = _split_s3(uri)
        _check_conditions(uri, if_none_match, if_match)
        kwargs: dict = {"Bucket": bucket, "Key": key, "Body": bytes(data)}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = f'"{_strip_etag(if_match)}"'
        try:
            response = self._client.put_object(**kwargs)
        except Exception as exc:
            err = self._error(exc, uri, "write")
            if isinstance(err, NotFound) and if_match is not None:
                raise PreconditionFailed(
                    f"object {uri!r} does not exist, so etag {if_match!r} cannot match: "
                    "re-read it and retry"
                ) from None
            raise err from exc
        return _strip_etag(response["ETag"])

    def get_with_etag(self, uri: str) -> tuple[bytes, str]:
        bucket, key = _split_s3(uri)
        try:
            response = self._client.get_object(Bucket=bucket, Key=key)
            data = response["Body"].read()
        except Exception as exc:
            raise self._error(exc, uri, "read") from exc
        return data, _strip_etag(response["ETag"])

    def head(self, uri: str) -> dict | None:
        bucket, key = _split_s3(uri)
        try:
            response = self._client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            err = self._error(exc, uri, "head")
            if isinstance(err, NotFound):
                return None
            raise err from exc
        return {
            "size": int(response["ContentLength"]),
            "etag": _strip_etag(response["ETag"]),
            "mtime": response["LastModified"].timestamp(),
        }

    def _keys(self, prefix_uri: str) -> tuple[str, list[str]]:
        bucket, key = _split_s3(prefix_uri)
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=_folder(key)
            )
            for page in pages:
                keys.extend(item["Key"] for item in page.get("Contents", []))
        except Exception as exc:
            raise self._error(exc, prefix_uri, "list") from exc
        return bucket, keys

    def list(self, prefix_uri: str) -> list[str]:
        bucket, keys = self._keys(prefix_uri)
        return sorted(f"s3://{bucket}/{k}" for k in keys)

    def delete(self, uri: str) -> None:
        bucket, key = _split_s3(uri)
        try:
            self._client.delete_object(Bucket=bucket, Key=key)
        except Exception as exc:
            err = self._error(exc, uri, "delete")
            if not isinstance(err, NotFound):
                raise err from exc

    def delete_prefix(self, prefix_uri: str) -> int:
        bucket, keys = self._keys(prefix_uri)
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            try:
                response = self._client.delete_objects(
                    Bucket=bucket, Delete={"Objects": batch, "Quiet": True}
                )
            except Exception as exc:
                raise self._error(exc, prefix_uri, "delete") from exc
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"could not delete {len(errors)} objects under {prefix_uri!r}, first "
                    f"s3://{bucket}/{first.get('Key')} ({first.get('Code')}): check permissions"
                )
        return len(keys)

    def upload_file(self, local_path: str | os.PathLike, uri: str) -> str:
        bucket, key = _split_s3(uri)
        size = os.path.getsize(local_path)
        if size < _PART_SIZE:
            with open(local_path, "rb") as f:
                return self.put(uri, f.read())
        return self._multipart(os.fspath(local_path), size, bucket, key, uri)

    def _multipart(self, local_path: str, size: int, bucket: str, key: str, uri: str) -> str:
        from concurrent.futures import ThreadPoolExecutor

        try:
            upload_id = self._client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        except Exception as exc:
            raise self._error(exc, uri, "upload") from exc

        def send(number: int) -> dict:
            # Each worker reads its own slice so at most a few parts sit in memory.
            with open(local_path, "rb") as f:
                f.seek((number - 1) * _PART_SIZE)
                body = f.read(_PART_SIZE)
            response = self._client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            )
            return {"PartNumber": number, "ETag": response["ETag"]}

        count = (size + _PART_SIZE - 1) // _PART_SIZE
        try:
            with ThreadPoolExecutor(max_workers=_UPLOAD_WORKERS) as pool:
                parts = list(pool.map(send, range(1, count + 1)))
            response = self._client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            if isinstance(exc, Exception):
                raise self._error(exc, uri, "upload") from exc
            raise
        return _strip_etag(response["ETag"])

    def download_file(self, uri: str, local_path: str | os.PathLike) -> None:
        bucket, key = _split_s3(uri)
        try:
            body = self._client.get_object(Bucket=bucket, Key=key)["Body"]
            _write_local(os.fspath(local_path), body.iter_chunks(_CHUNK))
        except Exception as exc:
            raise self._error(exc, uri, "download") from exc

    def copy(self, src_uri: str, dst_uri: str) -> None:
        src_bucket, src_key = _split_s3(src_uri)
        dst_bucket, dst_key = _split_s3(dst_uri)
        try:
            # The managed copy switches to multipart copy above 5 GiB.
            self._client.copy({"Bucket": src_bucket, "Key": src_key}, dst_bucket, dst_key)
        except Exception as exc:
            err = self._error(exc, src_uri, "copy")
            if isinstance(err, NotFound):
                raise err from exc
            raise self._error(exc, dst_uri, "copy") from exc


def _error_code(exc: Exception) -> tuple[str, int | None]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status


# --------------------------------------------------------------------------- factory

_cache: dict[tuple, Storage] = {}
_cache_lock = threading.Lock()


def open_storage(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    aws_access_key_id: str | None = None,
    aws_secret_access_key: str | None = None,
    aws_session_token: str | None = None,
) -> Storage:
    """Return the (cached, thread-safe) client for ``uri``'s scheme and options."""
    if uri.startswith("file://"):
        _file_path(uri)
        key: tuple = ("file",)
        factory = FileStorage
    elif uri.startswith("s3://"):
        if not uri[len("s3://") :].split("/", 1)[0]:
            raise StorageError(f"S3 URI {uri!r} has no bucket: use s3://bucket/prefix")
        endpoint_url = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )
        region = (
            region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        ) or "us-east-1"
        creds = (aws_access_key_id, aws_secret_access_key, aws_session_token)
        # With no explicit keys boto3 reads the environment when the client is built,
        # so a changed environment must give a new client.
        env = tuple(
            os.environ.get(k)
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
        )
        key = ("s3", endpoint_url, region, creds, env if not any(creds) else None)

        def factory() -> Storage:
            return S3Storage(
                endpoint_url=endpoint_url,
                region=region,
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                aws_session_token=aws_session_token,
            )
    else:
        raise _unsupported(uri)
    with _cache_lock:
        client = _cache.get(key)
        if client is None:
            client = _cache[key] = factory()
        return client
