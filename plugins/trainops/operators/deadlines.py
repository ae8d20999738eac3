"""What the training operator says and records when a wait ends without the job finishing:
the wait itself failed (``error``), or a deadline came (``timeout``: job_timeout;
``deadline``: the task's execution_timeout). Pure: the operator does the deleting and writing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainops.recovery.record import abandon_attempt

if TYPE_CHECKING:
    from trainops.recovery.record import JobRecord
    from trainops.triggers.events import JobEvent


def waiting_failed(event: JobEvent, attempt: int, *, what: str = "training attempt") -> str:
    """The task's error when watching the job failed (reads past ``api_outage_tolerance``):
    the job may well be healthy, so it is left running, and the message says how to go on:
    clear the task to reattach, or delete the job by hand to stop it.

    :param what: what the job is, as the message names it (``training attempt 2``)."""
    handle = event["handle"]
    job_id = handle["job_id"]
    if handle.get("cluster") == "kubernetes":
        stop = (
            f"kubectl -n {handle.get('namespace') or 'default'} delete "
            f"jobs,pytorchjobs,trainjobs,services -l trainops/job={job_id}"
        )
    else:
        stop = f"kill -TERM $(cat {handle.get('job_dir') or '<job dir>'}/supervisor.pid)"
    name = f"{what} {attempt}" if what == "training attempt" else what
    return (
        f"could not watch {name}: {event.get('message')}. Job {job_id} was left running (a failed "
        "read says nothing about it): clear this task to reattach to it once the cluster answers "
        f"again, or stop it with `{stop}`"
    )


def ended_by_deadline(job: JobRecord, event: JobEvent, *, at: str) -> JobRecord:
    """``job`` with its newest attempt recorded as ``timeout`` (the run failed), after the
    operator deleted it on a ``timeout`` or ``deadline`` event."""
    return abandon_attempt(
        job,
        reason=event.get("message"),
        at=at,
        classification="timeout",
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
