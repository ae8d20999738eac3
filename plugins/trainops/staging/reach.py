"""Fail fast, and clearly, when an S3 endpoint cannot be reached.

The storage client retries a refused connection ten times with back-off (about half a
minute) and then reports a generic error; a down or mistyped endpoint deserves a one-line
answer in seconds. A TCP connection to the endpoint says whether anything listens there.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from trainops.staging.errors import SourceUnreachable

CONNECT_TIMEOUT_S = 5.0


def endpoint_of(storage) -> str | None:
    """The endpoint URL an ``S3Storage`` talks to (AWS's regional one by default); None for
    other storage."""
    if getattr(storage, "scheme", None) != "s3":
        return None
    if storage.endpoint_url:
        return storage.endpoint_url
    return f"https://s3.{storage.region}.amazonaws.com"


def check_reachable(storage, uri: str, *, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise SourceUnreachable naming ``uri``, the endpoint and the fix if nothing answers."""
    endpoint = endpoint_of(storage)
    if endpoint is None:
        return
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SourceUnreachable(
            f"cannot reach the S3 endpoint {endpoint} for {uri!r} ({reason}): check the "
            "endpoint_url of the Airflow AWS connection (or AWS_ENDPOINT_URL_S3) and that the "
            "store is up and reachable from this worker"
        ) from None
