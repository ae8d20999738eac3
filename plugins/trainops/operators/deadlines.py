"""What a job-launching operator says when watching its job failed (an ``error`` event): the
job is left running. Pure. What a deadline (``timeout``, ``deadline``) means for a training run
is :mod:`trainops.recovery.driver`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
