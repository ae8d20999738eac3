"""The training run's ``job.json``: every attempt, what became of it and what was decided.

The record is a fold over attempts. The operator starts it, appends each attempt it launches,
folds in each attempt that finished (classification, recovery decision, counters, steps lost,
node types) and writes the result; these functions only compute the next record from the
last one, so the bookkeeping is tested over plain data. The report pages and the cost
accounting read the same fields back.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast

from trainer.contract import earlier_incarnations
from trainops.cluster.base import JobHandle, JobState
from trainops.recovery.classify import (
    HUNG,
    INFRA,
    PREEMPTED,
    AttemptRecord,
    Classification,
    Verdict,
    classify_attempt,
)
from trainops.recovery.policy import Decision, decide, is_capacity_fallback

if TYPE_CHECKING:
    from trainops.cluster.spec import JobSpec

Status = Literal["running", "succeeded", "failed"]
# An attempt is ``launching`` from the moment its intent is written, before ``launch`` is
# called: a retry that finds it so either finds its job live (and reattaches) or launches it.
AttemptStatus = Literal["launching", "running", "ended"]


class NodeType(TypedDict):
    """The machine one node of an attempt ran on: the raw material of the cost report."""

    index: int | None
    node_name: str | None
    instance_type: str | None
    capacity_type: str | None


class AttemptEntry(TypedDict):
    """One attempt in ``job.json``: what was launched, and, once it ended, what happened.

    ``manifests`` are the Kubernetes objects submitted (references to secrets only, never
    their values); ``record`` is the trainer's own attempt record (None: it wrote none, for
    example when it was SIGKILLed). ``status`` is ``launching`` until the backend's handle is
    recorded in ``job`` (an entry written before this field existed has none: see
    :func:`attempt_status`); ``job_name`` is the attempt's deterministic job name and
    ``try_number`` the Airflow try that launched it."""

    attempt: int
    job: NotRequired[JobHandle]
    status: NotRequired[AttemptStatus]
    job_name: NotRequired[str]
    try_number: NotRequired[int | None]
    capacity: str
    nodes: int
    gpus_per_node: int
    args: list[str]
    spec: dict[str, Any]
    manifests: list[dict[str, Any]]
    launched_at: str
    ended_at: NotRequired[str]
    state: NotRequired[JobState]
    record: NotRequired[dict[str, Any] | None]
    steps_lost: NotRequired[int]
    node_types: NotRequired[list[NodeType]]
    decision: NotRequired[Decision]
    classification: NotRequired[Classification]
    reason: NotRequired[str | None]
    logs_tail: NotRequired[str | None]  # the last log lines, kept before the job (and its pods) is deleted


class BudgetWindow(TypedDict):
    """What the current run of the task has spent: the preemptions and infrastructure failures
    of the attempts from ``from_attempt`` on. A clear or re-run opens a new window
    (:func:`restart_record`), so it spends nothing of an earlier run's budget."""

    from_attempt: int
    preemptions: int
    infra_failures: int


class AirflowRun(TypedDict):
    """The task instance that owns the run, as Airflow names it: the storage path holds the
    ids made safe for a path (``trainer.contract.safe_segment``), which the Airflow UI's URL
    of the run cannot be rebuilt from."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int


class JobRecord(TypedDict):
    """A training run's ``job.json``. ``capacity`` is the next attempt's (it moves to
    on-demand on a fallback); ``preemptions`` and ``infra_failures`` are the totals over every
    run of the task, for the report; ``budget`` is what counts against the budgets (a capacity
    fallback is not an infrastructure failure). A record written before ``budget`` existed
    counts from attempt 1 (:func:`budget_window`). ``cost`` is the run's bill
    (``trainops.cost.accounting.RunCost``), written when the run ends; a record from before it
    has none. ``airflow`` names the task instance that wrote the record (a record from before
    it has none)."""

    run_uri: str
    config_uri: str
    cluster: str
    capacity: str
    preemptions: int
    infra_failures: int
    status: Status
    attempts: list[AttemptEntry]
    budget: NotRequired[BudgetWindow]
    cost: NotRequired[dict[str, Any]]
    airflow: NotRequired[AirflowRun]


class Progress(TypedDict):
    """What storage shows of an attempt that left no record: the last step it logged to
    ``metrics.jsonl`` and the newest committed checkpoint's step (0: none)."""

    last_step: int
    committed_step: int


