"""The demo DAG end to end through Airflow's own dag.test(), asserting on storage.

Three runs share one test (each trains for ~40 s): a first model, a second one that is the
same model bit for bit (reported as identical, not promoted again), and a third that an
impossible threshold (a DAG param) rejects, with the reason in the run's note. Rollback is
tested in tests/trainops/cli/test_main.py and tests/trainops/registry/test_rollback.py.
"""

import pytest

from trainer.contract import MetricsReader, RunLayout, dataset_prefix, production_pointer
from trainer.storage import open_storage
from trainops.cli.main import DEMO_DAG, DEMO_TASKS, load_dag, xcom_results

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_env(tmp_path, monkeypatch, airflow_db):
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    return root


def run_demo(run_conf: dict | None = None):
    import os

    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DEMO_DAG)
    dagrun = dag.test(run_conf=run_conf)
    return dagrun, xcom_results(DEMO_DAG, dagrun.run_id, DEMO_TASKS)


def run_note(run_id: str) -> str | None:
    from trainops.cli.main import run_note as note_of

    return note_of(DEMO_DAG, run_id)


def task_states(run_id: str) -> dict:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter_by(dag_id=DEMO_DAG, run_id=run_id).all()
        return {ti.task_id: str(ti.state).rsplit(".", 1)[-1].lower() for ti in rows}


def test_demo_twice_then_a_rejected_model_then_a_rollback(demo_env, capfd):
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
    metrics_steps = {r["step"] for r in MetricsReader(store, layout.run_uri).records()}
    assert metrics_steps == set(range(1, 121))

    evaluation = store.get_json(layout.eval_metrics)
    first_loss = evaluation["candidate"]["eval_loss"]
    assert first_loss < 3.5 and evaluation["baseline"] is None  # ln(257) = 5.55 untrained
    assert first["gate"]["approved"] is True
    pointer = store.get_json(production_pointer(root, "demo-lm"))
    assert pointer["version"] == first["promote"]["version"] == 1

    assert first["promote"]["version"] == 1
    card = store.get_json(first["promote"]["card_uri"])
    assert card["promoted_by"] == {"user": "dag_test", "trigger": "manual", "run_id": dagrun.run_id}

    # The same data, config and seed train the same weights: reported, not published again.
    dagrun, second = run_demo()
    assert str(dagrun.state).endswith("success"), second
    assert second["stage"]["reused"] is True
    assert second["stage"]["version"] == stage["version"]
    assert second["evaluate"]["production_version"] == 1
    assert second["evaluate"]["production"]["eval_loss"] == pytest.approx(first_loss, rel=1e-6)
    assert task_states(dagrun.run_id)["promote"] == "skipped" and second["promote"] is None
    assert run_note(dagrun.run_id).startswith(
        "NOT PROMOTED: demo-lm is identical to production v1 (same weights sha256 "
    )
    assert store.get_json(production_pointer(root, "demo-lm"))["version"] == 1

    # A third run with an impossible threshold: the gate rejects, promotion is skipped.
    pointer_before = store.get(production_pointer(root, "demo-lm"))
    capfd.readouterr()
    dagrun, third = run_demo({"max_eval_loss": 0.5})
    assert str(dagrun.state).endswith("success"), third  # a rejection is not a failure
    states = task_states(dagrun.run_id)
    assert (states["gate"], states["promote"]) == ("success", "skipped")
    assert third["promote"] is None
    assert store.get(production_pointer(root, "demo-lm")) == pointer_before  # still v1
    gate = store.get_json(RunLayout(third["train"]["run_uri"]).eval_gate)
    assert gate["approved"] is False and gate["production_version"] == 1
    failed = [c for c in gate["checks"] if not c["passed"]]
    assert [(c["name"], c["expected"]) for c in failed] == [("eval loss under max_eval_loss", "<= 0.5")]
    assert failed[0]["observed"] == pytest.approx(third["evaluate"]["candidate"]["eval_loss"])
    out = capfd.readouterr()
    assert "gate REJECTED: 1/2 checks passed, against production v1" in out.out + out.err
    assert "not promoting demo-lm: the gate rejected it: eval loss under max_eval_loss" in (out.out + out.err)
    # The reason is on the run itself, where a person looks first (Done when of issue #17).
    note = run_note(dagrun.run_id)
    assert note.startswith(
        "REJECTED: demo-lm failed 1 of 2 gate checks (against production v1); promote skipped, "
        "production unchanged.\n- eval loss under max_eval_loss (observed "
    )
    assert "expected <= 0.5)" in note and "XCom not found" not in out.out + out.err
