"""One storage interface for both halves: ``file://`` (the embedded default) and ``s3://``.

Methods take full URIs. Conditional writes (``if_none_match`` / ``if_match``) are the
only coordination primitive the project uses, so both backends make them atomic, and both
report what a conditional write really did: S3's through a write token read back after a
retry (``trainer.storage.s3``). S3 requests ride out outages up to a tolerance
(``trainer.storage.retry``), then raise :class:`StorageUnavailable`.
Imported at DAG-parse time: standard library only at module top; boto3 is imported
inside :class:`S3Storage`.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable

from trainer.storage.base import (
    NotFound,
    PreconditionFailed,
    Storage,
    StorageError,
    StorageUnavailable,
    _unsupported,
    sha256_file,
)
from trainer.storage.file import FileStorage, _file_path
from trainer.storage.retry import OUTAGE_TOLERANCE_ENV, outage_tolerance
from trainer.storage.s3 import S3Storage

__all__ = [
    "OUTAGE_TOLERANCE_ENV",
    "FileStorage",
    "NotFound",
    "PreconditionFailed",
    "S3Storage",
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "open_storage",
    "outage_tolerance",
    "sha256_file",
]


_cache: dict[tuple[object, ...], Storage] = {}
_cache_lock = threading.Lock()


def open_storage(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    aws_access_key_id: str | None = None,
    aws_secret_access_key: str | None = None,
    aws_session_token: str | None = None,
    outage_tolerance_s: float | None = None,
) -> Storage:
    """Return the (cached, thread-safe) client for ``uri``'s scheme and options.

    :param outage_tolerance_s: how long an ``s3://`` request keeps retrying throttling, 5xx,
        resets and timeouts before it fails with :class:`StorageUnavailable`; by default
        ``$TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S``, else 300 s. ``file://`` errors are final.
    """
    tolerance = outage_tolerance(outage_tolerance_s)
    if uri.startswith("file://"):
        _file_path(uri)
        key: tuple[object, ...] = ("file",)
        factory: Callable[[], Storage] = FileStorage
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
        key = ("s3", endpoint_url, region, creds, env if not any(creds) else None, tolerance)

        factory = functools.partial(
            S3Storage,
            endpoint_url=endpoint_url,
            region=region,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            outage_tolerance_s=tolerance,
        )
    else:
        raise _unsupported(uri)
    with _cache_lock:
        client = _cache.get(key)
        if client is None:
            client = _cache[key] = factory()
        return client
