"""The recovery loop of the training operator as one pure step: after every event the operator
handles, what becomes of ``job.json`` and what the operator does next.

The operator reads (its context, storage, the cluster) and acts (defer, launch, delete, raise,
XCom); :func:`step` decides, composing the pure pieces: the classification
(:mod:`~trainops.recovery.classify`) and the policy (:mod:`~trainops.recovery.policy`) through
the record's fold (:mod:`~trainops.recovery.record`), and the plan of a try that (re)starts
(:mod:`~trainops.recovery.resume`). Every decision is tested over plain data.

Events (what happened), by the operator method that meets them:

- ``execute``: :class:`TryStarted` once the record is claimed, then :class:`LiveJobs`;
- ``execute_complete``: :class:`WaitEnded` (the job trigger's event, with what the operator
  read for it: the trainer's attempt record, its progress, the log tail);
- ``relaunch_when_gone``: :class:`Retired` (the gone trigger's event), then :class:`LiveJobs`;
- ``record_abandoned``: :class:`DeferralFailed` (Airflow's deferral timeout won).

Actions (what the operator does next): :class:`FindLiveJobs`, :class:`Wait`, :class:`Launch`,
:class:`Relaunch` (delete a job, wait until it is gone, resume: a relaunch, on on-demand
capacity after a fallback, or retiring an older attempt's job), :class:`Succeed`,
:class:`Fail`, :class:`LeaveRunning` (watching failed, not the job) and :class:`Done`.
"""

# No ``from __future__ import annotations``: the TypedDicts read their annotations at run time.
from dataclasses import dataclass
from typing import Literal

from trainops.cluster.base import JobHandle
from trainops.recovery.classify import HUNG, TIMEOUT, AttemptRecord
from trainops.recovery.record import (
    Budgets,
    JobRecord,
    Progress,
    abandon_attempt,
    attempt_status,
    fold_finished,
    mark_failed,
    restart_record,
)
from trainops.recovery.resume import resume_plan
from trainops.triggers.events import JobEvent

# -- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TryStarted:
    """A try of the task starts (``execute``) on the record it claimed."""


@dataclass(frozen=True)
class Retired:
    """The wait for a deleted job ended (``relaunch_when_gone``): ``gone``, or not."""

    event: JobEvent


@dataclass(frozen=True)
class LiveJobs:
    """What the operator found when asked (:class:`FindLiveJobs`): the task's live jobs, and
    whether the job it was asked about may still have a process or pod."""

    live: tuple[JobHandle, ...]
    last_alive: bool = False


@dataclass(frozen=True)
class WaitEnded:
    """The wait for an attempt ended (``execute_complete``) with ``event``; for a ``finished``
    or ``hung`` event, with what the operator read of the attempt.

    :param record: the trainer's attempt record (from storage, else from its log); None: none.
    :param progress: what storage shows of an attempt without a record.
    :param logs_tail: the attempt's last log lines (None: not read).
    :param kept_tail: ``logs_tail`` as job.json keeps it (clipped).
    """

    event: JobEvent
    record: AttemptRecord | None = None
    progress: Progress | None = None
    logs_tail: str | None = None
    kept_tail: str | None = None


@dataclass(frozen=True)
class DeferralFailed:
    """Airflow failed the deferral (``why``) and the task's live jobs were deleted."""

    why: str
    cluster: str


Event = TryStarted | Retired | LiveJobs | WaitEnded | DeferralFailed

# -- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FindLiveJobs:
    """Find the task's live jobs (and whether ``alive_check``'s processes or pods may still
    run, when set), then step again with :class:`LiveJobs`."""

    alive_check: JobHandle | None = None


@dataclass(frozen=True)
class Wait:
    """Wait for ``handle``, attempt ``attempt``'s job (recorded as launched first; with
    ``adopt``, its entry written first too), and step again when the wait ends."""

    handle: JobHandle
    attempt: int
    adopt: bool = False


@dataclass(frozen=True)
class Launch:
    """Launch attempt ``attempt`` (its intent recorded first), then wait for it."""

    attempt: int


@dataclass(frozen=True)
class Relaunch:
    """Delete ``retire`` and, once every pod of it is gone and ``delay_s`` (a back-off) is over,
    resume (``relaunch_when_gone``). ``capacity`` is the next attempt's: ``on-demand`` after a
    fallback."""

    retire: JobHandle
    capacity: str
    reason: str
    delay_s: float | None = None


