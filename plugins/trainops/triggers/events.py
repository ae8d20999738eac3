"""The events the triggers report, and the check an operator runs before it trusts one.

A trigger only waits and reports; the operator decides what an event means. Every event is a
JSON-able dict with a ``status`` and the job ``handle`` it is about.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired at run time.
from typing import Literal, NotRequired, TypedDict, cast

from trainops.cluster.base import JobHandle, JobState

Status = Literal["finished", "timeout", "error", "gone", "hung", "deadline"]
STATUSES: tuple[Status, ...] = ("finished", "timeout", "error", "gone", "hung", "deadline")


class JobEvent(TypedDict):
    """``finished``: the job reached a final phase (``state`` says which); ``timeout``: it ran
    past the trigger's timeout (``state`` as last seen); ``error``: waiting failed
    (``message``), for instance reads failing past ``api_outage_tolerance``, which says
    nothing about the job; ``gone``: every pod of a deleted job is gone; ``hung``: the job
    runs but made no step for the hang timeout (``message`` says how long); ``deadline``: the
    task's ``execution_timeout`` is about to end (``message``).

    ``deadline`` (epoch seconds, None: none), when present, is the task's deadline that the
    trigger was given: the operator carries it into the next trigger."""

    status: Status
    handle: JobHandle
    state: NotRequired[JobState]
    message: NotRequired[str]
    deadline: NotRequired[float | None]


def check_event(event: object, expected: tuple[Status, ...] = STATUSES) -> JobEvent:
    """``event`` as a :class:`JobEvent`, or RuntimeError saying what is malformed: a bad
    event is a bug to report, never a job state to act on."""
    if not isinstance(event, dict) or event.get("status") not in STATUSES:
        raise RuntimeError(
            f"malformed trigger event {event!r}; expected a dict with status "
            f"{', '.join(repr(s) for s in STATUSES)}"
        )
    if not isinstance(event.get("handle"), dict):
        raise RuntimeError(f"trigger event without a job handle: {event!r}")
    if event["status"] == "finished" and not isinstance(event.get("state"), dict):
        raise RuntimeError(f"'finished' trigger event without the job's state: {event!r}")
    if event["status"] not in expected:
        raise RuntimeError(
            f"unexpected trigger event {event!r} here; expected status {', '.join(repr(s) for s in expected)}"
        )
    return cast(JobEvent, event)
