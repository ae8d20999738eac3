"""The demo DAG end to end through Airflow's own dag.test(), twice, asserting on storage."""

import json

import pytest

from trainer.contract import RunLayout, dataset_prefix, production_pointer
from trainer.storage import open_storage
from trainops.cli import DEMO_DAG, DEMO_TASKS, load_dag, xcom_results

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_env(tmp_path, monkeypatch, airflow_db):
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    return root


def run_demo():
    import os

    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DEMO_DAG)
    dagrun = dag.test()
    return dagrun, xcom_results(DEMO_DAG, dagrun.run_id, DEMO_TASKS)


def test_demo_twice(demo_env):
    root = demo_env
    store = open_storage(root)

    dagrun, first = run_demo()
    assert str(dagrun.state).endswith("success"), first

    stage = first["stage"]
    manifest = store.get_json(f"{dataset_prefix(root, 'demo-text', stage['version'])}/manifest.json")
    assert manifest["rows"]["total"] == stage["rows"] == 4000
    assert stage["reused"] is False

    train = first["train"]
    layout = RunLayout(train["run_uri"])
    records = [store.get_json(layout.attempt(n)) for n in (1, 2)]
    assert [r["outcome"] for r in records] == ["preempted", "completed"]
    assert records[0]["checkpoint_step"] == records[0]["last_step"]  # emergency checkpoint
    assert records[1]["resumed_from_step"] == records[0]["checkpoint_step"]
    assert train["preemptions"] == 1 and train["steps_lost"] == 0 and train["steps"] == 120
    job = store.get_json(layout.job)
    assert [a["classification"] for a in job["attempts"]] == ["preempted", "succeeded"]
    assert job["attempts"][0]["state"]["disruptions"][0]["reason"] == "SpotInterruption"
    # Every node of the preempted gang stopped by itself: none had to be SIGKILLed after the
    # grace period (a preemption costs seconds, not the grace period).
    assert -9 not in [n["exit_code"] for n in job["attempts"][0]["state"]["nodes"]]
    latest = store.get_json(layout.latest)
    assert latest["step"] == 120
    assert store.exists(f"{layout.checkpoint(120)}/_COMMITTED")
    assert store.exists(f"{layout.export}/model.safetensors")
    metrics_steps = {json.loads(line)["step"] for line in store.get(layout.metrics).decode().splitlines()}
    assert metrics_steps == set(range(1, 121))

    evaluation = store.get_json(layout.eval_metrics)
    first_loss = evaluation["candidate"]["eval_loss"]
    assert first_loss < 3.5 and evaluation["baseline"] is None  # ln(257) = 5.55 untrained
    assert first["gate"]["approved"] is True
    pointer = store.get_json(production_pointer(root, "demo-lm"))
    assert pointer["version"] == first["promote"]["version"] == 1

    dagrun, second = run_demo()
    assert str(dagrun.state).endswith("success"), second
    assert second["stage"]["reused"] is True
    assert second["stage"]["version"] == stage["version"]
    assert second["evaluate"]["production_version"] == 1
    assert second["evaluate"]["production"]["eval_loss"] == pytest.approx(first_loss, rel=1e-6)
    assert store.get_json(production_pointer(root, "demo-lm"))["version"] == 2
