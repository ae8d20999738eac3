"""``s3://`` storage through boto3 (imported when a client is built, never at module top).
Conditional writes use If-None-Match / If-Match; large files go up in concurrent parts.

Every request goes through one :class:`~trainer.storage.retry.Retrier`: throttling, 5xx,
resets and timeouts are retried with back-off for up to the outage tolerance. botocore's own
retries are off (one attempt per call), so that every retry is counted, logged and bounded
in time, and so that the client knows which tries of a write were in doubt. A conditional
write (and a multipart upload) carries a write token in its metadata: when a retry ends in
412 (or the upload is gone), the object is read back, and if it carries the token the write
is reported as done (its first reply was lost after S3 performed it), not as lost.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from trainer.storage.base import (
    _CHUNK,
    _PART_SIZE,
    _UPLOAD_WORKERS,
    WRITE_TOKEN_KEY,
    NotFound,
    PreconditionFailed,
    Storage,
    StorageError,
    _check_conditions,
    _Tally,
    _unsupported,
    _write_local,
    new_write_token,
)
from trainer.storage.retry import DEFAULT_OUTAGE_TOLERANCE_S, Abandoned, Retrier

log = logging.getLogger("trainer.storage")

T = TypeVar("T")

_THROTTLED = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "BandwidthLimitExceeded",
}
_FLAKY = {"InternalError", "ServiceUnavailable", "RequestTimeout", "RequestTimeoutException"}


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


class _TransientResponse(StorageError):
    """A reply that succeeded as a whole but failed in part in a way a retry cures."""


def transient(exc: BaseException) -> str | None:
    """What ``exc`` was when a retry can cure it (``"refused (503 SlowDown)"``), else None."""
    # Deferred (PLC0415): boto3 loads only when an s3:// URI is used (the Airflow side imports
    # trainer.storage, and most of it never touches S3).
    from botocore import exceptions as bx  # noqa: PLC0415

    if isinstance(exc, StorageError):
        # Our own verdicts are final: a StorageUnavailable already waited out its tolerance.
        return str(exc) if isinstance(exc, _TransientResponse) else None
    if isinstance(exc, bx.ClientError):
        code, status = _error_code(exc)
        label = " ".join(str(p) for p in (status, code if code != str(status) else "") if p)
        if code in _THROTTLED or status in (429, 503):
            return f"refused ({label})"
        if code == "ConditionalRequestConflict":
            # S3 says to retry: another conditional write to the key was in flight. The retry
            # then wins, or gets 412 and the read-back decides.
            return f"conflicted with a concurrent write ({label})"
        if code in _FLAKY or (status is not None and status >= 500):
            return f"failed ({label})"
        return None
    if isinstance(exc, bx.SSLError):
        return None  # a certificate or TLS setting: retrying will not change it
    if isinstance(exc, bx.ReadTimeoutError | bx.ConnectTimeoutError | TimeoutError):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, bx.EndpointConnectionError):
        return f"unreachable ({type(exc).__name__})"
    if isinstance(exc, bx.ChecksumError | bx.FlexibleChecksumError):
        return f"arrived damaged ({type(exc).__name__})"
    if isinstance(exc, bx.HTTPClientError | bx.ConnectionError | bx.IncompleteReadError | ConnectionError):
        return f"connection lost ({type(exc).__name__})"
    return None


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
        outage_tolerance_s: float = DEFAULT_OUTAGE_TOLERANCE_S,
    ) -> None:
        """:param outage_tolerance_s: how long one request keeps retrying transient failures
        (throttling, 5xx, resets, timeouts) before :class:`StorageUnavailable`."""
        # Deferred (PLC0415): boto3 loads only when an s3:// URI is used.
        import boto3  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415

        self.endpoint_url = endpoint_url
        self.region = region or "us-east-1"
        self.outage_tolerance_s = outage_tolerance_s
        self._retry = Retrier(outage_tolerance_s, transient)
        s3_options = {"addressing_style": "path"} if endpoint_url else {}
        config = Config(
            # One attempt per call: the Retrier retries (see the module docstring).
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=10,
            read_timeout=60,
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
        return (
            f"S3Storage(endpoint_url={self.endpoint_url!r}, region={self.region!r}, "
            f"outage_tolerance_s={self.outage_tolerance_s:g})"
        )

    @property
    def retries(self) -> int:
        """How many retries this client has made (every request together)."""
        return self._retry.retries

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

    def _call(
        self,
        op: str,
        uri: str,
        action: str,
        attempt: Callable[[int], T],
        *,
        stop: threading.Event | None = None,
        unsure: str = "",
    ) -> T:
        """``attempt(retry)`` through the Retrier; a final failure becomes a StorageError (one
        that ``attempt`` raised itself passes as it is)."""

        def translated(retry: int) -> T:
            try:
                return attempt(retry)
            except StorageError:
                raise
            except Exception as exc:
                if transient(exc) is not None:
                    raise
                raise self._error(exc, uri, action) from exc

        return self._retry.run(op, uri, translated, stop=stop, unsure=unsure)

    def _own_write(self, uri: str, token: str) -> str | None:
        """The etag of the object at ``uri`` if the write with ``token`` made it, else None."""
        head = self.head(uri)
        if head is None or head.get("write_token") != token:
            return None
        log.info(
            "storage: a write to %s was retried after its reply was lost; the object carries "
            "its write token, so the write took effect",
            uri,
        )
        return str(head["etag"])

    def put(self, uri: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        bucket, key = _split_s3(uri)
        _check_conditions(uri, if_none_match, if_match)
        kwargs: dict = {"Bucket": bucket, "Key": key, "Body": bytes(data)}
        token = None
        if if_none_match or if_match is not None:
            token = new_write_token()
            kwargs["Metadata"] = {WRITE_TOKEN_KEY: token}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = f'"{_strip_etag(if_match)}"'

        def attempt(retry: int) -> str:
            try:
                return _strip_etag(self._client.put_object(**kwargs)["ETag"])
            except Exception as exc:
                if transient(exc) is not None:
                    raise
                err = self._error(exc, uri, "write")
                if isinstance(err, NotFound) and if_match is not None:
                    err = PreconditionFailed(
                        f"object {uri!r} does not exist, so etag {if_match!r} cannot match: "
                        "re-read it and retry"
                    )
                if isinstance(err, PreconditionFailed) and retry and token is not None:
                    # An earlier try may have been performed with its reply lost: is it ours?
                    etag = self._own_write(uri, token)
                    if etag is not None:
                        return etag
                raise err from exc

        unsure = "the write may have taken effect: read the object to see" if token else ""
        return self._call("PUT", uri, "write", attempt, unsure=unsure)

    def get_with_etag(self, uri: str) -> tuple[bytes, str]:
        bucket, key = _split_s3(uri)

        def attempt(_retry: int) -> tuple[bytes, str]:
            response = self._client.get_object(Bucket=bucket, Key=key)
            return response["Body"].read(), _strip_etag(response["ETag"])

        return self._call("GET", uri, "read", attempt)

    def head(self, uri: str) -> dict | None:
        bucket, key = _split_s3(uri)
        try:
            response = self._call(
                "HEAD", uri, "head", lambda _retry: self._client.head_object(Bucket=bucket, Key=key)
            )
        except NotFound:
            return None
        return {
            "size": int(response["ContentLength"]),
            "etag": _strip_etag(response["ETag"]),
            "mtime": response["LastModified"].timestamp(),
            "write_token": (response.get("Metadata") or {}).get(WRITE_TOKEN_KEY),
        }

    def _keys(self, prefix_uri: str) -> tuple[str, list[str]]:
        bucket, key = _split_s3(prefix_uri)
        keys: list[str] = []
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": _folder(key)}
        while True:
            # One page per request, each retried on its own: an outage mid-listing costs a page.
            page = self._call(
                "LIST", prefix_uri, "list", functools.partial(_list_page, self._client, dict(request))
            )
            keys.extend(item["Key"] for item in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return bucket, keys
            request["ContinuationToken"] = page["NextContinuationToken"]

    def list(self, prefix_uri: str) -> list[str]:
        bucket, keys = self._keys(prefix_uri)
        return sorted(f"s3://{bucket}/{k}" for k in keys)

    def delete(self, uri: str) -> None:
        bucket, key = _split_s3(uri)
        # S3 answers a delete of a missing key with success, so a retried delete is one too.
        with contextlib.suppress(NotFound):
            self._call(
                "DELETE", uri, "delete", lambda _retry: self._client.delete_object(Bucket=bucket, Key=key)
            )

    def delete_prefix(self, prefix_uri: str) -> int:
        bucket, keys = self._keys(prefix_uri)
        for start in range(0, len(keys), 1000):
            pending = list(keys[start : start + 1000])

            def attempt(_retry: int, pending: list[str] = pending) -> None:
                response = self._client.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": k} for k in pending], "Quiet": True}
                )
                errors = response.get("Errors") or []
                flaky = [e for e in errors if e.get("Code") in _THROTTLED | _FLAKY]
                if errors and len(flaky) == len(errors):
                    # Deleted keys stay deleted: the retry asks only for the rest.
                    pending[:] = [str(e.get("Key")) for e in errors]
                    raise _TransientResponse(f"failed for {len(errors)} keys ({errors[0].get('Code')})")
                if errors:
                    first = errors[0]
                    raise StorageError(
                        f"could not delete {len(errors)} objects under {prefix_uri!r}, first "
                        f"s3://{bucket}/{first.get('Key')} ({first.get('Code')}): check permissions"
                    )

            self._call("DELETE", prefix_uri, "delete", attempt)
        return len(keys)

    def upload_file(self, local_path: str | os.PathLike, uri: str, *, move: bool = False) -> str:
        bucket, key = _split_s3(uri)
        size = os.path.getsize(local_path)
        if size < _PART_SIZE:
            with open(local_path, "rb") as f:
                etag = self.put(uri, f.read())
        else:
            etag = self._multipart(os.fspath(local_path), size, bucket, key, uri)
        if move:
            os.unlink(local_path)  # handed over: free the node's scratch disk
        return etag

    def _multipart(self, local_path: str, size: int, bucket: str, key: str, uri: str) -> str:
        # The token lets a retried CompleteMultipartUpload whose first reply was lost (the
        # upload is then gone) recognise the object it made.
        token = new_write_token()
        upload_id = self._call(
            "CreateMultipartUpload",
            uri,
            "upload",
            lambda _retry: self._client.create_multipart_upload(
                Bucket=bucket, Key=key, Metadata={WRITE_TOKEN_KEY: token}
            )["UploadId"],
        )
        stop = threading.Event()  # one part giving up stops the others

        def send(number: int) -> dict:
            def attempt(_retry: int) -> dict:
                # Each try reads its own slice, so at most a few parts sit in memory.
                with open(local_path, "rb") as f:
                    f.seek((number - 1) * _PART_SIZE)
                    body = f.read(_PART_SIZE)
                response = self._client.upload_part(
                    Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
                )
                return {"PartNumber": number, "ETag": response["ETag"]}

            try:
                return self._call(f"UploadPart {number}", uri, "upload", attempt, stop=stop)
            except BaseException:
                stop.set()
                raise

        def complete(parts: list[dict], retry: int) -> str:
            try:
                response = self._client.complete_multipart_upload(
                    Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
            except Exception as exc:
                if retry and _error_code(exc)[0] == "NoSuchUpload":
                    etag = self._own_write(uri, token)
                    if etag is not None:
                        return etag
                raise
            return _strip_etag(response["ETag"])

        count = (size + _PART_SIZE - 1) // _PART_SIZE
        try:
            with ThreadPoolExecutor(max_workers=_UPLOAD_WORKERS) as pool:
                futures = [pool.submit(send, n) for n in range(1, count + 1)]
            failures = [f.exception() for f in futures if f.exception() is not None]
            if failures:
                # The part that gave up first says why; the others only stopped.
                raise next((e for e in failures if not isinstance(e, Abandoned)), failures[0])  # type: ignore[misc]
            parts = [f.result() for f in futures]
            return self._call(
                "CompleteMultipartUpload",
                uri,
                "upload",
                functools.partial(complete, parts),
                unsure="the upload may have completed: read the object to see",
            )
        except BaseException:
            # One try, not retried: the upload failed already, and S3 expires abandoned parts
            # under a lifecycle rule (AbortIncompleteMultipartUpload).
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            raise

    def download_file(self, uri: str, local_path: str | os.PathLike) -> None:
        bucket, key = _split_s3(uri)

        def attempt(_retry: int) -> None:
            # A retry starts the file over: _write_local leaves nothing of a failed try.
            body = self._client.get_object(Bucket=bucket, Key=key)["Body"]
            _write_local(os.fspath(local_path), body.iter_chunks(_CHUNK))

        self._call("GET", uri, "download", attempt)

    def download_file_hashed(self, uri: str, local_path: str | os.PathLike) -> tuple[int, str]:
        bucket, key = _split_s3(uri)

        def attempt(_retry: int) -> tuple[int, str]:
            tally = _Tally()  # a retry starts the file, and so its checksum, over
            body = self._client.get_object(Bucket=bucket, Key=key)["Body"]
            _write_local(os.fspath(local_path), tally.counted(body.iter_chunks(_CHUNK)))
            return tally.result

        return self._call("GET", uri, "download", attempt)

    def copy(self, src_uri: str, dst_uri: str) -> None:
        src_bucket, src_key = _split_s3(src_uri)
        dst_bucket, dst_key = _split_s3(dst_uri)

        def attempt(_retry: int) -> None:
            try:
                # The managed copy switches to multipart copy above 5 GiB; a retry copies again.
                self._client.copy({"Bucket": src_bucket, "Key": src_key}, dst_bucket, dst_key)
            except Exception as exc:
                if transient(exc) is not None:
                    raise
                err = self._error(exc, src_uri, "copy")
                if isinstance(err, NotFound):
                    raise err from exc
                raise self._error(exc, dst_uri, "copy") from exc

        self._call("COPY", f"{src_uri} to {dst_uri}", "copy", attempt)


def _list_page(client: Any, request: dict[str, Any], _retry: int) -> dict:
    return client.list_objects_v2(**request)


def _error_code(exc: BaseException) -> tuple[str, int | None]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status
