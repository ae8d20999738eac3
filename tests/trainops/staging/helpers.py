"""Helpers shared by the staging tests."""

from __future__ import annotations


def record_batches(columns: dict[str, list], *, batch_rows: int) -> list:
    """Plain column lists as pyarrow record batches of at most ``batch_rows`` rows."""
    import pyarrow as pa

    return pa.table(columns).to_batches(max_chunksize=batch_rows)


def snapshot(storage, prefix: str) -> dict[str, str]:
    """Every object under ``prefix`` with its etag: two equal snapshots mean no change at all."""
    return {uri: storage.head(uri)["etag"] for uri in storage.list(prefix)}
