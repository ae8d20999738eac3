"""One row per DAG run, for the home page: Airflow's record of the run (its state, its
times, the task that failed, its note) joined with what storage holds of its training
(:class:`~trainops.runs.outcome.RunFacts`), and so its outcome in the one vocabulary. A run
that failed before training (a bad setting, a missing dataset) has no storage at all and still
gets its row: ``failed at <task>``. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from trainops.runs.outcome import Outcome, RunFacts, outcome

# The trainops operators by class name: a DAG with a task of one of these is a trainops DAG.
OPERATORS = (
    "StageDatasetOperator",
    "FSDPTrainingOperator",
    "EvaluateCheckpointsOperator",
    "EvaluateModelOperator",
    "EvaluationGateOperator",
    "PromoteModelOperator",
    "RollbackModelOperator",
)


@dataclass(frozen=True)
class DagRunInfo:
    """A DAG run as Airflow's database has it."""

    dag_id: str
    run_id: str
    state: str  # queued, running, success, failed
    start: datetime | None = None
    end: datetime | None = None
    failed_task: str | None = None  # the first task that failed (by its end)
    note: str | None = None


@dataclass(frozen=True)
class DagRunRow:
    """One line of the home page's runs."""

    info: DagRunInfo
    outcome: Outcome
    facts: RunFacts | None  # the run's training, when storage has it


FAILED_PREFIX = "FAILED at "
REASON_LIMIT = 200


def failure_note(task_id: str, message: str) -> str:
    """The note a task leaves on its DAG run when it fails on its input (fail_fast): what
    :func:`dag_run_outcome` reads back as the reason."""
    first = (message.strip().splitlines() or [""])[0]
    return f"{FAILED_PREFIX}{task_id}: {first}"


def _note_reason(note: str | None, task: str | None) -> str | None:
    """The reason in the run's note: its ``FAILED at <task>:`` line when it has one."""
    for line in (note or "").splitlines():
        if line.startswith(f"{FAILED_PREFIX}{task}: "):
            return line[len(f"{FAILED_PREFIX}{task}: ") :][:REASON_LIMIT] or None
    return None


def dag_run_outcome(info: DagRunInfo, facts: RunFacts | None) -> Outcome:
    """The DAG run's outcome: its training's (:func:`outcome`) unless the run failed at a task
    other than training, or has no training yet."""
    trained = outcome(facts) if facts is not None and not facts.problem else None
    if trained is not None and trained.kind == "rejected":  # promote(on_rejection="fail") fails the run
        return trained
    if trained is not None and trained.kind == "running" and info.state in ("failed", "success"):
        where = info.failed_task or facts.task  # type: ignore[union-attr]
        return Outcome("failed", f"failed at {where}: the task ended while its training was still running")
    failed_elsewhere = info.state == "failed" and (
        facts is None or info.failed_task not in (None, facts.task)
    )
    if failed_elsewhere:
        where = info.failed_task or "a task"
        return Outcome(
            "failed", f"failed at {where}: {_note_reason(info.note, info.failed_task) or 'see its log'}"
        )
    if trained is not None:
        return trained
    if info.state in ("queued", "running"):
        return Outcome("running", "running: not training yet")
    if info.state == "success":
        return Outcome("succeeded", "succeeded (no training in this run)")
    return Outcome("unknown", f"state {info.state}")


def rows(infos: Sequence[DagRunInfo], facts: Mapping[tuple[str, str], RunFacts]) -> list[DagRunRow]:
    """A row per DAG run, newest first; ``facts`` by ``(dag_id, run_id)`` (Airflow's run id)."""
    ordered = sorted(infos, key=lambda i: (i.start is None, -(i.start.timestamp() if i.start else 0.0)))
    return [
        DagRunRow(
            info,
            dag_run_outcome(info, facts.get((info.dag_id, info.run_id))),
            facts.get((info.dag_id, info.run_id)),
        )
        for info in ordered
    ]
