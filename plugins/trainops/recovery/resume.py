"""What a training task does when it (re)starts on its ``job.json``: wait, launch or retire.

The operator writes an attempt's intent (``launching``) before it calls ``launch`` and the
handle (``running``) after it, so a crash can fall between any two of those steps. Whatever
try comes next (a retry, a restarted worker, a clear) reads the record and the task's live jobs
and gets one plan from :func:`resume_plan`: pure, so every crash point is tested over plain
data. Its rules, in order:

- no new attempt while a job of an older one may still run: a live job that is not the current
  attempt's, or the newest ended attempt's job whose processes or pods are not all gone, is
  retired first (deleted, and waited out);
- the current attempt's live job is reattached to, never launched a second time;
- a current attempt whose launch never happened (``launching``, no live job) is launched,
  under the same attempt number and job name;
- a live job of the next attempt that the record does not name (written by a version that
  recorded after launching) is adopted into the next entry, never appended beside it.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired at run time.
from typing import Literal, NotRequired, TypedDict

from trainops.cluster.base import JobHandle
from trainops.recovery.record import AttemptEntry, JobRecord, attempt_status, current_attempt, next_attempt

ATTEMPT_LABEL = "trainops/attempt"


class Plan(TypedDict):
    """What to do next.

    ``wait``: wait for ``handle``, the job of attempt ``attempt`` (record it as launched
    first when the entry is ``launching``, or, with ``adopt``, when no entry names it yet);
    ``launch``: launch attempt ``attempt``; ``retire``: delete ``handle`` (a job of an older
    attempt) and wait until it is gone, then plan again.
    """

    action: Literal["wait", "launch", "retire"]
    attempt: int
    handle: NotRequired[JobHandle]
    adopt: NotRequired[bool]
    reason: str


def attempt_of(handle: JobHandle) -> int | None:
    """The attempt number a job carries in its labels (None: it carries none)."""
    value = handle.get("labels", {}).get(ATTEMPT_LABEL)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def is_job_of(handle: JobHandle, entry: AttemptEntry) -> bool:
    """True if ``handle`` is the job of attempt ``entry``: by its attempt label, else by name."""
    labelled = attempt_of(handle)
    if labelled is not None:
        return labelled == entry["attempt"]
    names = {entry.get("job_name"), entry.get("job", {}).get("job_id")} - {None}
    return handle["job_id"] in names


def resume_plan(job: JobRecord, live: list[JobHandle], *, last_alive: bool = False) -> Plan:
    """The next step of a task whose record is ``job`` and whose live jobs are ``live``.

    :param live: the task's live jobs, as the backend finds them by the task's labels.
    :param last_alive: whether the newest ended attempt's job may still have a process or pod
        (the backend's ``all_gone`` said no); only asked when a try starts afresh.
    """
    current = current_attempt(job)
    ended = [a for a in job["attempts"] if attempt_status(a) == "ended"]
    newest_ended = ended[-1] if ended else None
    if last_alive and newest_ended is not None and "job" in newest_ended:
        return {
            "action": "retire",
            "attempt": newest_ended["attempt"],
            "handle": newest_ended["job"],
            "reason": f"attempt {newest_ended['attempt']}'s job still has processes or pods",
        }
    if current is not None:
        n = current["attempt"]
        mine = [h for h in live if is_job_of(h, current)]
        strays = [h for h in live if not is_job_of(h, current)]
        if strays:
            return _retire_stray(strays[0], n)
        if mine:
            return {"action": "wait", "attempt": n, "handle": mine[0], "reason": "its job is live"}
        if attempt_status(current) == "running" and "job" in current:
            return {
                "action": "wait",
                "attempt": n,
                "handle": current["job"],
                "reason": "it ended unwatched; its end is read from the cluster",
            }
        return {"action": "launch", "attempt": n, "reason": "its launch never happened"}
    n = next_attempt(job)
    unrecorded = [h for h in live if attempt_of(h) in (n, None)]
    strays = [h for h in live if attempt_of(h) not in (n, None)]
    if strays:
        return _retire_stray(strays[0], n)
    if unrecorded:
        return {
            "action": "wait",
            "attempt": n,
            "handle": unrecorded[0],
            "adopt": True,
            "reason": "its job is live but was never recorded",
        }
    return {"action": "launch", "attempt": n, "reason": "next attempt"}


def _retire_stray(handle: JobHandle, current: int) -> Plan:
    """Retire a live job that is not attempt ``current``'s (a second gang must never run)."""
    return {
        "action": "retire",
        "attempt": attempt_of(handle) or 0,
        "handle": handle,
        "reason": f"job {handle['job_id']} is live but is not attempt {current}'s",
    }