class Budgets(TypedDict):
    """The operator's recovery settings (see :func:`trainops.recovery.policy.decide`)."""

    max_preemptions: int
    max_infra_retries: int
    fallback_after: int | None


def start_record(
    *, run_uri: str, config_uri: str, cluster: str, capacity: str, owner: AirflowRun | None = None
) -> JobRecord:
    """The record of a run that has launched nothing yet; ``owner``: the task instance that
    creates it, the only one that may use the run folder (:func:`owner_refusal`)."""
    job: JobRecord = {
        "run_uri": run_uri,
        "config_uri": config_uri,
        "cluster": cluster,
        "capacity": capacity,
        "preemptions": 0,
        "infra_failures": 0,
        "status": "running",
        "attempts": [],
        "budget": {"from_attempt": 1, "preemptions": 0, "infra_failures": 0},
    }
    if owner is not None:
        job["airflow"] = owner
    return job


class RunFolderTaken(ValueError):
    """A run folder's ``job.json`` names another task instance as its owner."""


def describe_owner(owner: AirflowRun) -> str:
    """``dag 'd', run 'r', task 't'`` (and the map index of a mapped task), the exact ids."""
    text = f"dag {owner.get('dag_id')!r}, run {owner.get('run_id')!r}, task {owner.get('task_id')!r}"
    index = owner.get("map_index")
    return f"{text}, map index {index}" if isinstance(index, int) and index >= 0 else text


def owner_refusal(job: JobRecord, claimant: AirflowRun, uri: str) -> str | None:
    """Why ``claimant`` may not write the run folder whose ``job.json`` (at ``uri``) is ``job``,
    or None when it may: it owns the record, or the record is from before owners were kept.

    Run folders map the exact ids injectively (``trainer.contract.safe_segment``), so another
    owner means ids that still meet in one folder (a task ``g.3`` and task ``g``'s map index 3)
    or a folder written by hand: resuming its checkpoints would ship another run's model."""
    owner = job.get("airflow")
    if owner is None:
        return None
    if [owner.get("dag_id"), owner.get("run_id"), owner.get("task_id"), owner.get("map_index")] == [
        claimant["dag_id"],
        claimant["run_id"],
        claimant["task_id"],
        claimant["map_index"],
    ]:
        return None
    return (
        f"{uri} belongs to {describe_owner(owner)}, not to this task ({describe_owner(claimant)}): "
        "two runs never share a run folder, so this one trains nothing there; trigger the run with "
        "another run id, or move that folder aside if it is stale"
    )


def budget_window(job: JobRecord) -> BudgetWindow:
    """What the current run of the task has spent (a record without a window: everything)."""
    return job.get("budget") or {
        "from_attempt": 1,
        "preemptions": job["preemptions"],
        "infra_failures": job["infra_failures"],
    }


def restart_record(job: JobRecord, *, capacity: str) -> JobRecord:
    """``job`` as a new run of the task starts on it (a clear or re-run after it finished):
    running again, on the operator's ``capacity``, with a budget window that opens at the next
    attempt. The attempts and the totals stay, for the report; the bill (``cost``) goes, to be
    made again, over every attempt, when this run ends."""
    restarted: JobRecord = {
        **job,
        "status": "running",
        "capacity": capacity,
        "budget": {"from_attempt": next_attempt(job), "preemptions": 0, "infra_failures": 0},
    }
    restarted.pop("cost", None)
    return restarted


def as_job_record(data: object, uri: str) -> JobRecord:
    """``data`` read from ``uri`` as a :class:`JobRecord`, or ValueError saying what is off."""
    missing = (
        sorted(set(JobRecord.__required_keys__) - set(data))
        if isinstance(data, dict)
        else sorted(JobRecord.__required_keys__)
    )
    if not isinstance(data, dict) or missing or not isinstance(data.get("attempts"), list):
        raise ValueError(
            f"{uri} is not a trainops job record (missing {missing or ['a list of attempts']}); "
            "move it aside to start the run's bookkeeping afresh"
        )
    return cast(JobRecord, data)


def next_attempt(job: JobRecord) -> int:
    """The number of the attempt to launch next (1-based)."""
    return len(job["attempts"]) + 1


def attempt_status(entry: AttemptEntry) -> AttemptStatus:
    """Where ``entry`` stands: ``ended`` once it has ``ended_at`` (whichever fold wrote it),
    else its ``status``; an entry written before ``status`` existed was launched."""
    if "ended_at" in entry:
        return "ended"
    return entry.get("status") or "running"