@dataclass(frozen=True)
class Succeed:
    """Training completed: clean ``handle`` up and return the result of ``record``."""

    handle: JobHandle
    record: AttemptRecord


@dataclass(frozen=True)
class Fail:
    """Fail the task with ``message`` (a RuntimeError): first, with ``tail_of``, append that
    job's last 20 log lines; clean ``clean_up`` up (unless finished jobs are kept); delete
    ``delete``."""

    message: str
    tail_of: JobHandle | None = None
    clean_up: JobHandle | None = None
    delete: JobHandle | None = None


@dataclass(frozen=True)
class LeaveRunning:
    """Watching attempt ``attempt`` failed (``event``, an ``error``), not the job: fail the task
    with the wait's error, leaving the job running (a clear reattaches to it)."""

    event: JobEvent
    attempt: int


@dataclass(frozen=True)
class Done:
    """Nothing more to do."""


Action = FindLiveJobs | Wait | Launch | Relaunch | Succeed | Fail | LeaveRunning | Done


@dataclass(frozen=True)
class Note:
    """A line for the task log."""

    level: Literal["info", "warning"]
    text: str


@dataclass(frozen=True)
class Settings:
    """What the step knows besides the record and the event.

    :param job_uri: where ``job.json`` is (for the message when it is missing).
    :param budgets: the recovery budgets.
    :param capacity: the operator's capacity (a new run of the task starts on it).
    :param at: now, as the records write it.
    """

    job_uri: str
    budgets: Budgets
    capacity: str
    at: str


@dataclass(frozen=True)
class Step:
    """The outcome of one event, applied in this order: delete ``delete_first``; put the run's
    bill into ``job`` when ``bill`` (the run is over); write ``job`` when ``write``; log
    ``notes``; do ``action``."""

    job: JobRecord | None
    action: Action
    write: bool = False
    bill: bool = False
    delete_first: JobHandle | None = None
    notes: tuple[Note, ...] = ()


# -- the step ---------------------------------------------------------------------------------


def step(job: JobRecord | None, event: Event, settings: Settings) -> Step:
    """What happens after ``event``, given the run's record ``job`` (None: no job.json).

    :param settings: the run's settings and the time (:class:`Settings`).
    """
    if isinstance(event, DeferralFailed):
        return _deferral_failed(job, event, settings)
    if job is None:
        return Step(job, Fail(missing_record(settings.job_uri)))
    if isinstance(event, TryStarted):
        return Step(job, FindLiveJobs(alive_check=newest_ended_job(job)))
    if isinstance(event, LiveJobs):
        return _plan(job, event, settings)
    if isinstance(event, Retired):
        if event.event["status"] == "gone":
            return Step(job, FindLiveJobs())
        why = event.event.get("message") or event.event["status"]
        return Step(mark_failed(job), Fail(f"not relaunching: {why}"), write=True, bill=True)
    return _wait_ended(job, event, settings)


def missing_record(job_uri: str) -> str:
    """The task's error when ``job.json`` is gone after an attempt was launched."""
    return f"{job_uri} is missing, so this run's attempts are unknown; clear the task to start afresh"


def newest_ended_job(job: JobRecord) -> JobHandle | None:
    """The job of the newest ended attempt that names one: a new try launches nothing while it
    may still have a process or pod."""
    ended = [a for a in job["attempts"] if attempt_status(a) == "ended" and "job" in a]
    return ended[-1]["job"] if ended else None


def _plan(job: JobRecord, found: LiveJobs, settings: Settings) -> Step:
    """Reattach, launch, or first retire an older attempt's job (:func:`resume_plan`)."""
    if job["status"] != "running":  # a clear or re-run: a new budget window, nothing spent
        job = restart_record(job, capacity=settings.capacity)
    plan = resume_plan(job, list(found.live), last_alive=found.last_alive)
    if plan["action"] == "retire":
        note = Note(
            "warning", f"not launching yet: {plan['reason']}; deleting it and waiting until it is gone"
        )
        return Step(job, Relaunch(plan["handle"], job["capacity"], plan["reason"]), notes=(note,))
    if plan["action"] == "wait":
        handle = plan["handle"]
        note = Note(
            "info",
            f"reattaching to attempt {plan['attempt']}'s job {handle['job_id']} instead of launching "
            f"a second one ({plan['reason']})",
        )
        return Step(job, Wait(handle, plan["attempt"], adopt=bool(plan.get("adopt"))), notes=(note,))
    return Step(job, Launch(plan["attempt"]))


