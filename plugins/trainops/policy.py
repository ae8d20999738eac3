"""Failure classification and recovery policy: pure functions over plain data.

The cluster's view (job phase, node exit codes, disruptions such as a spot interruption or a
node that vanished) and the trainer's own attempt record together say what happened; exit
codes alone cannot, because torchrun exits 1 on SIGTERM whatever its workers did.
"""

from __future__ import annotations

SUCCEEDED, PREEMPTED, INFRA, ERROR = "succeeded", "preempted", "infra", "error"


def classify_attempt(state: dict, record: dict | None) -> dict:
    """Classify one finished attempt.

    :param state: the backend's final job state (``phase``, ``reason``, ``nodes``, ``disruptions``).
    :param record: the attempt record the trainer wrote, or None if it could not write one.
    :return: ``{"classification": ..., "reason": ...}``
    """
    outcome = (record or {}).get("outcome")
    disruptions = state.get("disruptions") or []
    if outcome == "completed":
        return {"classification": SUCCEEDED, "reason": "the trainer completed every step"}
    if outcome == "preempted":
        why = disruptions[0]["message"] if disruptions else f"the trainer received {record.get('signal') or 'a termination signal'}"
        return {"classification": PREEMPTED,
                "reason": f"{why}; emergency checkpoint at step {record.get('checkpoint_step')}"}
    if disruptions:
        d = disruptions[0]
        return {"classification": PREEMPTED,
                "reason": f"{d.get('reason')}: {d.get('message')} (no attempt record: the trainer had no time to save)"}
    if state.get("phase") == "lost":
        return {"classification": PREEMPTED,
                "reason": f"node lost: {state.get('reason')}"}
    if outcome == "failed":
        hint = record.get("hint")
        return {"classification": ERROR,
                "reason": f"{record.get('error') or 'the trainer failed'}" + (f"; hint: {hint}" if hint else "")}
    if state.get("infra_reason"):
        return {"classification": INFRA, "reason": state["infra_reason"]}
    codes = [n.get("exit_code") for n in state.get("nodes", [])]
    if state.get("phase") == "succeeded":
        return {"classification": ERROR,
                "reason": "the trainer exited 0 but wrote no attempt record; check the trainer version"}
    return {"classification": ERROR,
            "reason": f"the job failed without an attempt record (node exit codes {codes}): {state.get('reason') or 'see the node logs'}"}


def infra_backoff_s(failures: int, base_s: float = 30.0, cap_s: float = 600.0) -> float:
    """Seconds to wait before relaunching after the n-th infrastructure failure: 30, 60, 120, ...

    A failing image pull or a full node pool rarely clears at once; relaunching at once only
    burns the retry budget.
    """
    return min(cap_s, base_s * 2 ** max(0, failures - 1))


def is_capacity_fallback(classification: str, state: dict, capacity: str) -> bool:
    """True when spot capacity never came (pods unschedulable past the deadline) and the
    job may move to on-demand: that is a fallback, not an infrastructure failure to count."""
    return classification == INFRA and bool(state.get("unschedulable")) and capacity == "spot-then-on-demand"


def decide(classification: str, *, preemptions: int, max_preemptions: int,
           infra_failures: int = 0, max_infra_retries: int = 2,
           capacity: str = "spot", fallback_after: int | None = None,
           unschedulable: bool = False) -> dict:
    """What to do after an attempt: ``finish``, ``relaunch`` or ``fail``.

    :param preemptions: preemptions so far, this one included.
    :param infra_failures: infrastructure failures so far, this one included (a capacity
        fallback is not one, see ``is_capacity_fallback``).
    :param fallback_after: with capacity ``spot-then-on-demand``, move to on-demand after
        this many preemptions.
    :param unschedulable: the attempt's pods found no node before the deadline; with
        ``spot-then-on-demand`` the next attempt runs on-demand at once.
    :return: ``{"action", "capacity", "reason"}`` and, for a delayed relaunch, ``delay_s``;
        ``capacity`` is for the next attempt.
    """
    if is_capacity_fallback(classification, {"unschedulable": unschedulable}, capacity):
        return {"action": "relaunch", "capacity": "on-demand",
                "reason": "no spot capacity before the deadline: relaunching on on-demand nodes"}
    if classification == SUCCEEDED:
        return {"action": "finish", "capacity": capacity, "reason": "training completed"}
    if classification == PREEMPTED:
        if preemptions > max_preemptions:
            return {"action": "fail", "capacity": capacity,
                    "reason": f"preempted {preemptions} times, over the budget of {max_preemptions}; "
                              "raise max_preemptions or use capacity='spot-then-on-demand'"}
        next_capacity = capacity
        if capacity == "spot-then-on-demand" and fallback_after is not None and preemptions >= fallback_after:
            next_capacity = "on-demand"
        return {"action": "relaunch", "capacity": next_capacity,
                "reason": f"preemption {preemptions} of at most {max_preemptions}: relaunching to resume"}
    if classification == INFRA:
        if infra_failures > max_infra_retries:
            return {"action": "fail", "capacity": capacity,
                    "reason": f"{infra_failures} infrastructure failures, over the limit of {max_infra_retries}"}
        delay = infra_backoff_s(infra_failures)
        return {"action": "relaunch", "capacity": capacity, "delay_s": delay,
                "reason": f"infrastructure failure {infra_failures} of at most {max_infra_retries}: "
                          f"relaunching in {delay:.0f}s"}
    return {"action": "fail", "capacity": capacity, "reason": "the trainer failed; relaunching would fail again"}
