"""How an attempt ends, each way with its attempt record: preempted (:func:`stop_preempted`: the
emergency checkpoint), completed (:func:`finish`: the final checkpoint and the export) or failed
(:func:`record_failure`, with :func:`attempt_without_group` for a rank that failed before the
process group existed). ``trainer.train`` calls them; torchrun's exit code cannot say whether
we were preempted, so the record does."""

from __future__ import annotations

import logging
import math
import os
import sys
import time

from trainer import parallel
from trainer.contract import AttemptRecord, RunLayout, attempt_record_line
from trainer.export.folder import join_export, write_export
from trainer.runtime.attempts import Attempt, attempt_number, cause_of, classify_failure
from trainer.runtime.failed_record import store_failure
from trainer.runtime.notice import notice_record
from trainer.runtime.preemption import NOTICE, StopFlag, stop_cause
from trainer.runtime.training import Training
from trainer.storage import Storage, open_storage

log = logging.getLogger("trainer.train")  # the loop's logger: these are its lines

# How long a failing attempt waits for a checkpoint still being written in the background before
# it gives up on it (a peer that died leaves it hanging); the previous committed one stays valid.
FAILED_SAVE_WAIT_S = 120.0


def attempt_without_group(storage: Storage, layout: RunLayout, started_at: str) -> Attempt | None:
    """The attempt of a rank that failed before the process group existed, when no collective
    can agree on anything: its number from ``$TRAINOPS_ATTEMPT`` (every launcher sets it), its
    world size from ``$WORLD_SIZE``. None when even the number cannot be had."""
    try:
        number = attempt_number(storage, layout)
    except Exception as exc:
        print(f"trainer: could not tell the attempt's number: {exc}", file=sys.stderr)
        return None
    return Attempt(storage, layout, number, int(os.environ.get("WORLD_SIZE", "1")), started_at=started_at)


def stop_preempted(tr: Training, flag: StopFlag, *, save: bool = True) -> None:
    """Commit this step (the emergency checkpoint, unless a regular save already holds it),
    then rank 0 writes the preempted record, with ``emergency_save_s``: the seconds from its
    own signal or notice (``flag.at``; else from the agreed stop) to the commit. No rank exits
    before the record exists.

    What stopped the gang is gathered from every rank first (``stop_cause``): the node whose
    watcher read the cloud's notice may not be rank 0's. The notice, its lead and when the save
    committed go into the record (``notice``). ``save=False``: the current weights are bad
    (a bad loss was read as the ranks agreed to stop): nothing is saved, and the record's
    checkpoint is the newest one committed."""
    step, started = tr.state.step, min(flag.at or math.inf, time.monotonic())
    seen = parallel.gather_objects((flag.signal_name, flag.notice), tr.host_group)
    signal_name, notice = stop_cause(seen)
    # epoch, for the cost accounting: the first notice, else this rank's own signal, else now
    tr.attempt.signal_time = time.time() - (time.monotonic() - started)
    if notice is not None:
        tr.attempt.signal_time = min(tr.attempt.signal_time, notice.noticed_at)
    tr.checkpointer.wait()  # a regular save of this very step may still be in flight
    if save and tr.checkpointer.last_committed != step:
        tr.checkpointer.save(step)  # synchronous, so nothing is lost
    # what the notice window must hold: the operator warns when the grace period is shorter
    tr.attempt.emergency_save_s = round(time.monotonic() - started, 3)
    if notice is not None:
        nodes = sorted({n.node for _, n in seen if n is not None and n.node})  # each node that read one
        tr.attempt.notice = notice_record(notice, saved_at=time.time(), nodes=nodes)
    if tr.metrics is not None:
        unwritten = tr.metrics.flush(final=True)
        tr.attempt.write("preempted", signal=signal_name, metrics_unwritten=unwritten)
        why = f"the {notice.describe()}" if notice is not None and signal_name == NOTICE else signal_name
        log.info("preempted by %s: committed step %d, exiting", why, step)
    parallel.barrier()


def finish(tr: Training) -> None:
    """The final checkpoint, then rank 0 writes the export and the completed record.

    A relaunch of a finished run resumes at its final checkpoint: it only re-exports.
    """
    step, config = tr.state.step, tr.config
    if tr.checkpointer.last_committed != step:
        tr.checkpointer.save(step)  # synchronous: the export and the record follow it
    # Every rank gathers the weights one tensor at a time; rank 0 streams each into the export.
    if tr.metrics is None:
        join_export(tr.model.state_dict(), tr.built, dtype=config.export.dtype)
    else:
        write_export(
            open_storage(config.run_uri),
            RunLayout(config.run_uri).export,
            tr.model.state_dict(),
            tr.built,
            step=step,
            data_uri=config.data_uri,
            run_uri=config.run_uri,
            precision=config.precision,
            seq_len=config.train.seq_len,
            dtype=config.export.dtype,
            max_shard_bytes=config.export.max_shard_bytes,
        )
        unwritten = tr.metrics.flush(final=True)
        tr.attempt.write("completed", metrics_unwritten=unwritten)
        log.info("completed: %d steps, checkpoint and export committed", step)
    parallel.barrier()


# --- the failure path ----------------------------------------------------------------------
def record_failure(exc: Exception, is_main: bool, attempt: Attempt | None, training: Training | None) -> None:
    """Let a save in flight commit, write the failed record (rank 0's, with the root cause
    where another rank's failure names it: ``trainer.runtime.failed_record``),
    and say on stderr where it failed and what to try. When storage refuses the record, rank 0's
    last line is the record itself, marked (``trainer.contract.attempt_record_line``).

    A failure of the infrastructure (storage, network, node) also prints the marked record at
    once, on every rank, before the slow clean-up: storage is probably what failed, and the first
    rank to exit makes the launcher stop the others, maybe before rank 0 is done. The operator
    takes the last marked line of the attempt it finds in the log tail."""
    kind, hint = classify_failure(exc)
    if attempt is not None and cause_of(kind) != "program":
        early = attempt.record(
            "failed", error=f"{type(exc).__name__}: {exc}", hint=hint, cause=cause_of(kind)
        )
        print(attempt_record_line(early, early=True), file=sys.stderr, flush=True)
    if training is not None:
        try:  # a save in flight is a good checkpoint: let it commit if the others can too
            if not training.checkpointer.wait(timeout=FAILED_SAVE_WAIT_S):
                print("trainer: gave up waiting for the checkpoint in flight", file=sys.stderr)
        except Exception as save_error:
            print(f"trainer: {save_error}", file=sys.stderr)
    unstored: AttemptRecord | None = None
    if attempt is not None:
        unwritten = training.metrics.flush(final=True) if training and training.metrics else 0
        record = attempt.record(
            "failed",
            error=f"{type(exc).__name__}: {exc}",
            hint=hint,
            cause=cause_of(kind),
            metrics_unwritten=unwritten,
        )
        try:
            store_failure(attempt.storage, attempt.layout, record, is_main=is_main)
        except Exception as write_error:  # the storage may be what failed; still say what happened
            print(f"trainer: could not write the attempt record: {write_error}", file=sys.stderr)
            unstored = record
    step = attempt.last_step if attempt else 0
    print(
        f"trainer: failed at step {step}: {hint or f'{type(exc).__name__}: {exc}'}",
        file=sys.stderr,
        flush=True,
    )
    if unstored is not None and is_main:  # rank 0's is complete (it alone counts the metrics)
        print(attempt_record_line(unstored), file=sys.stderr, flush=True)
