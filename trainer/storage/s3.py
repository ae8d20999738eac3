"""``s3://`` storage through boto3 (imported when a client is built, never at module top).
Conditional writes use If-None-Match / If-Match; large files go up in concurrent parts."""

from __future__ import annotations

import contextlib
import os

from trainer.storage.base import (
    _CHUNK,
    _PART_SIZE,
    _UPLOAD_WORKERS,
    NotFound,
    PreconditionFailed,
    Storage,
    StorageError,
    _check_conditions,
    _unsupported,
    _write_local,
)


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

    def put(self, uri: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
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
                    f"object {uri!r} does not exist, so etag {if_match!r} cannot match: re-read it and retry"
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
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=_folder(key))
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
