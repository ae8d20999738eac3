"""The job.json record as a fold over attempts, over plain data: no storage, no cluster."""

import json

import pytest

from trainer.contract import attempt_record
from trainops.cluster.spec import JobSpec
from trainops.recovery.record import (
    abandon_attempt,
    append_attempt,
    as_job_record,
    attempt_status,
    budget_window,
    current_attempt,
    fold_finished,
    intend_attempt,
    mark_failed,
    next_attempt,
    node_types,
    record_launched,
    start_record,
    steps_lost,
    total_restarts_in_place,
    total_steps_lost,
)

BUDGETS = {"max_preemptions": 2, "max_infra_retries": 1, "fallback_after": None}
SPOT = {"node": 1, "reason": "SpotInterruption", "message": "spot interruption notice"}


def state(phase="failed", *, disruptions=(), nodes=(), **extra):
    return {"phase": phase, "reason": None, "nodes": list(nodes), "disruptions": list(disruptions), **extra}


def record(outcome, **kw):
    return attempt_record(
        attempt=1, outcome=outcome, world_size=2, **{"last_step": 50, "checkpoint_step": 40, **kw}
    )


def launched(job, capacity=None):
    """``job`` with its next attempt launched, as the operator appends it."""
    n = next_attempt(job)
    spec = JobSpec(
        name=f"train-0a1b2c3d-a{n}",
        args=["python", "-m", "trainer", "train"],
        nodes=2,
        capacity=capacity or job["capacity"],
    )
    handle = {"cluster": "local", "job_id": f"{spec.name}-x", "labels": {"trainops/attempt": str(n)}}
    return append_attempt(job, spec=spec, handle=handle, manifests=[], at=f"2026-01-01T00:0{n}:00+00:00")


def fresh(capacity="spot"):
    return start_record(
        run_uri="file:///r/runs/d/r/train",
        config_uri="file:///r/runs/d/r/train/config.yaml",
        cluster="local",
        capacity=capacity,
    )


def test_a_new_record_has_no_attempts_and_is_running():
    job = fresh()
    assert (job["status"], job["attempts"], job["preemptions"], job["infra_failures"]) == (
        "running",
        [],
        0,
        0,
    )
    assert next_attempt(job) == 1
    assert json.loads(json.dumps(job)) == job  # job.json is plain JSON


def test_a_launched_attempt_is_appended_with_what_was_launched_and_the_old_record_is_unchanged():
    job = fresh()
    after = launched(job)
    assert job["attempts"] == []  # a fold returns a new record
    entry = after["attempts"][0]
    assert (entry["attempt"], entry["capacity"], entry["nodes"], entry["gpus_per_node"]) == (1, "spot", 2, 0)
    assert entry["args"] == ["python", "-m", "trainer", "train"] and entry["spec"]["nodes"] == 2
    assert entry["job"]["job_id"] == "train-0a1b2c3d-a1-x" and entry["launched_at"].endswith("00:01:00+00:00")
    assert "ended_at" not in entry and next_attempt(after) == 2


def test_a_completed_attempt_finishes_the_run():
    job, decision = fold_finished(
        launched(fresh()),
        state=state("succeeded"),
        record=record("completed", last_step=100, checkpoint_step=100),
        progress=None,
        budgets=BUDGETS,
        at="2026-01-01T01:00:00+00:00",
    )
    assert decision["action"] == "finish" and job["status"] == "succeeded"
    entry = job["attempts"][0]
    assert (entry["classification"], entry["steps_lost"], entry["ended_at"]) == (
        "succeeded",
        0,
        "2026-01-01T01:00:00+00:00",
    )
    assert entry["record"]["last_step"] == 100 and entry["decision"] == decision


