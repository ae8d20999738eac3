"""A run's lost time by cause: pure, over its bill (:mod:`trainops.cost.accounting`) and its
attempts' records, so that the report and ``trainops cost`` say what to fix, not only how much
was lost.

The bill already cuts each attempt's billed window into phases that tile it exactly. This view
re-labels those phases; it measures nothing again. Per attempt, in wall seconds:

- ``startup``: its ``startup`` phase (pod start to its first step, the first step's warm-up
  included) less its restore;
- ``restore``: the resume's checkpoint load, the attempt record's ``restore_s`` (the trainer
  times ``Checkpointer.load_latest``), no more than its startup, which holds it; and after each
  in-place restart the next incarnation's load (the ``restore_s`` of ``restarts`` after the
  first, and the record's own, the newest's), no more than the ``restart`` phase, which holds
  them; and each bad-loss rollback's load (the ``restore_s`` of its record's ``rollbacks``), no
  more than the ``rollback`` phase, which holds them. An attempt that resumed with no
  ``restore_s`` (a record from before it) leaves its load in startup, and ``notes`` says so;
- ``checkpoint_save``: its ``checkpoint_stall`` (the loop blocked by saves), plus the save part
  of its shutdown where it is known: a completed attempt's whole shutdown (its final checkpoint
  and export), an interrupted attempt's ``emergency_save_s`` (no more than its shutdown);
- ``lost_progress``: its ``replayed`` phase, the steps after its last committed checkpoint,
  trained again by the next attempt; and the rest of its ``rollback`` phase, the steps a
  bad-loss rollback threw away (and the wait for a save in flight before its load);
- ``recovery``: the rest of an interrupted (preempted or failed) attempt's shutdown: the drain
  after the signal, the wait for a hung or failed gang to be ended; and the rest of its
  ``restart`` phase, its restarts in place (the failure's detection, the workers' restart, the
  gang's re-forming), whatever became of the attempt. Beside it, not billed, the
  wall time from that attempt's end to the launch of the next one (the operator seeing the end
  and relaunching, its back-off) in ``unbilled_gpu_s``, counted on the next attempt's
  accelerators;
- ``waiting_for_capacity``: its ``queued`` phase (launch to pod start: unschedulable, held by
  Kueue). Not billed: its accelerator-seconds are in ``unbilled_gpu_s``, its cost is 0.

How they add up: for each attempt, ``productive`` + startup + restore + checkpoint_save +
lost_progress + recovery (their billed parts) = its billed seconds, exactly; times its
accelerators, the run's billed accelerator-seconds; priced at each attempt's own price per
GPU-hour (``AttemptCost.price``), its cost. So the causes' ``gpu_s`` sum to the bill's lost
GPU-seconds (billed less productive) and their ``cost`` to the bill's cost less the productive
part. Nothing is counted twice: each billed second lies in one phase, and each phase goes to one
cause, except startup, restart, rollback and shutdown, which are split at a recorded duration. The unbilled
accelerator-seconds (waiting and the relaunch gap) are outside the bill and outside that sum.

Each interruption's recovery time (``RunCost.recovery_s``, from the signal to the next first
step) spans several causes: its lost progress after the signal, its recovery, the gap, the
next attempt's waiting for capacity, startup and restore; an in-place restart's, its recovery
and restore.

The bill may be one stored in ``job.json`` by another version, so every value is read with a
check and a bad one counts as 0.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
import math
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from trainops.cost.accounting import PHASES
from trainops.cost.restarts import restores
from trainops.cost.rollbacks import restore_seconds

CAUSES = ("startup", "restore", "checkpoint_save", "lost_progress", "recovery", "waiting_for_capacity")
CAUSE_LABELS = {
    "startup": "startup",
    "restore": "restore (checkpoint load)",
    "checkpoint_save": "checkpoint save",
    "lost_progress": "lost progress (replayed or rolled-back steps)",
    "recovery": "recovery",
    "waiting_for_capacity": "waiting for capacity (not billed)",
}
_INTERRUPTED_NOT = ("completed", "running")


class CauseTime(TypedDict):
    """One cause over the run: ``seconds`` of wall time (billed, summed over attempts),
    ``gpu_s`` billed accelerator-seconds, ``cost`` their price, and ``unbilled_gpu_s`` the
    accelerator-seconds the run waited for without paying (waiting for capacity, the relaunch
    gap)."""

    cause: str
    seconds: float
    gpu_s: float
    cost: float
    unbilled_seconds: float
    unbilled_gpu_s: float


class LostTime(TypedDict):
    """A run's lost time by cause (:data:`CAUSES`, in that order), with what they add up to:
    ``productive_gpu_s`` + the causes' ``gpu_s`` (``unproductive_gpu_s``) = ``billed_gpu_s``;
    ``productive_cost`` + their ``cost`` (``unproductive_cost``) = ``cost`` (the bill's)."""

    causes: list[CauseTime]
    productive_gpu_s: float
    productive_cost: float
    billed_gpu_s: float
    unproductive_gpu_s: float
    unproductive_cost: float
    cost: float
    notes: list[str]


def _num(value: object) -> float:
    """``value`` as a finite number >= 0, else 0 (a stored bill may come from elsewhere)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return max(0.0, float(value))
    return 0.0


def _dicts(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _phases(attempt: Mapping[str, Any]) -> dict[str, float]:
    """The attempt's wall seconds by phase (a missing or bad one: 0)."""
    seconds = attempt.get("seconds")
    given: Mapping[str, Any] = seconds if isinstance(seconds, Mapping) else {}
    return {p: _num(given.get(p)) for p in PHASES}


def _price_per_gpu_s(attempt: Mapping[str, Any]) -> float:
    price = attempt.get("price")
    return _num(price.get("per_gpu_hour")) / 3600 if isinstance(price, Mapping) else 0.0


def _records(entries: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Each attempt's trainer record, by attempt number."""
    out: dict[int, Mapping[str, Any]] = {}
    for entry in entries:
        record = entry.get("record")
        number = entry.get("attempt")
        if isinstance(record, Mapping) and isinstance(number, int):
            out[number] = record
    return out


def attempt_causes(
    attempt: Mapping[str, Any], record: Mapping[str, Any], notes: list[str]
) -> dict[str, float]:
    """One attempt's billed wall seconds by cause (``waiting_for_capacity`` is its queued time,
    not billed), from its bill's phases and its trainer record.

    :param notes: where to say what is not known (appended to).
    """
    phase = _phases(attempt)
    outcome = attempt.get("outcome")
    at_startup, in_restarts = restores(record)
    restore = min(at_startup, phase["startup"])
    restarted = min(in_restarts, phase["restart"])  # each restart in place's own load
    reloaded = min(restore_seconds(record), phase["rollback"])  # each bad-loss rollback's load
    if (
        not record.get("restarts")
        and record.get("resumed_from_step") is not None
        and "restore_s" not in record
    ):
        notes.append(
            f"attempt {attempt.get('attempt')}: resumed from step {record.get('resumed_from_step')} but "
            "its record has no restore_s (a trainer from before it): its checkpoint load counts as startup"
        )
    if outcome == "completed":
        save_in_shutdown = phase["shutdown"]
    else:  # a running attempt has no shutdown yet; an interrupted one saved what it recorded
        save_in_shutdown = min(_num(record.get("emergency_save_s")), phase["shutdown"])
    return {
        "startup": phase["startup"] - restore,
        "restore": restore + restarted + reloaded,
        "checkpoint_save": phase["checkpoint_stall"] + save_in_shutdown,
        "lost_progress": phase["replayed"] + phase["rollback"] - reloaded,
        "recovery": phase["shutdown"] - save_in_shutdown + phase["restart"] - restarted,
        "waiting_for_capacity": phase["queued"],
    }


def _relaunch_gaps(attempts: list[Mapping[str, Any]]) -> list[float]:
    """Per attempt, the wall seconds from its end to the next attempt's launch (its first
    span's start) when it was interrupted; 0 for the last attempt or one that completed."""
    gaps = []
    for i, attempt in enumerate(attempts):
        if attempt.get("outcome") in _INTERRUPTED_NOT or i + 1 == len(attempts):
            gaps.append(0.0)
            continue
        later = attempts[i + 1]
        begins = [_num(s.get("start")) for s in _dicts(later.get("spans"))]
        launched = min(begins) if begins else _num(later.get("start"))
        gaps.append(max(0.0, launched - _num(attempt.get("end"))) if launched else 0.0)
    return gaps


def lost_by_cause(cost: Mapping[str, Any], entries: Iterable[Mapping[str, Any]]) -> LostTime:
    """The run's lost time by cause (module docstring), from its bill and its ``job.json``
    attempts (``job["attempts"]``: their trainer records say how long restores and emergency
    saves took).

    :param cost: a ``RunCost`` (:func:`trainops.cost.accounting.account`, or ``job.json``'s
        ``cost``).
    """
    attempts = _dicts(cost.get("attempts"))
    records = _records(entries)
    notes: list[str] = []
    fields = ("seconds", "gpu_s", "cost", "unbilled_seconds", "unbilled_gpu_s")
    totals = {c: dict.fromkeys(fields, 0.0) for c in CAUSES}
    productive_gpu_s = productive_cost = billed = total_cost = 0.0
    gaps = _relaunch_gaps(attempts)
    for i, attempt in enumerate(attempts):
        accelerators = _num(attempt.get("accelerators"))
        per_gpu_s = _price_per_gpu_s(attempt)
        number = attempt.get("attempt")
        by_cause = attempt_causes(attempt, records.get(number, {}) if isinstance(number, int) else {}, notes)
        for cause, wall in by_cause.items():
            if cause == "waiting_for_capacity":
                totals[cause]["unbilled_seconds"] += wall
                totals[cause]["unbilled_gpu_s"] += wall * accelerators
                continue
            totals[cause]["seconds"] += wall
            totals[cause]["gpu_s"] += wall * accelerators
            totals[cause]["cost"] += wall * accelerators * per_gpu_s
        if gaps[i]:  # the relaunch gap waits for the next attempt's accelerators
            later = _num(attempts[i + 1].get("accelerators"))
            totals["recovery"]["unbilled_seconds"] += gaps[i]
            totals["recovery"]["unbilled_gpu_s"] += gaps[i] * later
        productive = _phases(attempt)["productive"] * accelerators
        productive_gpu_s += productive
        productive_cost += productive * per_gpu_s
        billed += _num(attempt.get("billed_gpu_s"))
        total_cost += _num(attempt.get("cost"))
    causes: list[CauseTime] = [{"cause": c, **totals[c]} for c in CAUSES]  # type: ignore[typeddict-item]
    return {
        "causes": causes,
        "productive_gpu_s": productive_gpu_s,
        "productive_cost": productive_cost,
        "billed_gpu_s": billed,
        "unproductive_gpu_s": sum(c["gpu_s"] for c in causes),
        "unproductive_cost": sum(c["cost"] for c in causes),
        "cost": total_cost,
        "notes": list(dict.fromkeys(notes)),
    }
