"""The data-team flow: a producer announces snapshots on an Asset, the consumer stages them.

The consumer's whole run on a real asset event is in tests/e2e/test_real_airflow.py (dag.test
cannot deliver asset events); here: how the consumer reads events, and what the producer
lands and announces.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from trainops.cli.main import load_dag, xcom_results
from trainops.recipes.sources import RAW_DEMO_ASSET, source_from_events

T0 = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)


def event(uri=None, minutes=0, **extra):
    return SimpleNamespace(
        extra={**({"uri": uri} if uri else {}), **extra},
        timestamp=T0 + timedelta(minutes=minutes),
        asset=SimpleNamespace(name=RAW_DEMO_ASSET.name),
        source_dag_id="data_team_publish",
        source_run_id=f"scheduled__{minutes}",
    )


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


@pytest.mark.slow
def test_the_producer_lands_a_snapshot_and_announces_it(airflow_db, tmp_path, monkeypatch):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from trainer.storage import open_storage

    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], "data_team_publish")
    dagrun = dag.test(run_conf={"rows": 500})
    assert str(dagrun.state).endswith("success")

    landed = xcom_results("data_team_publish", dagrun.run_id, ["land_raw_data"])["land_raw_data"]
    assert landed["rows"] == 500 and landed["dataset_name"] == "demo-text"
    assert landed["uri"].startswith(f"{root}/raw/datateam/demo-text/")
    parts = open_storage(root).list(landed["uri"])
    assert len(parts) == 2 and all(p.endswith(".parquet") for p in parts)

    with create_session() as session:
        rows = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == RAW_DEMO_ASSET.name, AssetEvent.source_run_id == dagrun.run_id)
            .all()
        )
        announced = [
            SimpleNamespace(
                extra=r.extra,
                timestamp=r.timestamp,
                asset=RAW_DEMO_ASSET,
                source_dag_id=r.source_dag_id,
                source_run_id=r.source_run_id,
            )
            for r in rows
        ]
    assert [e.extra for e in announced] == [landed]
    # What the consumer's source task makes of that event: exactly this snapshot.
    chosen = source_from_events({RAW_DEMO_ASSET: announced})
    assert (chosen["uri"], chosen["rows"], chosen["dataset_name"]) == (landed["uri"], 500, "demo-text")