def test_a_preemption_counts_against_its_budget_and_relaunches_until_it_is_spent():
    job = launched(fresh())
    for n in (1, 2):
        job, decision = fold_finished(
            job,
            state=state(disruptions=[SPOT]),
            record=record("preempted", signal="SIGTERM"),
            progress=None,
            budgets=BUDGETS,
            at="t",
        )
        assert (decision["action"], job["preemptions"], job["status"]) == ("relaunch", n, "running")
        job = launched(job)
    job, decision = fold_finished(
        job, state=state(disruptions=[SPOT]), record=None, progress=None, budgets=BUDGETS, at="t"
    )
    assert decision["action"] == "fail" and "preempted 3 times, over the budget of 2" in decision["reason"]
    assert (job["status"], job["preemptions"], len(job["attempts"])) == ("failed", 3, 3)
    assert [a["classification"] for a in job["attempts"]] == ["preempted"] * 3
    assert "spot interruption notice" in job["attempts"][0]["reason"]


def test_steps_lost_come_from_the_record_or_without_one_from_what_storage_shows():
    assert steps_lost(record("preempted", last_step=57, checkpoint_step=50), None) == 7
    assert steps_lost(None, {"last_step": 57, "committed_step": 40}) == 17
    assert steps_lost(None, {"last_step": 30, "committed_step": 40}) == 0  # nothing after the commit
    assert steps_lost(None, None) == 0  # no record, nothing logged
    job = launched(fresh())
    job, _ = fold_finished(
        job,
        state=state(disruptions=[SPOT]),
        record=None,  # SIGKILLed before it could write one
        progress={"last_step": 57, "committed_step": 40},
        budgets=BUDGETS,
        at="t",
    )
    job = launched(job)
    job, _ = fold_finished(
        job,
        state=state("succeeded"),
        record=record("completed", last_step=100, checkpoint_step=100),
        progress=None,
        budgets=BUDGETS,
        at="t",
    )
    assert [a["steps_lost"] for a in job["attempts"]] == [17, 0] and total_steps_lost(job) == 17


def test_steps_an_attempts_in_place_restarts_replayed_count_as_lost():
    restarts = [
        {"restart": 0, "outcome": "failed", "steps_lost": 7},
        {"restart": 1, "outcome": "unknown", "steps_lost": 3},
    ]
    rec = record("completed", last_step=100, checkpoint_step=100, restarts=restarts)
    assert steps_lost(rec, None) == 10
    damaged = record(
        "completed", last_step=100, checkpoint_step=100, restarts=[{"restart": 0, "steps_lost": "7"}]
    )
    assert steps_lost(damaged, None) == 0
    job, _ = fold_finished(
        launched(fresh()), state=state("succeeded"), record=rec, progress=None, budgets=BUDGETS, at="t"
    )
    entry = job["attempts"][0]
    assert entry["steps_lost"] == 10 and total_steps_lost(job) == 10
    assert total_restarts_in_place(job) == 2  # the task's result and the run page say so
    job["attempts"].append({"attempt": 2, "record": {"restarts": "damaged"}})
    assert total_restarts_in_place(job) == 2  # a damaged record counts nothing
    assert (
        entry["reason"] == "the trainer completed every step; restarted in place 2× (failed, then no record)"
    )


def test_spot_then_on_demand_moves_the_next_attempts_capacity_after_n_preemptions():
    job = launched(fresh("spot-then-on-demand"))
    job, decision = fold_finished(
        job,
        state=state(disruptions=[SPOT]),
        record=record("preempted"),
        progress=None,
        budgets={**BUDGETS, "fallback_after": 1},
        at="t",
    )
    assert (decision["capacity"], job["capacity"]) == ("on-demand", "on-demand")
    assert job["attempts"][0]["capacity"] == "spot-then-on-demand"  # what attempt 1 ran on
    assert launched(job)["attempts"][1]["capacity"] == "on-demand"


def test_spot_that_never_comes_is_a_fallback_not_an_infrastructure_failure():
    stuck = state(infra_reason="Unschedulable: no node for 901s", unschedulable=True)
    job, decision = fold_finished(
        launched(fresh("spot-then-on-demand")),
        state=stuck,
        record=None,
        progress=None,
        budgets={**BUDGETS, "max_infra_retries": 0},
        at="t",
    )
    assert (decision["action"], job["capacity"], job["infra_failures"]) == ("relaunch", "on-demand", 0)
    assert job["attempts"][0]["classification"] == "infra" and "delay_s" not in decision

    plain, decision = fold_finished(
        launched(fresh("spot")), state=stuck, record=None, progress=None, budgets=BUDGETS, at="t"
    )
    assert (decision["action"], decision["delay_s"], plain["infra_failures"]) == ("relaunch", 30, 1)
    assert plain["capacity"] == "spot"


