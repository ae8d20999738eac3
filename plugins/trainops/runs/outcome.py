"""A run's outcome in one vocabulary, a pure function of what storage holds about it:

- ``promoted vN``
- ``rejected: <check> (observed <x>, expected <y>)``
- ``identical to production vN``
- ``failed at train: <reason>``
- ``running: step s/t, about <eta> left``
- ``approved, not promoted`` (the promote task has not run, or was skipped), ``trained, not
  evaluated`` (no gate decision yet).

The kind (``promoted``, ``rejected``, ...) is for colours and ``--json``; the text is what a
person reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainops.gate.checks import failed_checks
from trainops.gate.verdict import check_line

PROMOTION_FORMAT = "trainops.promotion-outcome/v1"


@dataclass(frozen=True)
class RunFacts:
    """What storage says about one training run (``<root>/runs/<dag>/<run>/<task>``)."""

    run_uri: str
    dag_id: str
    run_id: str
    task: str = "train"
    status: str | None = None  # job.json's: running, succeeded, failed
    failure: str | None = None  # why the last attempt ended the run, when it failed
    step: int | None = None
    max_steps: int | None = None
    eta_s: float | None = None
    gate: Mapping[str, Any] | None = None  # eval/gate.json
    promotion: Mapping[str, Any] | None = None  # eval/promotion.json
    promoted_version: int | None = None  # the production history's version for this run
    model_name: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    cost: float | None = None
    attempts: int = 0
    problem: str | None = None  # job.json could not be read
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    kind: str  # promoted, rejected, identical, failed, running, approved, trained, unknown
    text: str


def about(seconds: float) -> str:
    """A rough span for a person: ``45 s``, ``12 min``, ``3 h 5 min``."""
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if seconds < 3570:
        return f"{seconds / 60:.0f} min"
    hours, rest = divmod(round(seconds / 60), 60)
    return f"{hours} h {rest} min"


def _running(facts: RunFacts) -> str:
    if facts.step is None:
        return "running: no step logged yet"
    text = f"running: step {facts.step}" + (f"/{facts.max_steps}" if facts.max_steps else "")
    if facts.eta_s is not None:
        text += f", about {about(facts.eta_s)} left"
    return text


def outcome(facts: RunFacts) -> Outcome:
    """The run's outcome (see the module docstring)."""
    if facts.problem:
        return Outcome("unknown", f"unreadable: {facts.problem}")
    if facts.promoted_version is not None:
        return Outcome("promoted", f"promoted v{facts.promoted_version}")
    promotion = facts.promotion or {}
    if promotion.get("outcome") == "identical":
        return Outcome("identical", f"identical to production v{promotion.get('version')}")
    if promotion.get("outcome") == "promoted" and isinstance(promotion.get("version"), int):
        return Outcome("promoted", f"promoted v{promotion['version']}")
    if facts.status == "running":
        return Outcome("running", _running(facts))
    if facts.status == "failed":
        return Outcome("failed", f"failed at {facts.task}: {facts.failure or 'see its log'}")
    gate = facts.gate
    if gate is not None and gate.get("approved") is False:
        failed = failed_checks(gate)
        if not failed:
            return Outcome("rejected", "rejected by the gate")
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        return Outcome("rejected", f"rejected: {check_line(failed[0])}{more}")
    if promotion.get("outcome") == "regate_rejected":
        return Outcome(
            "rejected", "rejected on re-gate: production moved on and the candidate no longer passed"
        )
    if gate is not None:
        return Outcome("approved", "approved, not promoted")
    if facts.status == "succeeded":
        return Outcome("trained", "trained, not evaluated")
    return Outcome("unknown", f"status {facts.status or 'unknown'}")
