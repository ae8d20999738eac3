"""The recovery loop as a table: every event the training operator handles, over the record's
states, gives one step (the record to write, and what to do next). Pure: no Airflow, no
cluster, no storage."""

import pytest

from trainer.contract import attempt_record
from trainops.recovery.driver import (
    DeferralFailed,
    Done,
    Fail,
    FindLiveJobs,
    Launch,
    LeaveRunning,
    LiveJobs,
    Relaunch,
    Retired,
    Settings,
    Succeed,
    TryStarted,
    Wait,
    WaitEnded,
    deadline_failure,
    ended_by_deadline,
    step,
)

AT = "2026-01-01T01:00:00+00:00"
URI = "file:///r/job.json"


def handle(attempt=1):
    return {
        "cluster": "kubernetes",
        "job_id": f"train-1234abcd-a{attempt}",
        "labels": {"trainops/attempt": str(attempt)},
    }


def settings(capacity="spot", max_preemptions=1, max_infra_retries=1, fallback_after=None):
    budgets = {
        "max_preemptions": max_preemptions,
        "max_infra_retries": max_infra_retries,
        "fallback_after": fallback_after,
    }
    return Settings(job_uri=URI, budgets=budgets, capacity=capacity, at=AT)


def entry(attempt, *, ended=False):
    found = {
        "attempt": attempt, "job": handle(attempt), "status": "running", "job_name": handle(attempt)["job_id"],
        "capacity": "spot", "nodes": 2, "gpus_per_node": 0, "args": [], "spec": {}, "manifests": [],
        "launched_at": "2026-01-01T00:00:00+00:00",
    }  # fmt: skip
    if ended:
        found.update(status="ended", ended_at="2026-01-01T00:30:00+00:00", classification="preempted")
    return found


def job(attempts=1, *, status="running", capacity="spot", spent=(0, 0), newest_ended=False):
    """A record whose newest attempt runs (or ended); ``spent``: (preemptions, infra failures)
    of this run of the task so far."""
    found = [entry(n, ended=n < attempts or newest_ended) for n in range(1, attempts + 1)]
    return {
        "run_uri": "file:///r", "config_uri": "file:///r/config.yaml", "cluster": "kubernetes",
        "capacity": capacity, "preemptions": spent[0], "infra_failures": spent[1], "status": status,
        "attempts": found,
        "budget": {"from_attempt": 1, "preemptions": spent[0], "infra_failures": spent[1]},
    }  # fmt: skip


def state(phase="failed", **extra):
    return {"phase": phase, "reason": None, "nodes": [], "disruptions": [], **extra}


SPOT = [{"reason": "SpotInterruption", "message": "spot capacity reclaimed"}]


def record(outcome, **extra):
    return attempt_record(attempt=1, outcome=outcome, last_step=40, checkpoint_step=40, world_size=2, **extra)


def finished(job_state, trainer_record=None, tail="[node-0] last line"):
    event = {"status": "finished", "handle": handle(), "state": job_state}
    return WaitEnded(event, record=trainer_record, logs_tail=tail, kept_tail=tail)


def hung(message="no new step for 700s"):
    event = {"status": "hung", "handle": handle(), "state": state("running"), "message": message}
    return WaitEnded(event, logs_tail="[node-0] step 3", kept_tail="[node-0] step 3")


def relaunch(capacity="spot", delay_s=None):
    return ("relaunch", capacity, delay_s)


def outcome_of(done):
    """The step's action as a comparable tuple."""
    action = done.action
    if isinstance(action, Relaunch):
        return ("relaunch", action.capacity, action.delay_s)
    if isinstance(action, Fail):
        return ("fail",)
    return (type(action).__name__.lower(),)


