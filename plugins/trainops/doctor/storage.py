"""The storage probe: does the storage root do what runs depend on?

Under ``<root>/.trainops-doctor/<random>/`` it writes, reads and lists a small object, then
tries what runs rely on for their identity and their pointers:

- **create-only** (``If-None-Match: *``): a second create of the same key must be refused.
  Run markers, attempt records and commit markers are written this way, so two runs never
  share a folder in silence.
- **compare-and-swap** (``If-Match: <etag>``): a write with a stale etag must be refused. The
  production pointer and job.json are updated this way.

A store that ignores either header (some S3-compatible servers do) accepts the write that must
fail: that is the failure reported. The round trip (a write and a read of a small object, the
median of three) is measured too. Everything written is deleted again, whatever happens.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from trainer.storage import PreconditionFailed, Storage, StorageError

PROBE_DIR = ".trainops-doctor"
ROUND_TRIPS = 3


def probe(store: Storage, root: str, *, clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """What the store honours: ``latency_ms``, ``create_only``, ``compare_and_swap`` (bools),
    or ``error`` (and ``fix``) when it cannot even be written and read."""
    base = f"{root.rstrip('/')}/{PROBE_DIR}/{uuid.uuid4().hex[:12]}"
    try:
        return _probe(store, base, clock)
    except StorageError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "fix": _fix(exc)}
    finally:
        with contextlib.suppress(Exception):  # the probe's result matters more than its litter
            store.delete_prefix(base + "/")


def _probe(store: Storage, base: str, clock: Callable[[], float]) -> dict[str, Any]:
    trips = []
    for i in range(ROUND_TRIPS):
        uri, data = f"{base}/round-trip-{i}", f"trainops doctor {i}".encode()
        start = clock()
        store.put(uri, data)
        read = store.get(uri)
        trips.append((clock() - start) * 1000)
        if read != data:
            return {"error": f"{uri} read back {len(read)} bytes that differ from the {len(data)} written"}
    if not [u for u in store.list(base + "/") if u.startswith(f"{base}/round-trip-")]:
        return {"error": f"{base}/: objects just written are not listed", "fix": "check the list permission"}

    once, swapped = f"{base}/create-only", f"{base}/compare-and-swap"

    def create_only() -> bool:
        store.put(once, b"first", if_none_match=True)
        return _refused(lambda: store.put(once, b"second", if_none_match=True))

    def compare_and_swap() -> bool:
        first = store.put(swapped, b"v1")
        store.put(swapped, b"v2", if_match=first)
        return _refused(lambda: store.put(swapped, b"v3", if_match=first))

    found: dict[str, Any] = {"latency_ms": statistics.median(trips)}
    for key, attempt in (("create_only", create_only), ("compare_and_swap", compare_and_swap)):
        try:
            found[key] = attempt()
        except StorageError as exc:  # a store that refuses the header outright (400, 501)
            found[key] = False
            found[f"{key}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return found


def _refused(write: Callable[[], object]) -> bool:
    try:
        write()
    except PreconditionFailed:
        return True
    return False


def _fix(exc: StorageError) -> str:
    text = str(exc).lower()
    if "credential" in text or "access denied" in text or "forbidden" in text or "403" in text:
        return (
            "give this identity read, write, list and delete under the root (docker/deploy/s3-policy.json), "
            "or set the Airflow connection (--aws-conn-id) or AWS_* variables"
        )
    return "check the storage root URI, that its bucket exists, and the endpoint (AWS_ENDPOINT_URL_S3)"
