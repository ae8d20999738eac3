"""The demo DAG end to end through Airflow's own dag.test(), asserting on storage.

One test follows the README's walkthrough with four runs (each trains for ~40 s): a first
model (v1, through an injected preemption), a second one, uninterrupted (the `preempt` param
off, as in the runs after it), that is the same model bit for bit (reported as identical, not
promoted again), a third trained with another seed (`{"seed": 2}`, a different model that
passes the gate and becomes v2), then a rollback to v1 through the command line's own code
(`python -m trainops rollback`, in process), and a fourth run that an impossible threshold
(the `max_eval_loss` param) rejects against the rolled-back v1, with the reason in the run's
note. The rollback's corner cases are tested in tests/trainops/cli/test_main.py and
tests/trainops/registry/test_rollback.py; bad param values in tests/dags/test_trainops_demo.py.
The first run is made once for this test and the browser click-through (tests/e2e/demo_run.py).
"""

from types import SimpleNamespace

import pytest

from tests.e2e.demo_run import run_demo, run_note, task_states
from trainer.contract import MetricsReader, RunLayout, dataset_prefix, production_pointer
from trainer.storage import open_storage
from trainops.cli.main import main

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_env(demo_first_run, monkeypatch):
    """The shared first run's storage root (tests/e2e/demo_run.py), for the runs that follow it."""
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", demo_first_run.root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", demo_first_run.local_state)
    return demo_first_run


def test_demo_twice_then_another_seed_then_a_rollback_then_a_rejected_model(demo_env, capfd):
    root = demo_env.root
    store = open_storage(root)

    first = demo_env.results  # the first run, shared with the browser test (demo_run.py)
    assert demo_env.state.endswith("success"), first

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
    assert card["promoted_by"] == {"user": "dag_test", "trigger": "manual", "run_id": demo_env.run_id}

    # The same data, config and seed train the same weights, uninterrupted this time (the
    # preempt param off): v1 resumed exactly, so the run is reported identical to it, not
    # published again.
    run_ids = [demo_env.run_id]
    dagrun, second = run_demo({"preempt": False})
    run_ids.append(dagrun.run_id)
    assert str(dagrun.state).endswith("success"), second
    assert (second["train"]["preemptions"], second["train"]["steps"]) == (0, 120)
    assert [
        a["classification"] for a in store.get_json(RunLayout(second["train"]["run_uri"]).job)["attempts"]
    ] == ["succeeded"]
    assert second["stage"]["reused"] is True
    assert second["stage"]["version"] == stage["version"]
    assert second["evaluate"]["production_version"] == 1
    assert second["evaluate"]["production"]["eval_loss"] == pytest.approx(first_loss, rel=1e-6)
    assert task_states(dagrun.run_id)["promote"] == "skipped" and second["promote"] is None
    approval, skipped = run_note(dagrun.run_id).split("\n\n")  # the gate's, then promote's
    assert approval.startswith("APPROVED: demo-lm passed 2 of 2 gate checks (against production v1)")
    assert skipped.startswith("NOT PROMOTED: demo-lm is identical to production v1 (same weights sha256 ")
    assert store.get_json(production_pointer(root, "demo-lm"))["version"] == 1

    # Another seed trains another model (other initial weights, other sample order): it passes
    # the gate against v1 and becomes v2.
    dagrun, other = run_demo({"seed": 2, "preempt": False})
    run_ids.append(dagrun.run_id)
    assert str(dagrun.state).endswith("success"), other
    states = task_states(dagrun.run_id)
    assert (states["gate"], states["promote"]) == ("success", "success")
    assert other["stage"]["reused"] is True
    assert other["evaluate"]["production_version"] == 1
    other_loss = other["evaluate"]["candidate"]["eval_loss"]
    assert other_loss != first_loss
    assert other["gate"]["approved"] is True
    gate = store.get_json(RunLayout(other["train"]["run_uri"]).eval_gate)
    assert gate["production_version"] == 1
    assert [(c["name"], c["passed"]) for c in gate["checks"]] == [
        ("eval loss under max_eval_loss", True),
        ("no regression vs production", True),
    ]
    assert gate["checks"][1]["expected"] == f"<= {first_loss * 1.02:.6g}"  # 2% worse at most
    assert gate["checks"][1]["observed"] == pytest.approx(other_loss)
    assert other["promote"]["version"] == 2 and other["promote"]["previous_version"] == 1
    assert run_note(dagrun.run_id) == (  # what decided, where a person looks first
        "APPROVED: demo-lm passed 2 of 2 gate checks (against production v1), decided on eval_loss.\n"
        f"- eval loss under max_eval_loss: eval_loss (observed {other_loss:.6g}, expected {gate['checks'][0]['expected']})\n"
        f"- no regression vs production: eval_loss (observed {other_loss:.6g}, expected <= {first_loss * 1.02:.6g})\n"
        f"Decision: {RunLayout(other['train']['run_uri']).eval_gate}"
    )
    # The seed reached the trainer as an integer (config.yaml, kept on the card), nothing else moved.
    card = store.get_json(other["promote"]["card_uri"])
    first_card = store.get_json(first["promote"]["card_uri"])
    assert (card["config"]["seed"], first_card["config"]["seed"]) == (2, 1234)
    assert {k: v for k, v in card["config"].items() if k not in ("seed", "run_uri")} == {
        k: v for k, v in first_card["config"].items() if k not in ("seed", "run_uri")
    }
    pointer = store.get_json(production_pointer(root, "demo-lm"))
    assert pointer["version"] == 2
    assert [(h["version"], h["action"]) for h in pointer["history"]] == [(1, "promote"), (2, "promote")]

    # v2 misbehaves in service: roll back to v1 with the command the README shows, in process.
    capfd.readouterr()
    reason = "v2 regressed on support tickets"
    assert main(["rollback", "demo-lm", "1", "--reason", reason, "--by", "alice"]) == 0
    out = capfd.readouterr().out
    assert out.splitlines() == [
        f"storage root: {root} (from $TRAINOPS_STORAGE_ROOT)",
        f"demo-lm: production is now v1 (was v2); recorded in {production_pointer(root, 'demo-lm')} "
        f"as rollback by alice: {reason}",
    ]
    pointer = store.get_json(production_pointer(root, "demo-lm"))
    assert pointer["version"] == 1 and pointer["uri"] == first["promote"]["version_uri"]
    assert [(h["version"], h["action"]) for h in pointer["history"]] == [
        (1, "promote"),
        (2, "promote"),
        (1, "rollback"),
    ]
    last = pointer["history"][-1]
    assert (last["from_version"], last["by"], last["reason"]) == (2, "alice", reason)

    # A fourth run with an impossible threshold: the gate rejects against production, which is
    # v1 again (not v2, the newest version), and promotion is skipped.
    pointer_before = store.get(production_pointer(root, "demo-lm"))
    capfd.readouterr()
    dagrun, rejected = run_demo({"max_eval_loss": 0.5, "preempt": False})
    run_ids.append(dagrun.run_id)
    assert str(dagrun.state).endswith("success"), rejected  # a rejection is not a failure
    states = task_states(dagrun.run_id)
    assert (states["gate"], states["promote"]) == ("success", "skipped")
    assert rejected["promote"] is None
    assert rejected["evaluate"]["production_version"] == 1
    assert rejected["evaluate"]["production"]["eval_loss"] == pytest.approx(first_loss, rel=1e-6)
    assert store.get(production_pointer(root, "demo-lm")) == pointer_before  # still v1
    gate = store.get_json(RunLayout(rejected["train"]["run_uri"]).eval_gate)
    assert gate["approved"] is False and gate["production_version"] == 1
    failed = [c for c in gate["checks"] if not c["passed"]]
    assert [(c["name"], c["expected"]) for c in failed] == [("eval loss under max_eval_loss", "<= 0.5")]
    assert failed[0]["observed"] == pytest.approx(rejected["evaluate"]["candidate"]["eval_loss"])
    out = capfd.readouterr()
    assert "gate REJECTED: 1/2 checks passed, against production v1" in out.out + out.err
    assert "not promoting demo-lm: the gate rejected it: eval loss under max_eval_loss" in (out.out + out.err)
    # The reason is on the run itself, where a person looks first (Done when of issue #17).
    note = run_note(dagrun.run_id)
    assert note.startswith(
        "REJECTED: demo-lm failed 1 of 2 gate checks (against production v1); promote skipped, "
        "production unchanged.\n- eval loss under max_eval_loss: eval_loss (observed "
    )
    assert "expected <= 0.5)" in note and "XCom not found" not in out.out + out.err
    _each_promotion_announced_production_and_the_deploy_dag_follows_the_pointer(root, run_ids, first, other)


