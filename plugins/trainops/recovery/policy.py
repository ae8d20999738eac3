"""The recovery policy: after a classified attempt, finish, relaunch (when, on what capacity)
or fail. Pure; preemptions and infrastructure failures have budgets of their own, separate
from Airflow's retries."""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from trainops.recovery.classify import HUNG, INFRA, PREEMPTED, SUCCEEDED

Action = Literal["finish", "relaunch", "fail"]


class Decision(TypedDict):
    """What to do after an attempt. ``capacity`` is for the next attempt; ``delay_s``, when
    set, is how long to wait before relaunching (an infrastructure back-off)."""

    action: Action
    capacity: str
    reason: str
    delay_s: NotRequired[float]


def infra_backoff_s(failures: int, base_s: float = 30.0, cap_s: float = 600.0) -> float:
    """Seconds to wait before relaunching after the n-th infrastructure failure: 30, 60, 120, ...

    A failing image pull or a full node pool rarely clears at once; relaunching at once only
    burns the retry budget.
    """
    return float(min(cap_s, base_s * 2 ** max(0, failures - 1)))


def is_capacity_fallback(classification: str, state: Mapping[str, Any], capacity: str) -> bool:
    """True when spot capacity never came (pods unschedulable past the deadline) and the
    job may move to on-demand: that is a fallback, not an infrastructure failure to count."""
    return classification == INFRA and bool(state.get("unschedulable")) and capacity == "spot-then-on-demand"


def decide(
    classification: str,
    *,
    preemptions: int,
    max_preemptions: int,
    infra_failures: int = 0,
    max_infra_retries: int = 2,
    capacity: str = "spot",
    fallback_after: int | None = None,
    unschedulable: bool = False,
) -> Decision:
    """What to do after an attempt: ``finish``, ``relaunch`` or ``fail``.

    :param preemptions: preemptions so far, this one included.
    :param infra_failures: infrastructure failures so far, this one included (a capacity
        fallback is not one, see ``is_capacity_fallback``; a hung attempt is one).
    :param fallback_after: with capacity ``spot-then-on-demand``, move to on-demand after
        this many preemptions.
    :param unschedulable: the attempt's pods found no node before the deadline; with
        ``spot-then-on-demand`` the next attempt runs on-demand at once.
    :return: the :class:`Decision`; ``delay_s`` only for a delayed relaunch.
    """
    if is_capacity_fallback(classification, {"unschedulable": unschedulable}, capacity):
        return {
            "action": "relaunch",
            "capacity": "on-demand",
            "reason": "no spot capacity before the deadline: relaunching on on-demand nodes",
        }
    if classification == SUCCEEDED:
        return {"action": "finish", "capacity": capacity, "reason": "training completed"}
    if classification == PREEMPTED:
        if preemptions > max_preemptions:
            return {
                "action": "fail",
                "capacity": capacity,
                "reason": f"preempted {preemptions} times, over the budget of {max_preemptions}; "
                "raise max_preemptions or use capacity='spot-then-on-demand'",
            }
        next_capacity = capacity
        if capacity == "spot-then-on-demand" and fallback_after is not None and preemptions >= fallback_after:
            next_capacity = "on-demand"
        return {
            "action": "relaunch",
            "capacity": next_capacity,
            "reason": f"preemption {preemptions} of at most {max_preemptions}: relaunching to resume",
        }
    if classification == HUNG:  # the infrastructure's budget; no back-off: nothing needs to clear
        if infra_failures > max_infra_retries:
            return {
                "action": "fail",
                "capacity": capacity,
                "reason": f"{infra_failures} infrastructure failures (hangs included), over the limit of "
                f"{max_infra_retries}; if every attempt hangs at the same step, look for a stuck collective "
                "in the logs tail",
            }
        return {
            "action": "relaunch",
            "capacity": capacity,
            "reason": f"hung: infrastructure failure {infra_failures} of at most {max_infra_retries}: "
            "relaunching the whole gang once its pods are gone",
        }
    if classification == INFRA:
        if infra_failures > max_infra_retries:
            return {
                "action": "fail",
                "capacity": capacity,
                "reason": f"{infra_failures} infrastructure failures, over the limit of {max_infra_retries}",
            }
        delay = infra_backoff_s(infra_failures)
        return {
            "action": "relaunch",
            "capacity": capacity,
            "delay_s": delay,
            "reason": f"infrastructure failure {infra_failures} of at most {max_infra_retries}: "
            f"relaunching in {delay:.0f}s",
        }
    return {
        "action": "fail",
        "capacity": capacity,
        "reason": "the trainer failed; relaunching would fail again",
    }