def current_attempt(job: JobRecord) -> AttemptEntry | None:
    """The newest attempt while it has not ended (``launching`` or ``running``), else None."""
    if job["attempts"] and attempt_status(job["attempts"][-1]) != "ended":
        return job["attempts"][-1]
    return None


def intend_attempt(
    job: JobRecord,
    *,
    spec: "JobSpec",
    manifests: list[dict[str, Any]],
    at: str,
    try_number: int | None = None,
) -> JobRecord:
    """``job`` with attempt :func:`next_attempt` recorded as ``launching`` as ``spec``: written
    before ``launch`` is called, so no job can be live that ``job.json`` does not name.

    :param try_number: the Airflow try that launches it (for the report).
    """
    current = current_attempt(job)
    if current is not None:
        raise ValueError(
            f"attempt {current['attempt']} is still {attempt_status(current)}; "
            f"it must end before attempt {next_attempt(job)} is launched"
        )
    entry: AttemptEntry = {
        "attempt": next_attempt(job),
        "status": "launching",
        "job_name": spec.name,
        "try_number": try_number,
        "capacity": job["capacity"],
        "nodes": spec.nodes,
        "gpus_per_node": spec.gpus_per_node,
        "args": list(spec.args),
        "spec": spec.to_dict(),
        "manifests": manifests,
        "launched_at": at,
    }
    return {**job, "attempts": [*job["attempts"], entry]}


def record_launched(job: JobRecord, *, attempt: int, handle: JobHandle, at: str) -> JobRecord:
    """``job`` with attempt ``attempt`` (``launching``, or ``running`` on this same job)
    running as ``handle``, launched at ``at``. The same call twice gives the same record.

    :raises ValueError: ``attempt`` is not the current attempt, or it runs as another job.
    """
    current = current_attempt(job)
    if current is None or current["attempt"] != attempt:
        raise ValueError(
            f"attempt {attempt} is not the current attempt of the record "
            f"({'none' if current is None else current['attempt']}); not recording {handle['job_id']}"
        )
    if attempt_status(current) == "running":
        if current.get("job", {}).get("job_id") != handle["job_id"]:
            raise ValueError(
                f"attempt {attempt} already runs as {current.get('job', {}).get('job_id')}, "
                f"not {handle['job_id']}"
            )
        return job
    entry: AttemptEntry = {**current, "status": "running", "job": handle, "launched_at": at}
    return {**job, "attempts": [*job["attempts"][:-1], entry]}


def append_attempt(
    job: JobRecord, *, spec: "JobSpec", handle: JobHandle, manifests: list[dict[str, Any]], at: str
) -> JobRecord:
    """``job`` with attempt :func:`next_attempt` launched at ``at`` as ``spec`` (``handle``):
    :func:`intend_attempt` then :func:`record_launched` in one step."""
    intended = intend_attempt(job, spec=spec, manifests=manifests, at=at)
    return record_launched(intended, attempt=next_attempt(job), handle=handle, at=at)


def node_types(state: JobState) -> list[NodeType]:
    """Per node of a finished attempt: instance type and capacity type, when the backend knows
    them (Kubernetes, with permission to read nodes)."""
    return [
        {
            "index": n.get("index"),
            "node_name": n.get("node_name"),
            "instance_type": n.get("instance_type"),
            "capacity_type": n.get("capacity_type"),
        }
        for n in state.get("nodes") or []
        if n.get("instance_type") or n.get("capacity_type")
    ]


def restarts_steps_lost(record: Mapping[str, Any] | None) -> int:
    """Steps the attempt's earlier incarnations lost to its in-place restarts (its record's
    ``restarts``: each restart resumed from the newest checkpoint and replayed the steps after
    it); 0 without any."""
    lost = [e.get("steps_lost") for e in earlier_incarnations(record)]
    return sum(n for n in lost if isinstance(n, int) and not isinstance(n, bool) and n > 0)


def steps_lost(record: AttemptRecord | None, progress: Progress | None) -> int:
    """Steps the attempt trained after a committed checkpoint and threw away: those after its
    last one (the next attempt replays them) and those its in-place restarts replayed. From the
    trainer's record; without one (SIGKILL), from what storage shows."""
    if record is not None:
        return int(record["steps_lost"]) + restarts_steps_lost(record)
    if progress is None:
        return 0
    return max(0, progress["last_step"] - progress["committed_step"])