def _each_promotion_announced_production_and_the_deploy_dag_follows_the_pointer(root, run_ids, first, other):
    """The promotions (v1, v2) emitted an event on trainops://models/demo-lm; the identical and
    the rejected runs emitted none, nor did the rollback from the command line. The example deploy
    DAG is scheduled on that Asset, and its task deploys what production is now (v1, rolled back),
    whichever event it is given."""
    import os

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from trainops.cli.main import load_dag
    from trainops.operators.production_asset import model_asset

    asset = model_asset("demo-lm")
    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.uri == asset.uri, AssetEvent.source_run_id.in_(run_ids))
            .order_by(AssetEvent.timestamp)
            .all()
        )
        announced = [(e.source_run_id, e.extra["action"], e.extra["version"], e.extra["uri"]) for e in events]
        extras = [dict(e.extra) for e in events]
    assert announced == [
        (run_ids[0], "promote", 1, first["promote"]["version_uri"]),
        (run_ids[2], "promote", 2, other["promote"]["version_uri"]),
    ]
    # dag.test() has no scheduler to start the DAG scheduled on the Asset: its task is given
    # the events as the scheduler would give them.
    deploy_dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], "deploy_on_promotion")
    assert asset in deploy_dag.timetable.asset_condition.objects
    deploy = deploy_dag.get_task("deploy")
    events_seen = {asset: [SimpleNamespace(extra=extra) for extra in extras]}
    (record,) = deploy.python_callable(triggering_asset_events=events_seen)
    assert (record["version"], record["uri"], record["event"]["version"]) == (
        1,
        first["promote"]["version_uri"],
        2,
    )
