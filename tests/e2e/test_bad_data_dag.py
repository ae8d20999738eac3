"""Data that fails its expectations stops the DAG at staging: no training, storage untouched."""

import os

import pytest

from trainer.storage import open_storage
from trainops.cli.main import DEMO_DAG, load_dag
from trainops.operators import StageDatasetOperator
from trainops.staging.demo_data import write_demo_dataset

pytestmark = pytest.mark.slow


def test_bad_data_fails_staging_and_launches_nothing(tmp_path, monkeypatch, airflow_db):
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    store = open_storage(root)
    # A dataset staged earlier from good data must survive a bad delivery untouched.
    good = write_demo_dataset(f"{root}/raw/good", rows=300, seed=1)
    StageDatasetOperator(
        task_id="seed", source_uri=good["uri"], dataset_name="demo-text", aws_conn_id=None
    ).execute(context={})
    datasets_before = {uri: store.head(uri)["etag"] for uri in store.list(f"{root}/datasets")}

    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DEMO_DAG)
    dagrun = dag.test(run_conf={"corrupt_data": True})

    states = {ti.task_id: str(ti.state) for ti in dagrun.get_task_instances()}
    assert str(dagrun.state).endswith("failed")
    assert states["stage"].endswith("failed")
    assert all(states[t].endswith("upstream_failed") for t in ("train", "evaluate", "gate", "promote"))
    assert store.list(f"{root}/runs") == []
    assert not os.path.exists(tmp_path / "local" / "jobs")
    after = {uri: store.head(uri)["etag"] for uri in store.list(f"{root}/datasets")}
    assert {u: e for u, e in after.items() if u in datasets_before} == datasets_before
    new = sorted(set(after) - set(datasets_before))  # only the failed validation's report,
    assert len(new) == 1 and new[0].endswith("/validation.json")  # no manifest: no version
    assert not [u for u in after if u.startswith(new[0].rsplit("/", 1)[0]) and u.endswith("manifest.json")]
