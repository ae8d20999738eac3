"""A row per DAG run: Airflow's record joined with its training's, one outcome each; a run
that failed before training still gets its row."""

from datetime import UTC, datetime

from trainops.runs.dag_runs import DagRunInfo, dag_run_outcome, failure_note, rows
from trainops.runs.outcome import RunFacts

from .stored import GATE_REJECTED

T = datetime(2026, 12, 1, 10, tzinfo=UTC)


def info(run_id="r1", state="success", **kw):
    return DagRunInfo("retrain_manual", run_id, state, start=kw.pop("start", T), **kw)


def facts(**kw):
    return RunFacts("file:///s/runs/retrain_manual/r1/train", "retrain_manual", "r1", **kw)


def test_a_rejected_run_says_so_with_its_check():
    found = dag_run_outcome(info(), facts(status="succeeded", gate=GATE_REJECTED))
    assert found.kind == "rejected" and found.text.startswith("rejected: eval loss under max_eval_loss")


def test_a_run_that_failed_at_a_setting_has_a_row_with_the_reason_from_its_note():
    note = failure_note("stage", "settings: unknown key 'max_step' (did you mean max_steps?)\nmore detail")
    found = dag_run_outcome(info(state="failed", failed_task="stage", note=note), None)
    assert (found.kind, found.text) == (
        "failed",
        "failed at stage: settings: unknown key 'max_step' (did you mean max_steps?)",
    )
    bare = dag_run_outcome(info(state="failed", failed_task="evaluate"), facts(status="succeeded"))
    assert bare.text == "failed at evaluate: see its log"  # trained, then failed later


def test_training_that_failed_is_the_trainings_reason():
    found = dag_run_outcome(
        info(state="failed", failed_task="train"), facts(status="failed", failure="program error")
    )
    assert found.text == "failed at train: program error"


def test_runs_without_training():
    assert dag_run_outcome(info(state="running"), None).text == "running: not training yet"
    assert dag_run_outcome(info(state="success"), None).kind == "succeeded"


def test_rows_newest_first_joined_by_run_id():
    older = info("r1", start=T)
    newer = info("r2", state="failed", failed_task="stage", start=datetime(2026, 12, 2, tzinfo=UTC))
    found = rows([older, newer], {("retrain_manual", "r1"): facts(status="succeeded", promoted_version=3)})
    assert [(r.info.run_id, r.outcome.text) for r in found] == [
        ("r2", "failed at stage: see its log"),
        ("r1", "promoted v3"),
    ]


def test_a_rejection_that_failed_promote_on_purpose_is_still_a_rejection():
    """PromoteModelOperator(on_rejection="fail") fails the DAG run at promote."""
    found = dag_run_outcome(
        info(state="failed", failed_task="promote"), facts(status="succeeded", gate=GATE_REJECTED)
    )
    assert found.kind == "rejected"


def test_training_left_running_by_a_run_that_ended_is_a_failure_not_live():
    found = dag_run_outcome(
        info(state="failed", failed_task=None), facts(status="running", step=40, max_steps=100)
    )
    assert (found.kind, found.text) == (
        "failed",
        "failed at train: the task ended while its training was still running",
    )