# event, record, settings, what happens, the run's status in the record written (None: not written)
AFTER_AN_ATTEMPT = {
    "success": (
        finished(state("succeeded"), record("completed")), job(), settings(), ("succeed",), "succeeded"),
    "preempted, budget left": (
        finished(state(disruptions=SPOT), record("preempted")), job(), settings(), relaunch(), "running"),
    "preempted without a record (SIGKILL)": (
        finished(state(disruptions=SPOT)), job(), settings(), relaunch(), "running"),
    "lost node": (finished(state("lost")), job(), settings(), relaunch(), "running"),
    "preempted, budget spent: fail": (
        finished(state(disruptions=SPOT), record("preempted")), job(spent=(1, 0)), settings(), ("fail",), "failed"),
    "preempted past fallback_after: on-demand": (
        finished(state(disruptions=SPOT), record("preempted")),
        job(capacity="spot-then-on-demand"),
        settings("spot-then-on-demand", fallback_after=1),
        relaunch("on-demand"),
        "running",
    ),
    "no spot capacity: on-demand, no infra failure spent": (
        finished(state(infra_reason="no node before the deadline", unschedulable=True)),
        job(capacity="spot-then-on-demand", spent=(0, 1)),
        settings("spot-then-on-demand"),
        relaunch("on-demand"),
        "running",
    ),
    "program error: fail at once": (
        finished(state(), record("failed", error="loss is nan", hint="lower train.lr")),
        job(),
        settings(max_infra_retries=5),
        ("fail",),
        "failed",
    ),
    "storage error, retries left: back off": (
        finished(state(), record("failed", cause="storage", error="503")), job(), settings(), relaunch(delay_s=30.0), "running"),
    "network error, retries left": (
        finished(state(), record("failed", cause="network")), job(), settings(), relaunch(delay_s=30.0), "running"),
    "node error, retries left": (
        finished(state(), record("failed", cause="node")), job(), settings(), relaunch(delay_s=30.0), "running"),
    "storage error, retries spent": (
        finished(state(), record("failed", cause="storage")), job(spent=(0, 1)), settings(), ("fail",), "failed"),
    "image pull (the cluster's infra reason), retries spent": (
        finished(state(infra_reason="ImagePullBackOff")), job(spent=(0, 1)), settings(), ("fail",), "failed"),
    "hung, retries left: relaunch at once": (hung(), job(), settings(), relaunch(), "running"),
    "hung, retries spent": (hung(), job(spent=(0, 1)), settings(), ("fail",), "failed"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("event", "record_before", "given", "expected", "status"),
    AFTER_AN_ATTEMPT.values(),
    ids=AFTER_AN_ATTEMPT.keys(),
)
def test_what_happens_after_an_attempt(event, record_before, given, expected, status):
    done = step(record_before, event, given)
    assert outcome_of(done) == expected
    assert done.write and done.job["status"] == status
    assert done.bill == (status != "running")  # the bill is made once, when the run is over
    ended = done.job["attempts"][-1]
    assert ended["status"] == "ended" and ended["ended_at"] == AT
    assert ended["decision"]["reason"] in done.notes[0].text
    if isinstance(done.action, Relaunch):
        assert done.action.retire == handle() and done.job["capacity"] == done.action.capacity


def test_a_success_returns_the_trainers_record_and_cleans_the_job_up():
    completed = record("completed")
    done = step(job(), finished(state("succeeded"), completed), settings())
    assert done.action == Succeed(handle(), completed)
    assert done.notes[0].level == "info"
    assert done.notes[0].text == "attempt 1: succeeded (the trainer completed every step); training completed"


def test_a_program_error_fails_with_the_trainers_hint_and_the_logs():
    done = step(
        job(), finished(state(), record("failed", error="loss is nan", hint="lower train.lr")), settings()
    )
    assert done.action == Fail(
        "training failed on attempt 1: loss is nan; hint: lower train.lr. the trainer failed; relaunching "
        "would fail again.",
        tail_of=handle(),
        clean_up=handle(),
    )
    assert done.job["attempts"][-1]["logs_tail"] == "[node-0] last line"


def test_a_spent_preemption_budget_says_what_to_raise():
    done = step(job(spent=(1, 0)), finished(state(disruptions=SPOT), record("preempted")), settings())
    assert "preempted 2 times, over the budget of 1; raise max_preemptions" in done.action.message


def test_a_hung_attempt_is_deleted_with_its_log_tail_in_the_message():
    done = step(job(spent=(0, 1)), hung("no new step for 700s"), settings())
    assert done.action.delete == handle() and done.action.tail_of is None
    assert done.action.message.startswith(
        "training failed on attempt 1: no new step for 700s. 2 infrastructure"
    )
    assert done.action.message.endswith("the job was deleted.\nLast log lines:\n[node-0] step 3")
    assert done.job["attempts"][-1]["classification"] == "hung"
    assert done.notes[0].level == "warning" and done.notes[0].text.startswith("attempt 1: hung (no new step")


@pytest.mark.parametrize(("status", "which"), [("timeout", "job_timeout"), ("deadline", "execution_timeout")])
def test_a_deadline_deletes_the_job_records_the_attempt_as_timeout_and_fails(status, which):
    event = {"status": status, "handle": handle(), "state": state("running"), "message": "time is up"}
    done = step(job(), WaitEnded(event), settings())
    assert done.delete_first == handle() and done.write and done.bill
    assert isinstance(done.action, Fail) and f"stopped by its {which}: time is up" in done.action.message
    assert done.job["status"] == "failed"
    assert done.job["attempts"][-1]["classification"] == "timeout"


def test_a_failed_wait_leaves_the_job_running_and_writes_nothing():
    event = {"status": "error", "handle": handle(), "message": "status reads failed for 601 s"}
    done = step(job(), WaitEnded(event), settings())
    assert done.action == LeaveRunning(event, 1) and not done.write and not done.bill


MISSING = {
    "finished": finished(state("succeeded"), record("completed")),
    "hung": hung(),
    "deadline": WaitEnded({"status": "deadline", "handle": handle(), "message": "m"}),
    "error": WaitEnded({"status": "error", "handle": handle(), "message": "m"}),
    "gone": Retired({"status": "gone", "handle": handle()}),
    "live jobs": LiveJobs((handle(),)),
}


@pytest.mark.parametrize("event", MISSING.values(), ids=MISSING.keys())
def test_a_missing_record_fails_the_task_and_says_to_clear_it(event):
    done = step(None, event, settings())
    assert done.action == Fail(
        f"{URI} is missing, so this run's attempts are unknown; clear the task to start afresh"
    )
    assert not done.write


def test_a_deleted_job_that_is_gone_is_followed_by_the_next_plan_and_any_other_end_fails():
    assert step(
        job(newest_ended=True), Retired({"status": "gone", "handle": handle()}), settings()
    ).action == (FindLiveJobs())
    not_gone = Retired({"status": "error", "handle": handle(), "message": "pods still terminating"})
    done = step(job(newest_ended=True), not_gone, settings())
    assert done.action == Fail("not relaunching: pods still terminating")
    assert done.write and done.bill and done.job["status"] == "failed"


def test_a_try_first_asks_whether_the_newest_ended_attempts_job_is_gone():
    assert step(job(2, newest_ended=True), TryStarted(), settings()).action == FindLiveJobs(handle(2))
    assert step(job(0), TryStarted(), settings()).action == FindLiveJobs(None)


# the record, the live jobs, whether the newest ended job may still run, what happens
PLANS = {
    "a first try launches attempt 1": (job(0), (), False, Launch(1)),
    "a retry finds the current attempt live: wait": (job(), (handle(),), False, Wait(handle(), 1)),
    "a retry after an unwatched end reads it from the cluster": (job(), (), False, Wait(handle(), 1)),
    "a clear of a finished run launches the next attempt": (
        job(status="succeeded", newest_ended=True), (), False, Launch(2)),
    "an ended attempt's job still running is retired first": (
        job(newest_ended=True), (), True, Relaunch(handle(), "spot", "attempt 1's job still has processes or pods")),
    "a live job of an older attempt is retired first": (
        job(2), (handle(1),), False, Relaunch(handle(1), "spot", "job train-1234abcd-a1 is live but is not attempt 2's")),
    "an unrecorded live job of the next attempt is adopted": (
        job(newest_ended=True), (handle(2),), False, Wait(handle(2), 2, adopt=True)),
}  # fmt: skip


@pytest.mark.parametrize(("record_before", "live", "alive", "expected"), PLANS.values(), ids=PLANS.keys())
def test_what_a_try_does_on_the_record_and_the_live_jobs(record_before, live, alive, expected):
    done = step(record_before, LiveJobs(live, alive), settings())
    assert done.action == expected
    assert not done.write  # launching writes the intent; nothing before


def test_a_clear_of_a_finished_run_opens_a_new_budget_window_on_the_operators_capacity():
    spent = job(status="failed", capacity="on-demand", spent=(3, 2), newest_ended=True)
    done = step(spent, LiveJobs(()), settings("spot-then-on-demand"))
    assert done.job["status"] == "running" and done.job["capacity"] == "spot-then-on-demand"
    assert done.job["budget"] == {"from_attempt": 2, "preemptions": 0, "infra_failures": 0}


def test_a_retry_that_finds_its_job_live_says_it_reattaches():
    done = step(job(), LiveJobs((handle(),)), settings())
    assert done.notes[0].text == (
        "reattaching to attempt 1's job train-1234abcd-a1 instead of launching a second one (its job is live)"
    )


def test_a_failed_deferral_records_a_running_attempt_as_timeout_once():
    done = step(job(), DeferralFailed("Airflow failed the deferral (TIMEOUT)", "kubernetes"), settings())
    assert done.action == Done() and done.write and done.bill
    ended = done.job["attempts"][-1]
    assert ended["classification"] == "timeout"
    assert ended["reason"] == "Airflow failed the deferral (TIMEOUT); the job was deleted"
    for record_before in (job(newest_ended=True), job(0), None):  # nothing running: nothing to record
        done = step(record_before, DeferralFailed("why", "kubernetes"), settings())
        assert done.action == Done() and not done.write


HANDLE = {"cluster": "kubernetes", "job_id": "train-1234abcd-a2", "labels": {}}


def test_a_deadline_records_the_attempt_as_timeout_with_its_last_state():
    last_state = {"phase": "running", "reason": None, "nodes": [], "disruptions": []}
    event = {
        "status": "deadline",
        "handle": HANDLE,
        "state": last_state,
        "message": "execution_timeout ends at X",
    }
    running = job(0) | {
        "attempts": [{"attempt": 1, "job": HANDLE, "launched_at": "2026-01-01T00:00:00+00:00"}]
    }
    ended = ended_by_deadline(running, event, at="2026-01-01T01:00:00+00:00")
    entry = ended["attempts"][-1]
    assert ended["status"] == "failed"
    assert entry["classification"] == "timeout" and entry["reason"] == "execution_timeout ends at X"
    assert entry["state"] == last_state and entry["ended_at"] == "2026-01-01T01:00:00+00:00"
    assert "stopped by its execution_timeout" in deadline_failure(event, 1)
    assert "stopped by its job_timeout" in deadline_failure({**event, "status": "timeout"}, 1)
    assert "was deleted" in deadline_failure(event, 1)


def test_an_event_no_attempt_wait_ends_with_fails_as_a_bug_never_as_a_job_state():
    done = step(job(), WaitEnded({"status": "gone", "handle": handle()}), settings())
    assert isinstance(done.action, Fail) and done.action.message.startswith("unexpected trigger event")
    assert not done.write
