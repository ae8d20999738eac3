"""Helpers shared by the staging tests."""

from __future__ import annotations


def record_batches(columns: dict[str, list], *, batch_rows: int) -> list:
    """Plain column lists as pyarrow record batches of at most ``batch_rows`` rows."""
    import pyarrow as pa

    return pa.table(columns).to_batches(max_chunksize=batch_rows)


def snapshot(storage, prefix: str) -> dict[str, str]:
    """Every object under ``prefix`` with its etag: two equal snapshots mean no change at all."""
    return {uri: storage.head(uri)["etag"] for uri in storage.list(prefix)}


def assert_nothing_valid_looking(storage, root: str, before: dict | None = None) -> list[str]:
    """No manifest, shard or temporary prefix was added under ``root`` since ``before``; what
    was there is unchanged. Returns the new objects (at most a failed validation's report)."""
    after = snapshot(storage, root)
    before = before or {}
    assert {u: e for u, e in after.items() if u in before} == before, "stored objects changed"
    added = sorted(set(after) - set(before))
    allowed = ("/validation.json", "/quarantine/sample.jsonl")
    assert all(u.endswith(allowed) for u in added), f"valid-looking objects written: {added}"
    assert not [u for u in after if "/_staging-" in u]
    return added
