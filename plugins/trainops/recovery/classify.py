"""Classify a finished attempt: a pure function of the cluster's view and the attempt record.

The cluster's view (job phase, node exit codes, disruptions such as a spot interruption or a
node that vanished) and the trainer's own attempt record together say what happened; exit
codes alone cannot, because torchrun exits 1 on SIGTERM whatever its workers did. An attempt
that failed on storage, the network or its node's GPUs (the record's ``cause``) is the
infrastructure's: it is relaunched against the infrastructure budget, not failed as the
program's error. When storage refused even the record, the trainer printed it as a marked
line, which :func:`attempt_record_of` finds in the log tail.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
from collections.abc import Mapping
from typing import Any, Final, Literal, TypedDict

from trainer.contract import AttemptRecord, Cause, attempt_record_in_log, earlier_incarnations

# EVICTED lives with the cluster's records (the backends report it); imported here as before.
from trainops.cluster.base import EVICTED, JobState

# ``hung`` (no new step for the hang timeout, see recovery/hang.py) and ``timeout``
# (job_timeout or the task's execution_timeout) are not classified from a finished job's state:
# the operator ends such an attempt itself and records it so.
Classification = Literal["succeeded", "preempted", "infra", "error", "hung", "timeout"]
SUCCEEDED: Final = "succeeded"
PREEMPTED: Final = "preempted"
INFRA: Final = "infra"
ERROR: Final = "error"
HUNG: Final = "hung"
TIMEOUT: Final = "timeout"

# The record's causes that are the infrastructure's, each as the reason names it: a relaunch
# (on another node, once storage or the network is back) may succeed where this attempt failed.
INFRA_CAUSES: Final[dict[Cause, str]] = {
    "storage": "storage",
    "network": "the network",
    "node": "its node (GPUs missing)",
}


class Verdict(TypedDict):
    """What happened to an attempt, and why, in a sentence for the task log and job.json."""

    classification: Classification
    reason: str


def attempt_record_of(
    stored: AttemptRecord | None, log_tail: str | None, attempt: int
) -> AttemptRecord | None:
    """The trainer's record of ``attempt``: the one in storage, else the one it printed in its
    log (``log_tail``, the backend's ``logs_tail``) because storage refused it; None if neither."""
    if stored is not None:
        return stored
    return attempt_record_in_log(log_tail, attempt) if log_tail else None


# What torch's NCCL watchdog prints when it aborts a rank on a stuck or failed collective
# (``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``): the process dies of SIGABRT, raising nothing the
# trainer could record, so the log is the only witness.
COLLECTIVE_ABORT_MARKS: Final = (
    "Watchdog caught collective operation timeout",
    "detected by watchdog",
    "NCCL communicator was aborted",
)


def collective_abort_in(logs_tail: str | None) -> str | None:
    """The line of ``logs_tail`` where the NCCL watchdog aborted a rank, or None."""
    for line in (logs_tail or "").splitlines():
        if any(mark in line for mark in COLLECTIVE_ABORT_MARKS):
            return line.strip()
    return None


def notice_reason(notice: Mapping[str, Any]) -> str:
    """An interruption notice in words: ``the cloud's notice (aws spot/instance-action:
    terminate, 120 s ahead), saved 3.2 s after it``."""
    lead = notice.get("lead_s")
    ahead = f", {lead:.0f} s ahead" if isinstance(lead, int | float) else ""
    saved = notice.get("saved_after_s")
    after = f", saved {saved:.1f} s after it" if isinstance(saved, int | float) else ""
    return f"the cloud's notice ({notice.get('provider')} {notice.get('event')}{ahead}){after}"


# An in-place restart's error as the reason quotes it: its first line, this long at most.
RESTART_ERROR_CHARS: Final = 120


def _restart_cause(entry: Mapping[str, Any]) -> str:
    """One earlier incarnation's failure in a few words: ``network: <error>``, or ``no record``
    when it left none."""
    if entry.get("outcome") == "unknown":
        return "no record"
    cause = str(entry.get("cause") or "failed")
    error = entry.get("error")
    if not isinstance(error, str) or not error.strip():
        return cause
    line = error.strip().splitlines()[0]
    short = line if len(line) <= RESTART_ERROR_CHARS else line[: RESTART_ERROR_CHARS - 3] + "..."
    return f"{cause}: {short}"


def restart_note(record: Mapping[str, Any] | None) -> str | None:
    """An attempt's in-place restarts (torchrun's, ``restarts_in_place``) and where its resume
    read its checkpoint, in words for its reason: ``restarted in place 2× (network: NCCL
    timeout, then no record); resumed from the node-local tier: 3 of 3 files``. None when it
    restarted nothing and read nothing from the node-local tier (a record from before these
    fields, or a plain resume from storage after a relaunch)."""
    if not isinstance(record, Mapping):
        return None
    restarts = earlier_incarnations(record)
    parts = []
    if restarts:
        causes = ", then ".join(_restart_cause(e) for e in restarts)
        parts.append(f"restarted in place {len(restarts)}× ({causes})")
    files = record.get("restore_files")
    files = files if isinstance(files, Mapping) else {}
    local, fetched = (files.get(k) for k in ("local", "storage"))
    local = local if isinstance(local, int) and not isinstance(local, bool) and local > 0 else 0
    fetched = fetched if isinstance(fetched, int) and not isinstance(fetched, bool) and fetched > 0 else 0
    total = local + fetched
    if local:
        rest = f" ({fetched} from storage)" if fetched else ""
        parts.append(f"resumed from the node-local tier: {local} of {total} files{rest}")
    elif restarts and total:
        parts.append(f"resumed from storage: {total} of {total} files (none on the node-local tier)")
    return "; ".join(parts) or None


def classify_attempt(state: JobState, record: AttemptRecord | None, logs_tail: str | None = None) -> Verdict:
    """Classify one finished attempt; the reason ends with its in-place restarts and where its
    resume read from, when there is something to say (:func:`restart_note`).

    :param state: the backend's final job state (``phase``, ``reason``, ``nodes``, ``disruptions``).
    :param record: the attempt record the trainer wrote, or None if it could not write one.
    :param logs_tail: the attempt's last log lines (None: not read); without a record, they
        may show the NCCL watchdog's abort (:data:`COLLECTIVE_ABORT_MARKS`).
    """
    verdict = _classified(state, record, logs_tail)
    note = restart_note(record)
    return {**verdict, "reason": f"{verdict['reason']}; {note}"} if note else verdict


def _classified(state: JobState, record: AttemptRecord | None, logs_tail: str | None) -> Verdict:
    """:func:`classify_attempt` without the restart note."""
    outcome = record.get("outcome") if record is not None else None
    disruptions = state.get("disruptions") or []
    if outcome == "completed":
        return {"classification": SUCCEEDED, "reason": "the trainer completed every step"}
    # Before the preempted record: an evicted pod's trainer got SIGTERM too, and saved.
    evicted = [n for n in state.get("nodes") or [] if n.get("reason") == EVICTED]
    if evicted:
        return {
            "classification": INFRA,
            "reason": state.get("infra_reason") or f"{EVICTED}: {evicted[0].get('message')}",
        }
    if record is not None and outcome == "preempted":
        notice = record.get("notice")
        if notice:
            why = notice_reason(notice)
        elif disruptions:
            why = str(disruptions[0]["message"])
        else:
            why = f"the trainer received {record.get('signal') or 'a termination signal'}"
        return {
            "classification": PREEMPTED,
            "reason": f"{why}; emergency checkpoint at step {record.get('checkpoint_step')}",
        }
    if disruptions:
        d = disruptions[0]
        return {
            "classification": PREEMPTED,
            "reason": f"{d.get('reason')}: {d.get('message')} (no attempt record: the trainer had no time to save)",
        }
    if state.get("phase") == "lost":
        return {"classification": PREEMPTED, "reason": f"node lost: {state.get('reason')}"}
    if record is not None and outcome == "failed":
        hint = record.get("hint")
        cause = record.get("cause")
        if cause in INFRA_CAUSES:
            return {
                "classification": INFRA,
                "reason": f"the trainer failed on {INFRA_CAUSES[cause]} ({record.get('error') or 'no detail'}); "
                f"its last committed checkpoint is step {record.get('checkpoint_step')}",
            }
        return {
            "classification": ERROR,
            "reason": f"{record.get('error') or 'the trainer failed'}" + (f"; hint: {hint}" if hint else ""),
        }
    infra_reason = state.get("infra_reason")
    if infra_reason:
        return {"classification": INFRA, "reason": infra_reason}
    aborted = collective_abort_in(logs_tail) if record is None else None
    if aborted:
        return {
            "classification": INFRA,
            "reason": "a collective timed out or failed and the NCCL watchdog aborted the rank (the "
            f"network, or a stuck peer): {aborted[:300]}",
        }
    codes = [n.get("exit_code") for n in state.get("nodes", [])]
    if state.get("phase") == "succeeded":
        return {
            "classification": ERROR,
            "reason": "the trainer exited 0 but wrote no attempt record; check the trainer version",
        }
    return {
        "classification": ERROR,
        "reason": f"the job failed without an attempt record (node exit codes {codes}): {state.get('reason') or 'see the node logs'}",
    }
