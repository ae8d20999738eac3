"""Where a run's raw data comes from: the demo dataset, or the newest of a data team's events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from trainer.contract import safe_segment
from trainer.storage import open_storage
from trainops.recipes import form, sources
from trainops.recipes.sources import RAW_DEMO_ASSET, land_demo_batch, source_from_events

T0 = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)


@pytest.fixture
def storage(tmp_path, monkeypatch):
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    return root


def event(uri=None, minutes=0, **extra):
    return SimpleNamespace(
        extra={**({"uri": uri} if uri else {}), **extra},
        timestamp=T0 + timedelta(minutes=minutes),
        asset=SimpleNamespace(name=RAW_DEMO_ASSET.name),
        source_dag_id="data_team_publish",
        source_run_id=f"scheduled__{minutes}",
    )


def test_the_demo_data_is_written_once_and_only_at_its_default_place(storage):
    store = open_storage(storage)
    demo = form.demo_source_uri()
    assert sources.ensure_source(demo) == demo
    parts = store.list(demo)
    assert len(parts) == 2 and all(p.endswith(".parquet") for p in parts)
    before = [store.head(p) for p in parts]
    sources.ensure_source(demo)
    assert [store.head(p) for p in parts] == before  # not rewritten
    other = f"{storage}/raw/somewhere-else"
    assert sources.ensure_source(other) == other and store.list(other) == []


def test_a_landed_batch_is_announced_with_its_uri_and_rows(storage):
    extra = land_demo_batch(storage, "scheduled__2026-03-01T02:00:00+00:00", seed=3, rows=120)
    segment = safe_segment("scheduled__2026-03-01T02:00:00+00:00")
    assert extra["uri"] == f"{storage}/raw/datateam/demo-text/{segment}"
    assert (extra["rows"], extra["dataset_name"], extra["format"]) == (120, "demo-text", "parquet")
    assert open_storage(storage).list(extra["uri"])  # the snapshot is there


def test_the_newest_snapshot_is_staged_and_older_ones_are_superseded():
    events = {
        RAW_DEMO_ASSET: [
            event("file:///raw/b", minutes=5, rows=20, dataset_name="tickets"),
            event("file:///raw/a", minutes=0, rows=10),
            event(minutes=9),
        ]
    }  # an event without a uri says nothing to stage
    chosen = source_from_events(events, fallback_uri="file:///ignored")
    assert chosen["uri"] == "file:///raw/b" and chosen["rows"] == 20
    assert chosen["dataset_name"] == "tickets"
    assert chosen["superseded"] == ["file:///raw/a"]
    assert chosen["from_event"] == {
        "asset": "datateam-raw-demo-text",
        "source_dag_id": "data_team_publish",
        "source_run_id": "scheduled__5",
        "timestamp": "2026-03-01T02:05:00+00:00",
    }


def test_without_a_dataset_name_the_snapshot_is_named_after_its_uri():
    chosen = source_from_events({RAW_DEMO_ASSET: [event("s3://lake/raw/orders/2026-03-01")]})
    assert chosen["dataset_name"] == "2026-03-01"


def test_a_manual_run_stages_its_param_and_without_one_says_what_is_missing():
    chosen = source_from_events({}, fallback_uri="file:///raw/demo-text")
    assert chosen == {
        "uri": "file:///raw/demo-text",
        "dataset_name": "demo-text",
        "rows": None,
        "from_event": None,
        "superseded": [],
    }
    with pytest.raises(ValueError, match=r"nothing to stage: 1 triggering asset event.*dataset_uri"):
        source_from_events({RAW_DEMO_ASSET: [event(minutes=1)]}, fallback_uri=None)
