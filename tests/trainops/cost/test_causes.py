"""Lost time by cause against the hand-computed run of ``fixtures.py`` (seconds after T0):
attempt 1 preempted (startup 60, productive 50, stall 4, replayed 10, shutdown 6, queued 30),
the operator relaunching 10 s after its end, attempt 2 completed (startup 40 of which the
restore takes what its record says, productive 70, stall 4, shutdown 10, queued 20); 8 GPUs."""

import copy

import pytest

from tests.trainops.cost.fixtures import (
    FIXTURE_PRICES,
    GPUS,
    P4D_SPOT,
    one_preemption_job,
    one_restart_job,
    one_rollback_job,
)
from trainops.cost.accounting import account
from trainops.cost.causes import CAUSES, lost_by_cause

SPOT_GPU_S = P4D_SPOT / GPUS / 3600  # USD per GPU-second


def by_cause(lost):
    return {c["cause"]: c for c in lost["causes"]}


def run(restore_s=None, emergency_save_s=None):
    job, metrics = one_preemption_job()
    job = copy.deepcopy(job)
    if restore_s is not None:
        job["attempts"][1]["record"]["restore_s"] = restore_s
    if emergency_save_s is not None:
        job["attempts"][0]["record"]["emergency_save_s"] = emergency_save_s
    return job, account(job, metrics, FIXTURE_PRICES)


def test_each_cause_in_gpu_seconds_and_money_as_computed_by_hand():
    job, cost = run(restore_s=5.0)
    lost = lost_by_cause(cost, job["attempts"])
    causes = by_cause(lost)
    assert [c["cause"] for c in lost["causes"]] == list(CAUSES)
    want_s = {
        "startup": 60 + (40 - 5),
        "restore": 5,
        # the stalls (4 + 4), and the completed attempt's final save and export (10)
        "checkpoint_save": 8 + 10,
        "lost_progress": 10,
        # the preempted attempt's shutdown: its emergency save failed, so none of it is a save
        "recovery": 6,
        "waiting_for_capacity": 0,
    }
    for cause, seconds in want_s.items():
        assert causes[cause]["seconds"] == pytest.approx(seconds), cause
        assert causes[cause]["gpu_s"] == pytest.approx(seconds * GPUS), cause
        assert causes[cause]["cost"] == pytest.approx(seconds * GPUS * SPOT_GPU_S), cause
    # not billed: queued 30 + 20 s, and 160 -> 170 s between attempt 1's end and attempt 2's launch
    assert causes["waiting_for_capacity"]["unbilled_gpu_s"] == pytest.approx(50 * GPUS)
    assert causes["recovery"]["unbilled_seconds"] == pytest.approx(10)
    assert causes["recovery"]["unbilled_gpu_s"] == pytest.approx(10 * GPUS)
    assert causes["waiting_for_capacity"]["cost"] == 0
    assert lost["notes"] == []


def test_the_causes_and_productive_time_add_up_to_the_bill():
    job, cost = run(restore_s=5.0, emergency_save_s=4.0)
    lost = lost_by_cause(cost, job["attempts"])
    assert lost["billed_gpu_s"] == pytest.approx(cost["billed_gpu_hours"] * 3600) == pytest.approx(254 * GPUS)
    assert lost["productive_gpu_s"] + sum(c["gpu_s"] for c in lost["causes"]) == pytest.approx(
        lost["billed_gpu_s"]
    )
    assert lost["productive_gpu_s"] == pytest.approx(cost["productive_gpu_hours"] * 3600)
    assert lost["unproductive_gpu_s"] == pytest.approx(lost["billed_gpu_s"] - lost["productive_gpu_s"])
    assert lost["productive_cost"] + lost["unproductive_cost"] == pytest.approx(cost["cost"])
    # the recorded emergency save moves 4 s of the preempted attempt's shutdown to saving
    causes = by_cause(lost)
    assert causes["checkpoint_save"]["seconds"] == pytest.approx(8 + 10 + 4)
    assert causes["recovery"]["seconds"] == pytest.approx(6 - 4)


def test_the_recovery_time_of_the_interruption_is_made_of_the_causes():
    job, cost = run(restore_s=5.0)
    causes = by_cause(lost_by_cause(cost, job["attempts"]))
    # signal at 152.5, next first step at 230: 1.5 s of replayed steps after the signal, the
    # shutdown (6), the relaunch gap (10), attempt 2's queue (20), startup (35) and restore (5)
    parts = 1.5 + causes["recovery"]["seconds"] + causes["recovery"]["unbilled_seconds"] + 20 + 35 + 5
    assert cost["recovery_s"] == [pytest.approx(parts)]