def test_a_trainer_error_fails_the_run_with_its_hint():
    job, decision = fold_finished(
        launched(fresh()),
        state=state(nodes=[{"index": 0, "exit_code": 1}]),
        record=record("failed", error="OutOfMemoryError", hint="reduce train.micro_batch_size"),
        progress=None,
        budgets=BUDGETS,
        at="t",
    )
    assert decision["action"] == "fail" and job["status"] == "failed"
    assert "reduce train.micro_batch_size" in job["attempts"][0]["reason"]


def test_an_attempt_that_failed_on_storage_is_relaunched_against_the_infrastructure_budget():
    outage = record("failed", error="CheckpointError: 503 SlowDown", cause="storage")
    job, decision = fold_finished(
        launched(fresh()), state=state(), record=outage, progress=None, budgets=BUDGETS, at="t"
    )
    assert (decision["action"], decision["delay_s"], job["infra_failures"], job["status"]) == (
        "relaunch",
        30,
        1,
        "running",
    )
    assert job["attempts"][0]["classification"] == "infra" and job["attempts"][0]["steps_lost"] == 10
    job, decision = fold_finished(
        launched(job), state=state(), record=outage, progress=None, budgets=BUDGETS, at="t"
    )
    assert (decision["action"], job["infra_failures"], job["status"]) == ("fail", 2, "failed")
    assert decision["reason"] == "2 infrastructure failures, over the limit of 1"


def test_node_types_keep_only_nodes_whose_machine_is_known():
    nodes = [
        {
            "index": 0,
            "node_name": "ip-1",
            "instance_type": "p5.48xlarge",
            "capacity_type": "spot",
            "exit_code": 0,
        },
        {"index": 1, "node_name": None, "exit_code": 0},
    ]
    assert node_types(state("succeeded", nodes=nodes)) == [
        {"index": 0, "node_name": "ip-1", "instance_type": "p5.48xlarge", "capacity_type": "spot"}
    ]
    job, _ = fold_finished(
        launched(fresh()),
        state=state("succeeded", nodes=nodes),
        record=record("completed"),
        progress=None,
        budgets=BUDGETS,
        at="t",
    )
    assert [n["instance_type"] for n in job["attempts"][0]["node_types"]] == ["p5.48xlarge"]


def test_an_abandoned_attempt_is_an_error_and_a_failed_relaunch_fails_the_run():
    job = abandon_attempt(launched(fresh()), reason="job j still running after 60s", at="t")
    entry = job["attempts"][0]
    assert (job["status"], entry["classification"], entry["reason"]) == (
        "failed",
        "error",
        "job j still running after 60s",
    )
    relaunching = launched(fresh())
    failed = mark_failed(relaunching)
    assert failed["status"] == "failed" and failed["attempts"] == relaunching["attempts"]


def test_a_stored_record_is_checked_when_it_is_read_back():
    job = launched(fresh())
    assert as_job_record(json.loads(json.dumps(job)), "file:///r/job.json") == job
    with pytest.raises(ValueError, match=r"file:///r/job.json is not a trainops job record .*'attempts'"):
        as_job_record({"run_uri": "x"}, "file:///r/job.json")
    with pytest.raises(ValueError, match="is not a trainops job record"):
        as_job_record([1, 2], "file:///r/job.json")