def _wait_ended(job: JobRecord, ended: WaitEnded, settings: Settings) -> Step:
    """An attempt's wait ended: record it, then finish, relaunch or fail."""
    event = ended.event
    attempt = job["attempts"][-1]["attempt"]
    if event["status"] == "error":  # waiting failed, not the job: leave it running
        return Step(job, LeaveRunning(event, attempt))
    if event["status"] in ("timeout", "deadline"):
        return Step(
            ended_by_deadline(job, event, at=settings.at),
            Fail(deadline_failure(event, attempt)),
            write=True,
            bill=True,
            delete_first=event["handle"],
        )
    if event["status"] not in ("finished", "hung"):
        return Step(job, Fail(f"unexpected trigger event {event!r} after an attempt"))
    hung = event["status"] == "hung"
    folded, decision = fold_finished(
        job,
        state=event["state"],
        record=None if hung else ended.record,
        progress=ended.progress,
        budgets=settings.budgets,
        at=settings.at,
        verdict={"classification": HUNG, "reason": event.get("message") or "no new step"} if hung else None,
        logs_tail=ended.kept_tail,
    )
    relaunch = decision["action"] == "relaunch"
    handle = event["handle"]
    entry = folded["attempts"][-1]
    if hung:
        note = Note("warning", f"attempt {attempt}: hung ({event.get('message')}); {decision['reason']}")
    else:
        note = Note(
            "info",
            f"attempt {attempt}: {entry.get('classification')} ({entry.get('reason')}); {decision['reason']}",
        )
    if relaunch:
        action: Action = Relaunch(handle, decision["capacity"], decision["reason"], decision.get("delay_s"))
    elif hung:
        action = Fail(
            f"training failed on attempt {attempt}: {event.get('message')}. {decision['reason']}; "
            f"the job was deleted.\nLast log lines:\n{ended.logs_tail}",
            delete=handle,
        )
    elif decision["action"] == "fail":
        action = Fail(
            f"training failed on attempt {attempt}: {entry.get('reason')}. {decision['reason']}.",
            tail_of=handle,
            clean_up=handle,
        )
    else:
        assert ended.record is not None, "an attempt finishes only with the trainer's 'completed' record"
        action = Succeed(handle, ended.record)
    return Step(folded, action, write=True, bill=not relaunch, notes=(note,))


def _deferral_failed(job: JobRecord | None, event: DeferralFailed, settings: Settings) -> Step:
    """Airflow's deferral timeout won the race against the trigger's ``deadline`` event and the
    live jobs were deleted: record the newest attempt as ``timeout``, as the deadline event would
    have, so the next try does not read it as a lost (preempted) attempt."""
    if job is None or not job["attempts"] or attempt_status(job["attempts"][-1]) == "ended":
        return Step(job, Done())
    handle: JobHandle = job["attempts"][-1].get("job") or {
        "cluster": event.cluster,
        "job_id": "",
        "labels": {},
    }
    deadline: JobEvent = {
        "status": "deadline",
        "handle": handle,
        "message": f"{event.why}; the job was deleted",
    }
    return Step(ended_by_deadline(job, deadline, at=settings.at), Done(), write=True, bill=True)


def ended_by_deadline(job: JobRecord, event: JobEvent, *, at: str) -> JobRecord:
    """``job`` with its newest attempt recorded as ``timeout`` (the run failed), after the
    operator deleted it on a ``timeout`` or ``deadline`` event."""
    return abandon_attempt(
        job,
        reason=event.get("message"),
        at=at,
        classification=TIMEOUT,
        state=event.get("state"),
    )


def deadline_failure(event: JobEvent, attempt: int) -> str:
    """The task's error after a ``timeout`` (job_timeout) or ``deadline`` (execution_timeout)."""
    which = "job_timeout" if event["status"] == "timeout" else "execution_timeout"
    return (
        f"training attempt {attempt} stopped by its {which}: {event.get('message')}; the job was "
        "deleted and the attempt recorded in job.json as 'timeout' (raise the timeout, or clear the "
        "task to resume from the last committed checkpoint)"
    )