def fold_finished(
    job: JobRecord,
    *,
    state: JobState,
    record: AttemptRecord | None,
    progress: Progress | None,
    budgets: Budgets,
    at: str,
    verdict: Verdict | None = None,
    logs_tail: str | None = None,
) -> tuple[JobRecord, Decision]:
    """Fold the newest attempt's end into ``job``: classify it, count it against its budget,
    decide what comes next, and record all of that in its entry.

    :param state: the backend's final state of the attempt.
    :param record: the trainer's attempt record, or None if it wrote none.
    :param progress: what storage shows of an attempt without a record (None: nothing).
    :param at: when the attempt was seen to end (ISO 8601).
    :param verdict: the classification when the operator ended the attempt itself (``hung``:
        it counts against the infrastructure budget); None: classified from ``state``.
    :param logs_tail: the attempt's last log lines, kept in its entry (they go with the pods).
    :return: the new record (``status`` set when the run is over, ``capacity`` moved when the
        next attempt runs elsewhere) and the decision to act on. The budgets count the
        attempts of this run of the task only (:func:`budget_window`).
    """
    *earlier, entry = job["attempts"]
    verdict = classify_attempt(state, record, logs_tail) if verdict is None else verdict
    kind = verdict["classification"]
    fallback = is_capacity_fallback(kind, state, job["capacity"])
    preempted = int(kind == PREEMPTED)
    infra = int((kind == INFRA and not fallback) or kind == HUNG)  # a hang spends the infra budget
    window = budget_window(job)
    spent: BudgetWindow = {
        "from_attempt": window["from_attempt"],
        "preemptions": window["preemptions"] + preempted,
        "infra_failures": window["infra_failures"] + infra,
    }
    decision = decide(
        kind,
        preemptions=spent["preemptions"],
        max_preemptions=budgets["max_preemptions"],
        infra_failures=spent["infra_failures"],
        max_infra_retries=budgets["max_infra_retries"],
        capacity=job["capacity"],
        fallback_after=budgets["fallback_after"],
        unschedulable=bool(state.get("unschedulable")),
    )
    ended: AttemptEntry = {
        **entry,
        "status": "ended",
        "ended_at": at,
        "state": state,
        "record": dict(record) if record is not None else None,
        "steps_lost": steps_lost(record, progress),
        "node_types": node_types(state),
        "decision": decision,
        "classification": kind,
        "reason": verdict["reason"],
    }
    if logs_tail is not None:
        ended["logs_tail"] = logs_tail
    folded: JobRecord = {
        **job,
        "preemptions": job["preemptions"] + preempted,
        "infra_failures": job["infra_failures"] + infra,
        "budget": spent,
        "attempts": [*earlier, ended],
    }
    if decision["action"] == "relaunch":
        folded["capacity"] = decision["capacity"]
    else:
        folded["status"] = "succeeded" if decision["action"] == "finish" else "failed"
    return folded, decision


def abandon_attempt(
    job: JobRecord,
    *,
    reason: str | None,
    at: str,
    classification: Classification = "error",
    state: JobState | None = None,
) -> JobRecord:
    """``job`` after its newest attempt was ended without finishing (``timeout``: job_timeout
    or the task's execution_timeout): the attempt is recorded as ``classification`` with
    ``reason`` (and ``state`` as last seen, when known) and the run as failed."""
    *earlier, entry = job["attempts"]
    ended: AttemptEntry = {
        **entry,
        "status": "ended",
        "ended_at": at,
        "classification": classification,
        "reason": reason,
    }
    if state is not None:
        ended["state"] = state
    return {**job, "status": "failed", "attempts": [*earlier, ended]}


def mark_failed(job: JobRecord) -> JobRecord:
    """``job`` with the run failed and its attempts as they were (no relaunch came)."""
    return {**job, "status": "failed"}


def total_steps_lost(job: JobRecord) -> int:
    """Steps lost over every attempt of the run."""
    return sum(a.get("steps_lost") or 0 for a in job["attempts"])


def total_restarts_in_place(job: Mapping[str, Any]) -> int:
    """Restarts in place over every attempt of the run (torchrun's, one per earlier incarnation
    in an attempt's record); a damaged entry counts nothing."""
    attempts = job.get("attempts")
    entries = [a for a in attempts if isinstance(a, Mapping)] if isinstance(attempts, list) else []
    return sum(len(earlier_incarnations(a.get("record"))) for a in entries)