def test_a_hung_attempt_is_recorded_with_its_logs_tail_and_spends_the_infrastructure_budget():
    hung = {"classification": "hung", "reason": "no new step for 46s: step 41 never finished"}
    job, decision = fold_finished(
        launched(fresh()),
        state=state("running"),
        record=None,
        progress={"last_step": 44, "committed_step": 40},
        budgets=BUDGETS,
        at="t",
        verdict=hung,
        logs_tail="rank 1: waiting in all_reduce",
    )
    entry = job["attempts"][0]
    assert (decision["action"], "delay_s" in decision, job["infra_failures"], job["preemptions"]) == (
        "relaunch",
        False,  # no back-off: a hang is the attempt's state, nothing has to clear
        1,
        0,
    )
    assert entry["classification"] == "hung" and entry["reason"] == hung["reason"]
    assert entry["logs_tail"] == "rank 1: waiting in all_reduce" and entry["steps_lost"] == 4
    job, decision = fold_finished(
        launched(job),
        state=state("running"),
        record=None,
        progress=None,
        budgets=BUDGETS,
        at="t",
        verdict=hung,
    )
    assert (decision["action"], job["infra_failures"], job["status"]) == ("fail", 2, "failed")
    assert "logs_tail" not in job["attempts"][1]


def test_a_deadline_records_the_attempt_as_a_timeout_with_its_last_state():
    job = abandon_attempt(
        launched(fresh()),
        reason="execution_timeout",
        at="t",
        classification="timeout",
        state=state("running"),
    )
    entry = job["attempts"][0]
    assert (job["status"], entry["classification"], entry["state"]["phase"]) == (
        "failed",
        "timeout",
        "running",
    )


def test_an_attempt_is_recorded_launching_before_its_launch_and_running_after_it():
    spec = JobSpec(name="train-0a1b2c3d-a1", args=["python", "-m", "trainer", "train"], nodes=2)
    job = intend_attempt(fresh(), spec=spec, manifests=[], at="2026-01-01T00:00:00+00:00", try_number=2)
    entry = job["attempts"][0]
    assert (entry["attempt"], entry["status"], entry["job_name"], entry["try_number"]) == (
        1,
        "launching",
        "train-0a1b2c3d-a1",
        2,
    )
    assert "job" not in entry and current_attempt(job) == entry
    with pytest.raises(ValueError, match="attempt 1 is still launching; it must end before attempt 2"):
        intend_attempt(job, spec=spec, manifests=[], at="t")
    handle = {"cluster": "local", "job_id": "train-0a1b2c3d-a1", "labels": {}}
    running = record_launched(job, attempt=1, handle=handle, at="2026-01-01T00:01:00+00:00")
    assert running["attempts"][0]["status"] == "running" and running["attempts"][0]["job"] == handle
    assert record_launched(running, attempt=1, handle=handle, at="later") is running  # twice: the same
    with pytest.raises(ValueError, match="attempt 1 already runs as train-0a1b2c3d-a1, not other"):
        record_launched(running, attempt=1, handle={**handle, "job_id": "other"}, at="t")
    with pytest.raises(ValueError, match="attempt 2 is not the current attempt of the record"):
        record_launched(running, attempt=2, handle=handle, at="t")


def test_a_record_of_the_previous_version_reads_as_launched_and_counts_from_attempt_one():
    old = launched(fresh())
    del old["attempts"][0]["status"]
    old = {**old, "preemptions": 2}
    del old["budget"]
    assert attempt_status(old["attempts"][0]) == "running"
    assert budget_window(old) == {"from_attempt": 1, "preemptions": 2, "infra_failures": 0}
    assert attempt_status({**old["attempts"][0], "ended_at": "t"}) == "ended"
    folded, decision = fold_finished(
        old, state=state(disruptions=[SPOT]), record=None, progress=None, budgets=BUDGETS, at="t"
    )
    assert decision["action"] == "fail" and folded["preemptions"] == 3  # 3 > 2: the old counts still hold


def test_a_restarted_run_drops_its_old_bill_and_keeps_its_attempts():
    from trainops.recovery.record import restart_record

    ended = {**launched(fresh()), "status": "succeeded", "cost": {"format": "trainops.cost/v1"}}
    again = restart_record(ended, capacity="on-demand")
    assert "cost" not in again and again["attempts"] == ended["attempts"]
    assert (again["status"], again["capacity"]) == ("running", "on-demand")
    assert "cost" in ended  # the record it came from is left as it was
