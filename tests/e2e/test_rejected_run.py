"""A rejected candidate through Airflow's own dag.test(): the run says why where a person looks.

The gate and promote tasks run over a finished run's results on real storage (no training), so
this takes seconds: the DAG run's note and the gate task's note name the failed checks, promote
is skipped with the reason as its message, and nothing in the log reads as an error.
"""

import json
from urllib.parse import quote_plus, unquote_plus

import pytest

from tests.trainops.operators.test_promote import evaluation_of, finished_run
from trainer.contract import production_pointer
from trainer.storage import open_storage
from trainops.cli.main import load_dag

pytestmark = pytest.mark.slow

DAG_ID = "gate_then_promote"
MODEL = "demo-lm"
IMPOSSIBLE = [
    {
        "name": "eval loss under max_eval_loss",
        "kind": "threshold",
        "metric": "eval_loss",
        "op": "<=",
        "value": 0.001,
    },
    {
        "name": "no regression vs production",
        "kind": "no_regression",
        "metric": "eval_loss",
        "tolerance": 0.02,
    },
]
# The only DAG of the bundle dag.test() runs; its inputs come from GATE_THEN_PROMOTE (JSON).
DAG_FILE = """
import json, os
import pendulum
from airflow.sdk import DAG
from trainops.operators import EvaluationGateOperator, PromoteModelOperator

spec = json.loads(os.environ.get("GATE_THEN_PROMOTE", "{}"))
with DAG("gate_then_promote", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
    where = {"storage_root": spec.get("root"), "aws_conn_id": None}
    gate = EvaluationGateOperator(
        task_id="gate", evaluation=spec.get("evaluation"), checks=spec.get("checks"), **where
    )
    PromoteModelOperator(
        task_id="promote", model_name="demo-lm", gate=gate.output, training=spec.get("training"),
        dataset=spec.get("dataset"), evaluation=spec.get("evaluation"), **where
    )
"""


@pytest.fixture
def gate_then_promote(tmp_path, monkeypatch, airflow_db, file_root):
    """Run gate -> promote with dag.test() on a finished run named ``name``; the DAG run."""
    from airflow import settings

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "gate_then_promote.py").write_text(DAG_FILE)
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(dags))
    monkeypatch.setattr(settings, "DAGS_FOLDER", str(dags))  # what the dags-folder bundle reads

    def run(name: str, eval_loss: float, checks=None, production=(None, None), weights: bytes | None = None):
        training, dataset = finished_run(file_root, name)
        if weights is not None:
            open_storage(file_root).put(f"{training['export_uri']}/model.safetensors", weights)
        evaluation = evaluation_of(training, eval_loss, *production)
        spec = {"root": file_root, "training": training, "dataset": dataset, "evaluation": evaluation}
        monkeypatch.setenv("GATE_THEN_PROMOTE", json.dumps({**spec, "checks": checks}))
        return load_dag(str(dags), DAG_ID).test()

    return run


def stored_link(run_id: str, task_id: str, link_class: str) -> str:
    """The URL Airflow's task runner stored for an operator extra link (the UI shows it)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=DAG_ID, run_id=run_id, task_id=task_id, key=f"_link_{link_class}")
            .one()
        )
        return XComModel.deserialize_value(row)


def run_record(run_id: str) -> tuple[str | None, dict]:
    """The DAG run's note, and each task's (state, note, try_number), as Airflow stored them."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalar(select(DagRun).filter_by(dag_id=DAG_ID, run_id=run_id))
        tis = session.scalars(select(TaskInstance).filter_by(dag_id=DAG_ID, run_id=run_id)).all()
        return run.note, {
            ti.task_id: (str(ti.state).rsplit(".", 1)[-1].lower(), ti.note, ti.try_number) for ti in tis
        }


