"""What the training operator reads of an attempt that ended: its log tail, the trainer's
attempt record and its progress in storage; and the task's result. Reads only: the decisions
are :mod:`trainops.recovery.driver`'s."""

from __future__ import annotations

from typing import Any

from trainer.contract import MetricsReader, RunLayout, last_record, parse_attempt_record, skipped_steps
from trainer.storage import NotFound, Storage
from trainops.cluster.base import ClusterBackend, JobHandle
from trainops.hooks.storage import get_json_object
from trainops.operators.base import TaskLog
from trainops.operators.cleanup import clip_tail
from trainops.recovery.classify import AttemptRecord, attempt_record_of
from trainops.recovery.driver import WaitEnded
from trainops.recovery.record import JobRecord, Progress, total_restarts_in_place, total_steps_lost
from trainops.triggers.events import JobEvent


def log_tail(backend: ClusterBackend, handle: JobHandle, log: TaskLog, lines: int = 200) -> str | None:
    """The attempt's last log lines, where the trainer prints its record when storage refused it
    (torchrun's failure report and the other ranks' tracebacks come after it, hence 200 lines);
    None when the logs cannot be read.

    :param log: where a failed read is said (the task log)."""
    try:
        return backend.logs_tail(handle, lines=lines)
    except Exception as exc:  # the record is then taken as missing, as before
        log.warning("could not read the logs of %s for its attempt record: %s", handle["job_id"], exc)
        return None


def stored_record(store: Storage, layout: RunLayout, attempt: int, log: TaskLog) -> AttemptRecord | None:
    """The trainer's record of ``attempt`` in storage; None when it wrote none or it is
    malformed (said in ``log``)."""
    try:
        return parse_attempt_record(get_json_object(store, layout.attempt(attempt)))
    except NotFound:
        return None
    except ValueError as exc:
        log.warning("ignoring a malformed attempt record: %s", exc)
        return None


def wait_ended(
    event: JobEvent,
    job: JobRecord | None,
    store: Storage,
    layout: RunLayout,
    backend: ClusterBackend,
    log: TaskLog,
) -> WaitEnded:
    """``event`` (the end of an attempt's wait) with what the driver needs read of the attempt:
    for ``finished``, the trainer's record (from storage, else from the 200-line log tail, where
    rank 0 printed it when storage refused it) and, without one, its progress; for ``hung``,
    the 50-line log tail and its progress. Nothing for other events, or without a record."""
    if job is None or event["status"] not in ("finished", "hung"):
        return WaitEnded(event)
    attempt, handle = job["attempts"][-1]["attempt"], event["handle"]
    if event["status"] == "hung":
        tail = log_tail(backend, handle, log, lines=50)
        found = progress(store, layout, attempt)
        return WaitEnded(event, progress=found, logs_tail=tail, kept_tail=clip_tail(tail))
    stored = stored_record(store, layout, attempt, log)
    tail = log_tail(backend, handle, log)  # kept in job.json: it goes with the pods
    record = attempt_record_of(stored, tail, attempt)
    found = None if record is not None else progress(store, layout, attempt)
    return WaitEnded(event, record, found, tail, clip_tail(tail))


def progress(store: Storage, layout: RunLayout, attempt: int) -> Progress | None:
    """What storage shows of an attempt that wrote no record (SIGKILL): its last logged step
    and the newest committed checkpoint (None: the run logged nothing)."""
    metrics = MetricsReader(store, layout.run_uri, attempt=attempt)
    latest = metrics.latest().get(attempt)  # reads the attempt's newest part only
    if not metrics.found:
        return None
    last = int(latest["step"]) if latest else 0
    try:
        committed = int(get_json_object(store, layout.latest).get("step", 0))
    except NotFound:
        committed = 0
    return {"last_step": last, "committed_step": committed}


def result(store: Storage, layout: RunLayout, job: JobRecord, record: AttemptRecord) -> dict[str, Any]:
    """The task's result (its XCom) once training completed with ``record``."""
    # each attempt's newest part holds its highest step: no need to read the whole run
    final = last_record(MetricsReader(store, layout.run_uri).latest().values())
    final_loss = final["loss"] if final else None
    return {
        "run_uri": layout.run_uri,
        "config_uri": layout.config,
        "job_uri": layout.job,
        "export_uri": layout.export,
        "metrics_uri": layout.metrics_parts,
        "steps": record["last_step"],
        "checkpoint_step": record["checkpoint_step"],
        "attempts": len(job["attempts"]),
        "preemptions": job["preemptions"],
        "restarts_in_place": total_restarts_in_place(job),  # torchrun's, inside the attempts
        "steps_lost": total_steps_lost(job),
        # bad-loss rollbacks' skipped windows, [[first, last], ...] (trainer.runtime.bad_loss)
        "steps_skipped": skipped_steps([a.get("record") or {} for a in job["attempts"]]),
        "final_loss": final_loss,
        "cost": job.get("cost"),  # an estimate (trainops.cost.accounting.RunCost)
        "goodput": (job.get("cost") or {}).get("goodput"),
    }
