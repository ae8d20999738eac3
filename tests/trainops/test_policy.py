"""Classification and recovery decisions over recorded job states and attempt records."""

from trainer.contract import attempt_record
from trainops.policy import classify_attempt, decide, infra_backoff_s, is_capacity_fallback

RUNNING_NODES = [{"index": 0, "exit_code": 0}, {"index": 1, "exit_code": 1}]
SPOT = {"node": 1, "reason": "SpotInterruption", "message": "SIGTERM to node 1's torchrun at step 50"}


def record(outcome, **kw):
    base = dict(attempt=1, outcome=outcome, last_step=50, checkpoint_step=50, world_size=2)
    return attempt_record(**{**base, **kw})


def test_completed_record_is_success_even_if_torchrun_exit_barrier_failed():
    state = {"phase": "failed", "nodes": RUNNING_NODES, "disruptions": []}
    assert classify_attempt(state, record("completed"))["classification"] == "succeeded"


def test_preempted_record_with_cluster_disruption_names_both():
    state = {"phase": "failed", "nodes": RUNNING_NODES, "disruptions": [SPOT]}
    verdict = classify_attempt(state, record("preempted", signal="SIGTERM"))
    assert verdict["classification"] == "preempted"
    assert "step 50" in verdict["reason"] and "emergency checkpoint at step 50" in verdict["reason"]


def test_sigkill_without_record_but_with_disruption_is_preemption():
    state = {"phase": "failed", "nodes": [{"exit_code": -9}, {"exit_code": -9}], "disruptions": [SPOT]}
    verdict = classify_attempt(state, None)
    assert verdict["classification"] == "preempted"
    assert "no attempt record" in verdict["reason"]


def test_lost_node_is_preemption():
    assert classify_attempt({"phase": "lost", "reason": "gone", "nodes": []}, None)["classification"] == "preempted"


def test_failed_record_is_error_with_hint():
    rec = record("failed", error="FloatingPointError: loss is nan", hint="lower train.lr")
    verdict = classify_attempt({"phase": "failed", "nodes": RUNNING_NODES, "disruptions": []}, rec)
    assert verdict["classification"] == "error"
    assert "loss is nan" in verdict["reason"] and "lower train.lr" in verdict["reason"]


def test_nonzero_exit_without_record_is_error_naming_exit_codes():
    verdict = classify_attempt({"phase": "failed", "nodes": [{"exit_code": 1}, {"exit_code": 0}]}, None)
    assert verdict["classification"] == "error" and "[1, 0]" in verdict["reason"]


def test_infra_reason_is_infra():
    state = {"phase": "failed", "nodes": [], "infra_reason": "ImagePullBackOff"}
    assert classify_attempt(state, None)["classification"] == "infra"


def test_preemption_budget():
    assert decide("preempted", preemptions=2, max_preemptions=2)["action"] == "relaunch"
    over = decide("preempted", preemptions=3, max_preemptions=2)
    assert over["action"] == "fail" and "budget of 2" in over["reason"]


def test_fallback_to_on_demand_after_n_preemptions():
    first = decide("preempted", preemptions=1, max_preemptions=5, capacity="spot-then-on-demand", fallback_after=2)
    second = decide("preempted", preemptions=2, max_preemptions=5, capacity="spot-then-on-demand", fallback_after=2)
    assert (first["capacity"], second["capacity"]) == ("spot-then-on-demand", "on-demand")


def test_error_fails_and_success_finishes_and_infra_retries():
    assert decide("error", preemptions=0, max_preemptions=3)["action"] == "fail"
    assert decide("succeeded", preemptions=1, max_preemptions=3)["action"] == "finish"
    assert decide("infra", preemptions=0, max_preemptions=3, infra_failures=1)["action"] == "relaunch"
    assert decide("infra", preemptions=0, max_preemptions=3, infra_failures=3, max_infra_retries=2)["action"] == "fail"


def test_infra_relaunch_backs_off_exponentially_with_a_cap():
    assert [infra_backoff_s(n) for n in (1, 2, 3, 10)] == [30, 60, 120, 600]
    assert decide("infra", preemptions=0, max_preemptions=3, infra_failures=2)["delay_s"] == 60
    assert "delay_s" not in decide("preempted", preemptions=1, max_preemptions=3)


def test_no_spot_capacity_moves_spot_then_on_demand_to_on_demand_without_back_off():
    moved = decide("infra", preemptions=0, max_preemptions=3, infra_failures=0, max_infra_retries=0,
                   capacity="spot-then-on-demand", unschedulable=True)
    assert (moved["action"], moved["capacity"], moved.get("delay_s")) == ("relaunch", "on-demand", None)
    stays = decide("infra", preemptions=0, max_preemptions=3, infra_failures=1, max_infra_retries=2,
                   capacity="spot", unschedulable=True)
    assert (stays["capacity"], stays["delay_s"]) == ("spot", 30)
    assert is_capacity_fallback("infra", {"unschedulable": True}, "spot-then-on-demand")
    assert not is_capacity_fallback("infra", {"unschedulable": True}, "on-demand")
    assert not is_capacity_fallback("infra", {"infra_reason": "ImagePullBackOff"}, "spot-then-on-demand")