def test_a_rejection_is_in_the_run_note_and_promote_skips_with_the_reason(
    gate_then_promote, file_root, capfd
):
    dagrun = gate_then_promote("rejected", 1.67995, IMPOSSIBLE)

    assert str(dagrun.state).endswith("success")  # a rejection is a decision, not a failure
    note, tasks = run_record(dagrun.run_id)
    gate_uri = f"{file_root}/runs/retrain/rejected/train/eval/gate.json"
    assert note == (
        "REJECTED: demo-lm failed 1 of 2 gate checks (no production yet); promote skipped, "
        "production unchanged.\n"
        "- eval loss under max_eval_loss: eval_loss (observed 1.67995, expected <= 0.001)\n"
        f"Decision: {gate_uri}"
    )
    assert tasks["gate"] == ("success", note, 1)  # the gate task's own note says the same
    assert tasks["promote"][0] == "skipped"
    assert not open_storage(file_root).exists(production_pointer(file_root, MODEL))
    printed = "".join(capfd.readouterr())
    # promote's message is the reason, on the line Airflow logs for the skip
    assert "Skipping task." in printed
    assert (
        "reason='not promoting demo-lm: the gate rejected it: eval loss under max_eval_loss: eval_loss "
        "(observed 1.67995, expected <= 0.001)"
    ) in printed
    assert "XCom not found" not in printed
    assert "[error" not in printed


def test_a_supervised_worker_writes_the_notes_through_airflows_rest_api(gate_then_promote, monkeypatch):
    """Where the database is out of reach (a worker under a supervisor), the notes go through
    the public API; here Airflow's own API app answers, with a token of a user who may edit."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    from trainops.operators.notes import _via_api

    dagrun = gate_then_promote("rejected", 1.67995, IMPOSSIBLE)
    note_before, _ = run_record(dagrun.run_id)
    client = TestClient(create_app(apps="core"))  # initialises the auth manager too
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ada", role="admin"))
    conn = {"conn_type": "http", "host": "http://testserver", "extra": {"token": token}}
    monkeypatch.setenv("AIRFLOW_CONN_TRAINOPS_AIRFLOW_API", json.dumps(conn))
    ids = {"dag_id": DAG_ID, "run_id": dagrun.run_id, "task_id": "promote", "map_index": -1}

    assert _via_api("trainops_airflow_api", ids, f"{note_before}\n\nchecked by ada", "why", client=client)

    note, tasks = run_record(dagrun.run_id)
    assert note == f"{note_before}\n\nchecked by ada"
    assert tasks["promote"][1] == "why"
    assert _via_api("no_such_connection", ids, "x", None) is False  # no connection: not tried


def test_an_identical_candidate_is_reported_as_identical_and_the_promotion_records_the_user(
    gate_then_promote, file_root, capfd
):
    from trainer.contract import model_version_prefix

    storage = open_storage(file_root)
    first = gate_then_promote("first", 3.0, weights=b"same weights")
    card = storage.get_json(f"{model_version_prefix(file_root, MODEL, 1)}/card.json")
    # dag.test() runs as the user "dag_test"; a UI or API trigger records that user
    assert card["promoted_by"] == {"user": "dag_test", "trigger": "manual", "run_id": first.run_id}
    assert storage.get_json(production_pointer(file_root, MODEL))["history"][-1]["by"] == "dag_test"
    # the links read what the task pushed from the operator, in the same task runner
    card_uri = f"{model_version_prefix(file_root, MODEL, 1)}/card.json"
    assert stored_link(first.run_id, "promote", "ModelCardLink").endswith(f"uri={quote_plus(card_uri)}")
    assert "gate.json" in unquote_plus(stored_link(first.run_id, "gate", "GateDecisionLink"))
    pointer_before = storage.get(production_pointer(file_root, MODEL))
    capfd.readouterr()

    again = gate_then_promote("again", 3.0, production=(3.0, 1), weights=b"same weights")

    assert str(again.state).endswith("success")
    note, tasks = run_record(again.run_id)
    # the gate's approval first, naming the metric that decided; then why nothing was promoted
    approval, skipped = note.split("\n\n")
    assert approval.startswith(
        "APPROVED: demo-lm passed 2 of 2 gate checks (against production v1), decided on eval_loss.\n"
    )
    assert skipped.startswith("NOT PROMOTED: demo-lm is identical to production v1 (same weights sha256 ")
    assert skipped.endswith("); nothing new to publish; production unchanged.")
    assert tasks["gate"][:2] == ("success", approval)
    assert tasks["promote"] == ("skipped", skipped, 1)
    assert stored_link(again.run_id, "promote", "ModelCardLink") == ""  # disabled: nothing promoted
    assert storage.get(production_pointer(file_root, MODEL)) == pointer_before
    assert not storage.list(model_version_prefix(file_root, MODEL, 2))
    printed = "".join(capfd.readouterr())
    assert "reason='not promoting demo-lm: identical to production v1 (same weights sha256 " in printed
    assert "[error" not in printed
