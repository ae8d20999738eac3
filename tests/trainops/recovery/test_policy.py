"""Recovery decisions: budgets, back-off and the move to on-demand."""

from trainops.recovery.policy import decide, infra_backoff_s, is_capacity_fallback


def test_preemption_budget():
    assert decide("preempted", preemptions=2, max_preemptions=2)["action"] == "relaunch"
    over = decide("preempted", preemptions=3, max_preemptions=2)
    assert over["action"] == "fail" and "budget of 2" in over["reason"]


def test_fallback_to_on_demand_after_n_preemptions():
    first = decide(
        "preempted", preemptions=1, max_preemptions=5, capacity="spot-then-on-demand", fallback_after=2
    )
    second = decide(
        "preempted", preemptions=2, max_preemptions=5, capacity="spot-then-on-demand", fallback_after=2
    )
    assert (first["capacity"], second["capacity"]) == ("spot-then-on-demand", "on-demand")


def test_error_fails_and_success_finishes_and_infra_retries():
    assert decide("error", preemptions=0, max_preemptions=3)["action"] == "fail"
    assert decide("succeeded", preemptions=1, max_preemptions=3)["action"] == "finish"
    assert decide("infra", preemptions=0, max_preemptions=3, infra_failures=1)["action"] == "relaunch"
    assert (
        decide("infra", preemptions=0, max_preemptions=3, infra_failures=3, max_infra_retries=2)["action"]
        == "fail"
    )


def test_infra_relaunch_backs_off_exponentially_with_a_cap():
    assert [infra_backoff_s(n) for n in (1, 2, 3, 10)] == [30, 60, 120, 600]
    assert decide("infra", preemptions=0, max_preemptions=3, infra_failures=2)["delay_s"] == 60
    assert "delay_s" not in decide("preempted", preemptions=1, max_preemptions=3)


def test_no_spot_capacity_moves_spot_then_on_demand_to_on_demand_without_back_off():
    moved = decide(
        "infra",
        preemptions=0,
        max_preemptions=3,
        infra_failures=0,
        max_infra_retries=0,
        capacity="spot-then-on-demand",
        unschedulable=True,
    )
    assert (moved["action"], moved["capacity"], moved.get("delay_s")) == ("relaunch", "on-demand", None)
    stays = decide(
        "infra",
        preemptions=0,
        max_preemptions=3,
        infra_failures=1,
        max_infra_retries=2,
        capacity="spot",
        unschedulable=True,
    )
    assert (stays["capacity"], stays["delay_s"]) == ("spot", 30)
    assert is_capacity_fallback("infra", {"unschedulable": True}, "spot-then-on-demand")
    assert not is_capacity_fallback("infra", {"unschedulable": True}, "on-demand")
    assert not is_capacity_fallback("infra", {"infra_reason": "ImagePullBackOff"}, "spot-then-on-demand")


def test_a_hang_relaunches_at_once_against_the_infrastructure_budget():
    again = decide("hung", preemptions=0, max_preemptions=3, infra_failures=2, max_infra_retries=2)
    assert again["action"] == "relaunch" and "delay_s" not in again
    assert "hung: infrastructure failure 2 of at most 2" in again["reason"]
    over = decide("hung", preemptions=0, max_preemptions=3, infra_failures=3, max_infra_retries=2)
    assert over["action"] == "fail" and "stuck collective" in over["reason"]