def test_a_resume_without_restore_s_leaves_its_load_in_startup_and_says_so():
    job, cost = run()
    lost = lost_by_cause(cost, job["attempts"])
    assert by_cause(lost)["restore"]["seconds"] == 0
    assert by_cause(lost)["startup"]["seconds"] == pytest.approx(100)
    assert lost["notes"] == [
        "attempt 2: resumed from step 50 but its record has no restore_s (a trainer from before it): "
        "its checkpoint load counts as startup"
    ]


def test_a_restore_longer_than_its_startup_is_clipped_so_nothing_counts_twice():
    job, cost = run(restore_s=500.0, emergency_save_s=600.0)
    causes = by_cause(lost_by_cause(cost, job["attempts"]))
    assert causes["restore"]["seconds"] == pytest.approx(40)
    assert causes["startup"]["seconds"] == pytest.approx(60)
    assert causes["recovery"]["seconds"] == 0
    assert causes["checkpoint_save"]["seconds"] == pytest.approx(8 + 10 + 6)


def test_a_failed_attempts_shutdown_is_recovery():
    job, cost = run(restore_s=5.0)
    cost["attempts"][0]["outcome"] = "failed"  # a hang: its shutdown is the wait to end it
    causes = by_cause(lost_by_cause(cost, job["attempts"]))
    assert causes["recovery"]["seconds"] == pytest.approx(6)
    assert causes["checkpoint_save"]["seconds"] == pytest.approx(8 + 10)


def test_a_damaged_stored_bill_counts_bad_values_as_zero():
    lost = lost_by_cause(
        {"attempts": [{"seconds": "x", "accelerators": True, "price": None}, "junk", {"spans": 3}]},
        [{"attempt": 1, "record": "x"}],
    )
    assert lost["billed_gpu_s"] == 0 and all(c["gpu_s"] == 0 for c in lost["causes"])


def test_an_in_place_restart_is_recovery_less_the_restarted_gangs_restore():
    job, metrics = one_restart_job()
    cost = account(job, metrics, FIXTURE_PRICES)
    lost = lost_by_cause(cost, job["attempts"])
    causes = by_cause(lost)
    want_s = {
        "startup": 30,  # the first incarnation resumed nothing
        "restore": 4,  # the restarted gang's load (the record's own restore_s), inside the restart
        "checkpoint_save": 4 + 6,  # the stalls, and the final save and export
        "lost_progress": 5,  # the steps the restart replayed
        "recovery": 13 - 4,  # the restart (67 -> 80) less its restore
        "waiting_for_capacity": 0,
    }
    assert {c: causes[c]["seconds"] for c in want_s} == pytest.approx(want_s)
    assert lost["productive_gpu_s"] + lost["unproductive_gpu_s"] == pytest.approx(lost["billed_gpu_s"])
    assert lost["billed_gpu_s"] == pytest.approx(108 * GPUS) and lost["notes"] == []


def test_restores_of_each_incarnation_go_where_they_happened():
    job, metrics = one_restart_job()
    record = job["attempts"][0]["record"]
    record["restarts"][0]["restore_s"] = 3.0  # the attempt itself resumed, in its startup
    record["restore_s"] = 20.0  # longer than the restart that holds it: clipped to it
    lost = lost_by_cause(account(job, metrics, FIXTURE_PRICES), job["attempts"])
    causes = by_cause(lost)
    assert (causes["startup"]["seconds"], causes["restore"]["seconds"]) == pytest.approx((27, 3 + 13))
    assert causes["recovery"]["seconds"] == pytest.approx(0)
    assert lost["productive_gpu_s"] + lost["unproductive_gpu_s"] == pytest.approx(lost["billed_gpu_s"])


def test_a_rollbacks_load_is_restore_and_the_steps_it_threw_away_are_lost_progress():
    job, metrics = one_rollback_job()
    cost = account(job, metrics, FIXTURE_PRICES)
    lost = lost_by_cause(cost, job["attempts"])
    causes = by_cause(lost)
    assert causes["restore"]["seconds"] == pytest.approx(3)  # the rollback's recorded load
    assert causes["lost_progress"]["seconds"] == pytest.approx(5)  # 11-15 and the wait
    assert lost["productive_gpu_s"] + lost["unproductive_gpu_s"] == pytest.approx(lost["billed_gpu_s"])
    # a load recorded longer than the phase is clipped to it: nothing counts twice
    job["attempts"][0]["record"]["rollbacks"][0]["restore_s"] = 60.0
    causes = by_cause(lost_by_cause(cost, job["attempts"]))
    assert (causes["restore"]["seconds"], causes["lost_progress"]["seconds"]) == (pytest.approx(8), 0)
