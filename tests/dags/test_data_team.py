"""The data-team flow: a producer announces snapshots on an Asset, the consumer stages them.

The consumer's whole run on a real asset event is in tests/e2e/test_real_airflow.py (dag.test
cannot deliver asset events); how the consumer reads events is in
tests/trainops/recipes/test_sources.py; here: what the producer lands and announces, and what
the consumer makes of that very event.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from trainops.cli.main import load_dag, xcom_results
from trainops.recipes.sources import RAW_DEMO_ASSET, source_from_events


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
