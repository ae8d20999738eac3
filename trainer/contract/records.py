"""The run contract, part 4: attempt records, ``attempts/<n>.json``, the trainer's own account of
attempt n, and their copy in the log when storage refused it."""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time, so
# ``AttemptRecord.__required_keys__`` leaves the optional fields out.

import json
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, cast

# --- 4. attempt records ---------------------------------------------------------
ATTEMPT_FORMAT = "trainops.attempt/v1"
Outcome = Literal["completed", "preempted", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("completed", "preempted", "failed")
# Why a failed attempt failed, as the recovery policy needs it: ``storage`` (storage refused or
# was unreachable after the client's retries), ``network`` (a collective between ranks) and
# ``node`` (the node lacks the GPUs it was given: no driver, a failed device) are the
# infrastructure's, and a relaunch may succeed; ``program`` is everything else.
Cause = Literal["storage", "network", "node", "program"]
CAUSES: tuple[Cause, ...] = ("storage", "network", "node", "program")


class SpotNotice(TypedDict):
    """The cloud's interruption notice that stopped an attempt (``trainer.runtime.notice``):
    which ``provider`` said what (``event``), when a node's watcher read it (``noticed_at``,
    epoch seconds), the deadline it announced (None: none announced) and so the ``lead_s`` it
    gave, and when the gang's emergency checkpoint committed (``saved_at``; ``saved_after_s``
    after the notice). A save committed before the deadline lost no step."""

    provider: str
    event: str
    noticed_at: float
    deadline: float | None
    lead_s: float | None
    saved_at: float
    saved_after_s: float
    node: NotRequired[str | None]  # the Kubernetes Node of the earliest notice (older records: absent)
    nodes: NotRequired[list[str]]  # every Node whose watcher read a notice


class AttemptRecord(TypedDict):
    """``attempts/<n>.json``: what the trainer says happened in attempt n.

    ``cause`` (failed attempts) and ``metrics_unwritten`` (step records the attempt could not
    write to ``metrics.jsonl``, when there were any) are absent from records written before
    them; read them with ``.get``. So are ``first_step_time`` (epoch seconds when the
    attempt's first step began) and ``signal_time`` (epoch seconds when the stop signal came:
    rank 0's own SIGTERM, else the moment the ranks agreed to stop), which the cost accounting
    reads.
    """

    format: str
    attempt: int
    outcome: Outcome
    last_step: int
    checkpoint_step: int | None
    steps_lost: int
    resumed_from_step: int | None
    world_size: int
    signal: str | None
    hint: str | None
    error: str | None
    started_at: str | None
    ended_at: str | None
    cause: NotRequired[Cause]
    metrics_unwritten: NotRequired[int]
    emergency_save_s: NotRequired[float]  # a preempted attempt: its emergency save's seconds
    first_step_time: NotRequired[float]
    signal_time: NotRequired[float]
    restore_s: NotRequired[float]  # a resumed attempt: seconds its checkpoint load took
    notice: NotRequired[SpotNotice]  # a preempted attempt that the cloud's notice stopped
    rollbacks: NotRequired[list[dict[str, object]]]  # bad-loss rollbacks, each with the steps skipped
    # In-place restarts (torchrun's, ``trainer.runtime.restarts``): one entry per earlier
    # incarnation of this attempt, oldest first (``restart``, ``outcome``, ``cause``, ``error``,
    # ``last_step``, ``checkpoint_step``, ``steps_lost``, ``started_at``, ``ended_at``,
    # ``first_step_time``, ``restore_s``); the record's own fields are the newest incarnation's.
    restarts: NotRequired[list[dict[str, object]]]
    # Where the resume's checkpoint files came from: how many the node-local tier held
    # (``local``) and how many were fetched from storage (``storage``), all ranks together.
    restore_files: NotRequired[dict[str, int]]


def attempt_record(
    *,
    attempt: int,
    outcome: str,
    last_step: int,
    checkpoint_step: int | None,
    world_size: int,
    resumed_from_step: int | None = None,
    signal: str | None = None,
    hint: str | None = None,
    error: str | None = None,
    started_at: str | None = None,
    ended_at: str | None = None,
    cause: str | None = None,
    metrics_unwritten: int = 0,
    emergency_save_s: float | None = None,
    first_step_time: float | None = None,
    signal_time: float | None = None,
    restore_s: float | None = None,
    notice: SpotNotice | None = None,
    rollbacks: list[dict[str, object]] | None = None,
    restarts: list[dict[str, object]] | None = None,
    restore_files: dict[str, int] | None = None,
) -> AttemptRecord:
    """The trainer's account of one attempt.

    ``last_step`` is the number of optimizer steps completed when the attempt ended;
    ``checkpoint_step`` the newest committed checkpoint at that time. ``steps_lost`` is the
    difference: the steps the next attempt must replay.

    :param cause: why a failed attempt failed (one of ``CAUSES``; ``program`` when not given).
    :param metrics_unwritten: step records that never reached ``metrics.jsonl``.
    :param emergency_save_s: seconds the emergency checkpoint took, from the agreed stop to
        its commit (a preempted attempt; the operator compares it with the grace period).
    :param first_step_time: epoch seconds when the attempt's first step began (None: it
        trained none).
    :param signal_time: epoch seconds when the stop signal came (a preempted attempt).
    :param restore_s: seconds the resume's checkpoint load took (a resumed attempt; the cost
        accounting's restore).
    :param notice: the cloud's interruption notice, when one stopped the attempt.
    :param rollbacks: the attempt's bad-loss rollbacks (``at_step``, ``loss``, ``why``,
        ``to_step``, ``skipped_from``, ``skipped_to``), when it made any.
    :param restarts: the attempt's earlier incarnations, when torchrun restarted it in place.
    :param restore_files: ``{"local": n, "storage": m}``: where the resume's files came from.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown attempt outcome {outcome!r}; expected one of {OUTCOMES}")
    if cause is not None and cause not in CAUSES:
        raise ValueError(f"unknown failure cause {cause!r}; expected one of {CAUSES}")
    lost = last_step - (checkpoint_step or 0)
    record: AttemptRecord = {
        "format": ATTEMPT_FORMAT,
        "attempt": int(attempt),
        "outcome": outcome,
        "last_step": int(last_step),
        "checkpoint_step": checkpoint_step,
        "steps_lost": max(0, int(lost)),
        "resumed_from_step": resumed_from_step,
        "world_size": int(world_size),
        "signal": signal,
        "hint": hint,
        "error": error,
        "started_at": started_at,
        "ended_at": ended_at,
    }
    if outcome == "failed":
        record["cause"] = cause or "program"
    if metrics_unwritten:
        record["metrics_unwritten"] = int(metrics_unwritten)
    if emergency_save_s is not None:
        record["emergency_save_s"] = float(emergency_save_s)
    if first_step_time is not None:
        record["first_step_time"] = float(first_step_time)
    if signal_time is not None:
        record["signal_time"] = float(signal_time)
    if restore_s is not None:
        record["restore_s"] = float(restore_s)
    if notice is not None:
        record["notice"] = notice
    if rollbacks:
        record["rollbacks"] = list(rollbacks)
    if restarts:
        record["restarts"] = list(restarts)
    if restore_files is not None:
        record["restore_files"] = dict(restore_files)
    return record


def parse_attempt_record(data: object) -> AttemptRecord:
    """Check an attempt record read from storage; raise ValueError naming what is wrong."""
    if not isinstance(data, dict) or data.get("format") != ATTEMPT_FORMAT:
        raise ValueError(f"not a {ATTEMPT_FORMAT} record: {str(data)[:200]}")
    if data.get("outcome") not in OUTCOMES:
        raise ValueError(f"attempt record has unknown outcome {data.get('outcome')!r}")
    for key in ("attempt", "last_step", "steps_lost", "world_size"):
        if not isinstance(data.get(key), int):
            raise ValueError(f"attempt record field {key!r} must be an integer, got {data.get(key)!r}")
    if "cause" in data and data["cause"] not in CAUSES:
        raise ValueError(f"attempt record has unknown cause {data['cause']!r}; expected one of {CAUSES}")
    unwritten = data.get("metrics_unwritten", 0)
    if not isinstance(unwritten, int) or isinstance(unwritten, bool) or unwritten < 0:
        raise ValueError(
            f"attempt record field 'metrics_unwritten' must be an integer >= 0, got {unwritten!r}"
        )
    for key in ("emergency_save_s", "restore_s"):
        save_s = data.get(key, 0.0)
        if isinstance(save_s, bool) or not isinstance(save_s, int | float) or save_s < 0:
            raise ValueError(f"attempt record field {key!r} must be a number of seconds >= 0, got {save_s!r}")
    for key in ("first_step_time", "signal_time"):
        value = data.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(
                f"attempt record field {key!r} must be epoch seconds (a number >= 0), got {value!r}"
            )
    notice = data.get("notice")
    if notice is not None and (
        not isinstance(notice, dict) or not all(isinstance(notice.get(k), int | float) for k in _NOTICE_TIMES)
    ):
        raise ValueError(
            f"attempt record field 'notice' must hold {', '.join(_NOTICE_TIMES)} as numbers, got {notice!r}"
        )
    restarts = data.get("restarts", [])
    if not isinstance(restarts, list) or not all(
        isinstance(e, dict) and isinstance(e.get("restart"), int) for e in restarts
    ):
        raise ValueError(
            f"attempt record field 'restarts' must be a list of objects with a 'restart' number, got {restarts!r}"
        )
    return cast(AttemptRecord, data)


_NOTICE_TIMES = ("noticed_at", "saved_at", "saved_after_s")


def earlier_incarnations(record: object) -> list[Mapping[str, Any]]:
    """An attempt record's earlier incarnations (its ``restarts``, oldest first): torchrun
    restarted the attempt's workers in place once for each. [] for an attempt that never
    restarted, a record from before the field, or anything that is not a record; entries that
    are not objects are left out (a damaged record says nothing of them)."""
    restarts = record.get("restarts") if isinstance(record, Mapping) else None
    return [e for e in restarts if isinstance(e, Mapping)] if isinstance(restarts, list) else []


def skipped_steps(records: list[Mapping[str, Any]]) -> list[list[int]]:
    """``[[first, last], ...]``: the step windows that bad-loss rollbacks skipped, over attempt
    records in attempt order (entries that are not well-formed are left out: a damaged record
    says nothing of them)."""
    out = []
    for record in records:
        rollbacks = record.get("rollbacks") if isinstance(record, Mapping) else None
        for entry in rollbacks if isinstance(rollbacks, list) else []:
            first = entry.get("skipped_from") if isinstance(entry, Mapping) else None
            last = entry.get("skipped_to") if isinstance(entry, Mapping) else None
            if isinstance(first, int) and isinstance(last, int) and first <= last:
                out.append([first, last])
    return out


# When even the attempt record cannot be written (storage is down), the trainer prints it as
# the last line of rank 0's output, after this mark; the operator finds it in the log tail.
ATTEMPT_LINE_MARK = "trainops-attempt-record: "
# An infrastructure failure also prints a first, early record on every rank at once, before the
# slow clean-up (rank 0 may be stopped before its final line). It counts only when no final
# line is there: a slower rank's early line may come after rank 0's complete one.
EARLY_ATTEMPT_LINE_MARK = "trainops-attempt-record-early: "


def attempt_record_line(record: AttemptRecord, *, early: bool = False) -> str:
    """``record`` as one marked log line (see :func:`attempt_record_in_log`); ``early``: the
    first record an infrastructure failure prints, before the final one."""
    mark = EARLY_ATTEMPT_LINE_MARK if early else ATTEMPT_LINE_MARK
    return mark + json.dumps(record, sort_keys=True, separators=(",", ":"))


def attempt_record_in_log(text: str, attempt: int) -> AttemptRecord | None:
    """The record of ``attempt`` that the trainer printed instead of storing it: the last
    final marked line of ``text`` (a log tail; lines may carry a prefix such as ``[node-0] ``)
    that holds a valid record of that attempt, else the last early one. None when there is
    none."""
    found: dict[str, AttemptRecord] = {}
    for line in text.splitlines():
        for kind, mark in (("early", EARLY_ATTEMPT_LINE_MARK), ("final", ATTEMPT_LINE_MARK)):
            _, marked, body = line.partition(mark)
            if not marked:
                continue
            try:
                record = parse_attempt_record(json.loads(body))
            except ValueError:  # a torn or foreign line: the others still count
                break
            if record["attempt"] == attempt:
                found[kind] = record
            break
    return found.get("final") or found.get("early")
