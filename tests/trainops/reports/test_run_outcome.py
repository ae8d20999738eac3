"""The top of a run's report: its outcome in the shared words, and the few numbers that matter."""

from __future__ import annotations

from tests.trainops.cost.fixtures import one_preemption_cost, one_preemption_job
from tests.trainops.reports.helpers import page_text, table_with
from trainops.cost.money import money
from trainops.reports.run_outcome import figures_table, outcome_line, run_outcome

ATTACK = "<script>alert(1)</script>"


def _line(job, **kw) -> str:
    return page_text(outcome_line(run_outcome(job, **kw)))


def test_a_running_run_says_its_step_of_max_steps_and_what_is_left_in_its_colour():
    job = {"status": "running", "attempts": [{"attempt": 1}]}
    found = {"step": 300, "max_steps": 1000, "steps_per_s": 2.0, "eta_s": 350.0, "age_s": 3.0}
    assert _line(job, found=found) == "RUNNING: step 300/1000, about 6 min left"
    assert _line(job, found={**found, "max_steps": None, "eta_s": None}) == "RUNNING: step 300"
    assert _line(job) == "RUNNING: no step logged yet"
    assert 'class="outcome live"' in outcome_line(run_outcome(job))


def test_a_finished_run_is_failed_rejected_promoted_or_waiting_for_its_gate():
    failed = {"status": "failed", "attempts": [{"attempt": 1, "decision": {"reason": f"OOM {ATTACK}"}}]}
    html = outcome_line(run_outcome(failed, task="train_lm"))
    assert page_text(html) == f"FAILED at train_lm: OOM {ATTACK}" and "<script" not in html
    assert 'class="outcome fail"' in html

    done = {"status": "succeeded", "attempts": []}
    check = {
        "name": "accuracy",
        "metric": "accuracy",
        "observed": 0.71,
        "expected": ">= 0.8",
        "passed": False,
    }
    assert _line(done, gate={"approved": False, "checks": [check]}) == (
        "REJECTED: accuracy (observed 0.71, expected >= 0.8)"
    )
    assert _line(done, gate={"approved": False, "checks": [{"passed": False}]}) == (
        "REJECTED: ? (observed missing, expected -)"  # a check without a name still reads
    )
    assert _line(done, gate={"approved": False, "checks": "?"}) == "REJECTED by the gate"
    cards = [("other", 7, "s3://b/o.json"), ("lm", 3, "s3://b/card.json")]
    assert _line(done, gate={"approved": True, "model_name": "lm"}, promoted=cards) == "PROMOTED v3"
    assert _line(done, gate={"approved": True}) == "APPROVED, not promoted"
    assert _line(done) == "TRAINED, not evaluated"


def test_the_figures_are_steps_duration_cost_goodput_and_attempts():
    job, _ = one_preemption_job()
    cost = one_preemption_cost()
    rows = table_with(figures_table(job, cost, last_step=90, max_steps=100), "Steps")
    assert dict(zip(rows[0], rows[1], strict=True)) == {
        "Steps": "90 / 100",
        "Duration": "314.0 s",  # first launch to the last attempt's end
        "Cost (estimate)": money(cost["cost"]),
        "Goodput": "47.2%",
        "Attempts": "2 (1 preempted)",
    }
    empty = figures_table({"attempts": []}, {"format": "other"}, last_step=None, max_steps=None)
    assert table_with(empty, "Steps")[1] == ["-", "-", "-", "-", "0"]
