"""What storage says about each kind of run, and so its outcome."""

from trainer.storage import open_storage
from trainops.runs.facts import read_facts
from trainops.runs.outcome import outcome
from trainops.runs.refs import resolve

from .stored import every_outcome


def test_every_outcome_from_storage(file_root):
    runs = every_outcome(file_root)
    store = open_storage(file_root)
    found = {name: read_facts(store, resolve(uri, file_root), now=1100.0) for name, uri in runs.items()}
    assert {name: outcome(f).kind for name, f in found.items()} == {
        "promoted": "promoted",
        "rejected": "rejected",
        "identical": "identical",
        "failed": "failed",
        "running": "running",
    }
    assert found["promoted"].promoted_version == 2 and found["promoted"].cost == 0.25
    assert found["failed"].failure == "program error: ValueError: bad batch"
    running = found["running"]
    assert (running.step, running.max_steps) == (40, 100) and running.eta_s is not None
    assert running.run_id == "scheduled__2026-12-05T00:00:00+00:00"  # the Airflow id, not the folder


def test_a_missing_run_is_a_problem_not_an_error(file_root):
    f = read_facts(open_storage(file_root), resolve("retrain/nope", file_root))
    assert f.problem.startswith("no readable job.json") and outcome(f).kind == "unknown"


def test_damaged_records_give_a_row_not_a_crash(file_root):
    """A job.json or gate.json of the wrong shape: the outcome still reads, nothing raises."""
    import json

    from tests.trainops.runs.stored import write_run
    from trainer.contract import RunLayout

    store = open_storage(file_root)
    run = write_run(file_root, "d", "r1", status="failed", attempts=[])
    layout = RunLayout(run)
    store.put(layout.job, json.dumps({"status": "failed", "attempts": 5, "airflow": 3}).encode())
    store.put(layout.eval_gate, json.dumps({"approved": False, "checks": [{"passed": False}, 5]}).encode())
    found = read_facts(store, resolve(run, file_root))
    assert outcome(found).text == "failed at train: see its log"
    store.put(layout.job, json.dumps({"status": "succeeded", "attempts": [{"launched_at": 123}]}).encode())
    found = read_facts(store, resolve(run, file_root))
    assert found.started_at == "123" and outcome(found).text.startswith("rejected: a check")
