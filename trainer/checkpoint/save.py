"""Checkpoints in storage with a commit protocol (DESIGN.md, "Checkpoint commit protocol").

A :class:`Checkpointer` is built once with the states it owns (``trainer.state``): ``model``
and ``optim`` go through DCP, every rank writing its shards; the others (train state,
scheduler, scaler) are small and per rank, in ``extra_rank<r>.pt``.

Save (collective): every rank writes its files into its own node-local staging dir, each
file's size and sha256 taken from the bytes as they are written (never by reading it back), and
uploads them into the attempt's folder of the step (``step_<N>/attempt_<k>/``); only when
every rank is done does rank 0 write ``_COMMITTED`` and then ``latest.json``, both fenced
(``trainer.checkpoint.fence``: an attempt older than the newest one that started is refused), then
prune. Regular saves are asynchronous: the loop waits only while DCP copies the state into
CPU buffers kept from one save to the next ("staging", ``trainer.checkpoint.staging``); writing, uploading
and the commit run in a background thread, on a process group of their own. One save is in
flight at most: a save that comes while the previous one still runs waits for it first, and
that wait is blocking time too (:class:`Blocked`); the first such wait logs a warning naming
``checkpoint.every_steps``. The emergency (preemption) and final saves are synchronous.

Load: rank 0 picks the newest checkpoint whose ``_COMMITTED`` checks out and tells the
others; each node fetches the files its ranks' DCP load plans read once, into a folder they
share (``trainer.checkpoint.node_cache``, ``trainer.checkpoint.reads``), verified against ``_COMMITTED``,
and DCP loads from it, resharding as needed. A checkpoint whose files fail their checksums on
any rank is skipped for the next older one.
When checkpoints were committed but none can be loaded, the load fails naming each one and why
(:class:`NothingToResume`): it never starts over from step 0 in silence. Picking and fetching
are ``trainer.checkpoint.files``, which single processes use too.
"""

from __future__ import annotations

import logging
import math
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from trainer import parallel
from trainer.checkpoint import commit, fence, local_tier, staging
from trainer.checkpoint.fence import Fenced
from trainer.checkpoint.files import (
    CorruptCheckpoint,
    Written,
    fetch_listed,
    fresh_dir,
    hashing_open,
    hashing_writer,
    listed,
    local_root,
    node_dir,
    nothing_to_resume,
    per_rank_file,
    per_rank_state_dicts,
    survey,
)
from trainer.checkpoint.reads import NodeFileSystem, Range, assign_reads, needed_ranges, read_ranges
from trainer.contract import MAX_HELD_FOR_EVAL, Cause, RunLayout, join, prune_plan, scheduled_for_eval
from trainer.data import cache_dir
from trainer.runtime.attempts import CausedError, cause_of, classify_failure
from trainer.state import TrainState
from trainer.storage import Storage

log = logging.getLogger("trainer.checkpoint")

# The states DCP saves and reshards; their names are the top-level keys of its state dict.
SHARDED = ("model", "optim")

T = TypeVar("T")


class CheckpointError(CausedError):
    """A checkpoint could not be written or committed; the previous committed one stays valid."""

    def __init__(self, message: str, cause: Cause = "program"):
        super().__init__(message, cause)


class NothingToResume(CheckpointError):
    """Checkpoints were committed, but none can be resumed: the attempt must not start over."""


def cause_of_error(exc: BaseException) -> Cause:
    """The attempt record's cause for ``exc`` (see ``trainer.runtime.attempts.classify_failure``)."""
    return exc.cause if isinstance(exc, CausedError) else cause_of(classify_failure(exc)[0])


def on_rank0(rank: int, work: Callable[[], T]) -> T:
    """``work()`` done by rank 0 alone, its result given to every rank (a collective).

    When it raises, rank 0 re-raises and every other rank raises the same kind of failure:
    :class:`Fenced`, or a :class:`CausedError` with the same message and cause; no rank is left
    waiting for an answer that never comes.
    """
    result: T | None = None
    error: Exception | None = None
    failure: tuple[str, str] | None = None
    if rank == 0:
        try:
            result = work()
        except Exception as exc:
            error = exc
            failure = (
                "fenced" if isinstance(exc, Fenced) else cause_of_error(exc),
                f"rank 0: {type(exc).__name__}: {exc}",
            )
    result, failure = parallel.broadcast_object((result, failure))
    if error is not None:
        raise error
    if failure is not None:
        told, text = failure
        if told == "fenced":
            raise Fenced(text)
        raise CausedError(text, cast(Cause, told))
    return cast(T, result)


@dataclass(frozen=True)
class Blocked:
    """How long one async save held the training loop: first waiting for the previous save to
    finish (``waited_s``, 0 when it had), then copying the state to CPU memory (``staged_s``)."""

    waited_s: float
    staged_s: float

    @property
    def total_s(self) -> float:
        """Every second the loop waited for this save, the wait for the previous one included."""
        return self.waited_s + self.staged_s


def keep_up_every_steps(save_s: float, steps: int, loop_s: float) -> int:
    """The smallest ``checkpoint.every_steps`` at which a save is done before the next is due.

    :param save_s: how long the previous save ran in the background (from the loop going on to
        the end of its commit).
    :param steps: the steps the loop trained meanwhile, before the next save was due.
    :param loop_s: the seconds those steps took.
    """
    if steps <= 0 or loop_s <= 0:  # nothing to scale by: one step more than now is all we know
        return max(steps, 0) + 1
    return max(steps + 1, math.ceil(save_s / (loop_s / steps)))


def back_pressure_warning(step: int, previous: int, save_s: float, loop_s: float) -> str:
    """The warning of a save that had to wait for the previous one (logged once per attempt)."""
    steps = step - previous
    return (
        f"checkpoint: the save of step {step} had to wait for the save of step {previous}, which ran "
        f"{save_s:.1f}s in the background while {steps} steps of training took {loop_s:.1f}s: storage "
        "takes a checkpoint slower than checkpoint.every_steps steps train, so the loop stalls at every "
        f"save; set checkpoint.every_steps to at least {keep_up_every_steps(save_s, steps, loop_s)}, or "
        "use faster storage (logged once; each save's wait is in the run's metrics as checkpoint_waited_s)"
    )


def written_entry(path: Path, written: Written) -> dict[str, Any]:
    """The ``_COMMITTED`` entry of the staged file ``path``, from what was learnt writing it.

    Raises CheckpointError for a file the save did not write, or one whose size changed since.
    """
    found = written.get(path.name)
    if found is None:
        raise CheckpointError(
            f"staged checkpoint file {path} was not written by this save, so it has no checksum: "
            "nothing else may write into the checkpoint staging folder"
        )
    size, sha256 = found
    on_disk = path.stat().st_size
    if on_disk != size:
        raise CheckpointError(
            f"staged checkpoint file {path} has {on_disk} bytes, but {size} were written: something "
            "changed it after the save wrote it; check what else writes into the checkpoint cache"
        )
    return {"name": path.name, "size": size, "sha256": sha256}


class Checkpointer:
    """Saves and restores the states it was built with; every rank builds one at the same point.

    :param states: what a checkpoint holds, by name (``trainer.state.checkpoint_states``);
        ``model`` and ``optim`` are required.
    :param meta: fields for the ``_COMMITTED`` marker (what rebuilds the model: ``model``,
        ``data_uri``, ``precision``); the train state's ``cursor`` is added at every save.
    :param on_commit: called with the step on every rank once a commit is agreed.
    :param attempt: the attempt this gang is (``TRAINOPS_ATTEMPT``): its files go to the step's
        ``attempt_<k>/`` folder, and its commits are refused once a newer attempt started.
    """

    def __init__(
        self,
        storage: Storage,
        run_uri: str,
        rank: int,
        world_size: int,
        keep: int,
        states: Mapping[str, Stateful],
        meta: Mapping[str, Any] | None = None,
        on_commit: Callable[[int], None] | None = None,
        attempt: int = 1,
        hold_for_eval: tuple[int, int] = (0, 0),
    ):
        missing = [name for name in SHARDED if name not in states]
        if missing:
            raise ValueError(f"a Checkpointer needs the states {list(SHARDED)}; {missing} missing")
        self.storage, self.layout, self.attempt = storage, RunLayout(run_uri), attempt
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.sharded = {name: states[name] for name in SHARDED}
        self.per_rank = {name: state for name, state in states.items() if name not in SHARDED}
        self.meta, self.on_commit = dict(meta or {}), on_commit
        self.hold_for_eval = hold_for_eval  # (checkpoint.every_steps, eval.every_checkpoints)
        self.local_root = local_root(run_uri, rank)
        self.last_committed: int | None = None
        self._group: dist.ProcessGroup | None = None  # made on first use (:attr:`group`)
        self._thread: threading.Thread | None = None
        self._in_flight_step: int | None = None
        self._error: BaseException | None = None
        # Kept for the life of the checkpointer: the staging buffers and the save plans are the
        # same at every save (trainer.checkpoint.staging).
        self._stagers = staging.SaveStagers()
        self._plan_key = staging.plan_key()
        self._background_since: float | None = None  # when the save in flight left the loop
        self._warned_back_pressure = False
        self.worst_blocked: Blocked | None = None  # the longest any async save held the loop
        self.waits = 0  # async saves that had to wait for the previous one
        self.last_commit_s: float | None = None  # the last async save's start to its commit
        # where the last load found its files: {"local": n, "storage": m} (local_tier.restore_files)
        self.restore_files: dict[str, int] | None = None

    @property
    def group(self) -> dist.ProcessGroup:
        """The gloo group of the saves and loads, made the first time a save or load needs it.

        Background saves run collectives while the loop runs its own: never on the training
        group (collectives on one group must be issued in the same order by every rank). Making
        it is a collective too: every rank first reaches it at the same point (the first save or
        load, all ranks alike, always on the loop's thread). Not at construction, because an
        idle gloo group still costs a thread that wakes every 10 ms: a run that never saves
        before its end pays nothing for it while it trains.
        """
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _marker_meta(self) -> dict[str, Any]:
        train_state = self.per_rank.get("train_state")
        cursor = {"cursor": train_state.cursor} if isinstance(train_state, TrainState) else {}
        return {**self.meta, **cursor}

    def _per_rank_snapshot(self) -> dict[str, Any]:
        # Taken before DCP starts, so that the RNG state is the loop's, whatever DCP does.
        return {name: state.state_dict() for name, state in self.per_rank.items()}

    def save(self, step: int) -> None:
        """Write, upload and commit the checkpoint for ``step`` now; every rank must call it.

        Waits for any save in flight first.
        """
        self.wait()
        staging_dir, written = fresh_dir(self.local_root / "save"), Written()
        per_rank = self._per_rank_snapshot()
        dcp.save(
            dict(self.sharded),
            storage_writer=self._writer(staging_dir, written),
            planner=staging.caching_planner(self._plan_key),
            process_group=self.group,
        )
        self._write_per_rank(per_rank, staging_dir, written)
        self._upload_and_commit(step, staging_dir, written, self._marker_meta())

    @staticmethod
    def _writer(folder: Path, written: Written) -> dcp.FileSystemWriter:
        # No fsync of the staged files: on S3 they are uploaded and deleted, and on file:// the
        # upload (a rename) fsyncs each one before it is in place; a second fsync is pure wait.
        return hashing_writer(folder, written, sync_files=False)

    def _write_per_rank(self, per_rank: dict[str, Any], staging: Path, written: Written) -> None:
        with hashing_open(staging / per_rank_file(self.rank), written) as f:
            torch.save(per_rank, cast(BinaryIO, f))

    def save_async(self, step: int) -> Blocked:
        """Start the checkpoint for ``step``; returns how long the caller was blocked.

        Waits for the previous save first. Returns once the state is copied to CPU memory, so
        the caller may update the weights right away; :meth:`wait` says how it ended.
        """
        started = time.monotonic()
        previous, since = self._in_flight_step, self._background_since
        in_flight = self._thread is not None and self._thread.is_alive()
        self.wait()
        waited_until = time.monotonic()
        # Rank 0 warns for all: every rank's save ends with the same commit, so they all wait alike.
        warn = in_flight and self.rank == 0 and not self._warned_back_pressure
        if warn and previous is not None and since is not None:
            self._warned_back_pressure = True
            log.warning(back_pressure_warning(step, previous, waited_until - since, started - since))
        staging_dir, written = fresh_dir(self.local_root / "save"), Written()
        meta, per_rank = self._marker_meta(), self._per_rank_snapshot()
        result = dcp.async_save(
            dict(self.sharded),
            storage_writer=self._writer(staging_dir, written),
            planner=staging.caching_planner(self._plan_key),
            process_group=self.group,
            async_stager=self._stagers.for_save(),  # returns once the copy into the buffers is done
        )
        # Newer torch answers with a pair of futures (staged, uploaded); older with the upload's.
        upload: Future[Any] = result if isinstance(result, Future) else result.upload_completion
        self._write_per_rank(per_rank, staging_dir, written)
        self._background_since = time.monotonic()
        waited = waited_until - started if in_flight else 0.0  # else it only looked: nothing ran
        blocked = Blocked(waited_s=waited, staged_s=self._background_since - started - waited)
        self.waits += in_flight
        if self.worst_blocked is None or blocked.total_s > self.worst_blocked.total_s:
            self.worst_blocked = blocked
        self._error, self._in_flight_step = None, step
        self._thread = threading.Thread(
            target=self._finish,
            args=(step, upload, staging_dir, written, meta, blocked, started),
            name=f"checkpoint-step-{step}",
            daemon=True,
        )
        self._thread.start()
        return blocked

    def _finish(
        self,
        step: int,
        upload: Future[Any],
        staging: Path,
        written: Written,
        meta: dict[str, Any],
        blocked: Blocked,
        started: float,
    ) -> None:
        try:
            upload.result()
            self._upload_and_commit(step, staging, written, meta)
            self.last_commit_s = time.monotonic() - started  # checkpoint.every_steps: auto reads it
            # The loop blocked for the staging, plus any wait for the previous save: a wait
            # means checkpoints come faster than storage takes them (raise checkpoint.every_steps).
            log.info(
                "checkpoint: step %d staged in %.2fs (loop blocked), after waiting %.2fs for the previous "
                "save; committed in %.1fs",
                step,
                blocked.staged_s,
                blocked.waited_s,
                time.monotonic() - started,
            )
        except BaseException as exc:
            self._error = exc

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the save in flight, if any; False if it is still running after ``timeout``.

        Raises CheckpointError if it failed (the previous committed checkpoint stays valid), and
        :class:`Fenced` if its commit was refused because a newer attempt started.
        """
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        self._thread, step = None, self._in_flight_step
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, Fenced):
                raise error
            raise CheckpointError(
                f"the checkpoint of step {step} failed in the background ({type(error).__name__}: "
                f"{error}); the last committed one is step {self.last_committed}",
                cause_of_error(error),
            ) from error
        return True

    def _upload_and_commit(self, step: int, staging: Path, written: Written, meta: dict[str, Any]) -> None:
        """Upload this rank's files; rank 0 commits once every rank's upload succeeded (collective).

        The sizes and checksums in ``_COMMITTED`` are those ``written`` learnt while the files
        were written: no file is read back for them.

        Every rank reaches every collective whatever fails, and every rank raises the same
        failure: :class:`Fenced`, or :class:`CheckpointError` with the first problem's cause.
        """
        prefix = self.layout.checkpoint_files(step, self.attempt)
        problem: tuple[str, str] | None = None  # (what, cause or "fenced")
        if self.rank == 0:
            try:  # this very attempt may have left files for this step (a rerun of it)
                self.storage.delete_prefix(prefix)
            except Exception as exc:
                problem = self._problem(exc)
        dist.barrier(group=self.group)
        files: list[dict[str, Any]] = []
        kept = local_tier.Kept(local_tier.folder(self.layout.run_uri, step, self.attempt))
        try:
            staged = sorted(staging.iterdir()) if problem is None else []
            kept = local_tier.keep(staged, kept.folder)  # the node keeps its files of this checkpoint
            for path in staged:
                files.append(written_entry(path, written))
                # Handed over: on file:// (same filesystem) renamed into place, not copied.
                self.storage.upload_file(path, join(prefix, path.name), move=True)
        except Exception as exc:  # every rank must still reach the gather below
            problem = self._problem(exc)
        gathered: list[Any] = [None] * self.world_size
        dist.gather_object((files, problem), gathered if self.rank == 0 else None, dst=0, group=self.group)
        if self.rank == 0:
            problem = next((p for _, p in gathered if p), None)
            if problem is None:
                try:
                    self._commit(step, [f for part, _ in gathered for f in part], meta)
                except Fenced as exc:
                    log.warning("checkpoint: step %d not committed: %s", step, exc)
                    problem = str(exc), "fenced"
                except Exception as exc:
                    problem = self._problem(exc)
        box = [problem]
        dist.broadcast_object_list(box, src=0, group=self.group)  # every rank learns the outcome
        shutil.rmtree(staging, ignore_errors=True)
        if box[0] is not None:
            local_tier.dropped(kept)
            what, kind = box[0]
            if kind == "fenced":
                raise Fenced(what)
            raise CheckpointError(f"checkpoint step {step} was not committed: {what}", cast(Cause, kind))
        local_tier.committed(kept, written)
        local_tier.prune(self.layout.run_uri, step)
        self.last_committed = step
        if self.on_commit is not None:
            self.on_commit(step)

    def _problem(self, exc: Exception) -> tuple[str, str]:
        return f"rank {self.rank}: {type(exc).__name__}: {exc}", cause_of_error(exc)

    def _commit(self, step: int, files: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        marker = commit.commit_marker(
            step=step, files=files, world_size=self.world_size, time=time.time(), attempt=self.attempt, **meta
        )
        latest = fence.commit(self.storage, self.layout, step, marker, self.attempt)
        log.info(
            "checkpoint: committed step %d (%d files) at %s",
            step,
            len(marker["files"]),
            self.layout.checkpoint(step),
        )
        try:
            self.prune(step, fence.fence_of(latest))
        except Exception as exc:  # the commit stands; the next one prunes again
            log.warning(
                "checkpoint: step %d is committed, but pruning failed (%s: %s)", step, type(exc).__name__, exc
            )

    def prune(self, just_committed: int, fence_entries: list[fence.FenceEntry] | None = None) -> None:
        """Delete what ``just_committed`` made obsolete: the files of older attempts in its own
        folder, then the folders of older checkpoints beyond ``keep``.

        A checkpoint counts towards ``keep`` only if the fence does not void it; a folder holding
        files of a newer attempt than this one is never touched.
        """
        by_step = commit.group_by_step(self.storage.list(self.layout.checkpoints), self.layout.checkpoints)
        older, legacy = commit.superseded(by_step.get(just_committed, {}), self.attempt)
        for attempt in older:
            self.storage.delete_prefix(self.layout.checkpoint_files(just_committed, attempt))
        for uri in legacy:
            self.storage.delete(uri)
        committed = set()
        for step, files in by_step.items():
            if commit.COMMITTED in files and step < just_committed:
                marker, _ = fence.read_object(self.storage, self.layout.committed_marker(step))
                if fence.void_reason(fence_entries or [], fence.marker_attempt(marker), step) is None:
                    committed.add(step)
        newer = {
            s for s, files in by_step.items() if any(a > self.attempt for a in commit.attempts_in(files))
        }
        held = self._held(committed)
        for step in prune_plan(
            [s for s in by_step if s not in newer], committed, self.keep, just_committed, held
        ):
            self.storage.delete_prefix(self.layout.checkpoint(step))
            log.info("checkpoint: pruned step %d (keeping the newest %d)", step, self.keep)

    def _held(self, committed: set[int]) -> frozenset[int]:
        """The committed steps mid-run evaluation has yet to score (``eval.every_checkpoints``):
        kept until their score is written, so that none is pruned before it is read; at most
        the newest ``MAX_HELD_FOR_EVAL``, so that a run nobody scores does not grow without end."""
        every_steps, every_checkpoints = self.hold_for_eval
        due = {s for s in committed if scheduled_for_eval(s, every_steps, every_checkpoints)}
        if not due:
            return frozenset()
        # by name: the listing's spelling of the root need not be the layout's
        written = {uri.rsplit("/", 1)[-1] for uri in self.storage.list(self.layout.checkpoint_scores)}
        waiting = sorted(s for s in due if self.layout.checkpoint_score(s).rsplit("/", 1)[-1] not in written)
        held = frozenset(waiting[-MAX_HELD_FOR_EVAL:])
        if held:
            log.info("checkpoint: keeping step(s) %s until their mid-run evaluation is written", sorted(held))
        if len(waiting) > MAX_HELD_FOR_EVAL:
            log.warning(
                "checkpoint: %d checkpoints await their mid-run evaluation; only the newest %d are kept "
                "for it (is the evaluating task running?)",
                len(waiting),
                MAX_HELD_FOR_EVAL,
            )
        return held

    def load_latest(self) -> int | None:
        """Restore every state from the newest valid checkpoint; its step, or None (a fresh start:
        no checkpoint was ever committed here).

        Each node fetches each file it reads once, into a folder its ranks share, and each rank
        reads only what its DCP load plan needs (``trainer.checkpoint.reads``). A different world
        size or mesh resumes too: the sharded states are resharded, and a rank with no per-rank
        file of its own takes rank 0's (step, cursor and schedule are global).
        Raises :class:`NothingToResume` when checkpoints were committed but none can be loaded.
        """
        agreed = self._fetch_agreed()
        if agreed is None:
            return None
        step, marker, folder, sharded, relayed = agreed
        reader = dcp.FileSystemReader(folder)
        reader.fs = NodeFileSystem(relayed)  # opens only the files the plan reads
        # The very state dicts the fetch was planned for (not the states, whose state_dict() DCP
        # would take again): what DCP reads is what was fetched or relayed.
        dcp.load(sharded, storage_reader=reader)
        for name, state in self.sharded.items():
            state.load_state_dict(sharded[name])
        saved = per_rank_state_dicts(torch.load(folder / self._per_rank_source(marker), weights_only=True))
        for name, state in self.per_rank.items():
            if saved.get(name):
                state.load_state_dict(saved[name])
            elif name == "scaler":  # the run switched to fp16 since: the loss scale starts afresh
                log.warning("checkpoint: step %d holds no scaler state; it starts fresh", step)
            else:  # resuming weights without their step, cursor or schedule would be a lie
                raise CheckpointError(
                    f"checkpoint step {step} holds no {name!r} state (it holds {sorted(saved)}): it "
                    "was not written by this trainer; resume from a checkpoint this trainer wrote, "
                    "or start the run under a new prefix"
                )
        self.last_committed = step
        dist.barrier(group=self.group)  # the node's folder is shared: every rank has read it now
        local_tier.prune(self.layout.run_uri, step)  # the folder stays: the node's tier holds it now
        return step

    def _per_rank_source(self, marker: dict[str, Any]) -> str:
        """The per-rank file this rank restores from: its own, or rank 0's when it has none."""
        mine = per_rank_file(self.rank)
        return mine if listed(marker, mine) is not None else per_rank_file(0)

    def _pick(self, corrupt: dict[int, str]) -> tuple[int, dict[str, Any]] | None:
        """Rank 0: the newest checkpoint to load, None for a fresh start, or NothingToResume."""
        found = survey(self.storage, self.layout, corrupt)
        if found.picked is None and found.ever_committed:
            raise NothingToResume(nothing_to_resume(self.layout, found))
        return found.picked

    def _fetch_problem(self, exc: Exception) -> tuple[str, str]:
        return (str(exc), "corrupt") if isinstance(exc, CorruptCheckpoint) else self._problem(exc)

    def _agree(self, step: int, problem: tuple[str, str] | None, payload: T) -> tuple[str | None, list[T]]:
        """Every rank's payload, and why ``step`` must be passed over (None: it need not), agreed
        by all ranks (a collective); raises CheckpointError when storage or the program failed
        on any rank (a relaunch may fare better; another checkpoint would not)."""
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, (problem, payload), group=self.group)
        problems = [p for p, _ in gathered if p]
        failed = [p for p in problems if p[1] != "corrupt"]
        if failed:
            raise CheckpointError(
                f"checkpoint step {step} could not be fetched: {failed[0][0]}", cast(Cause, failed[0][1])
            )
        return (problems[0][0] if problems else None), [p for _, p in gathered]

    def _fetch_agreed(
        self,
    ) -> tuple[int, dict[str, Any], Path, dict[str, Any], dict[str, dict[Range, bytes]]] | None:
        """The newest checkpoint that every rank fetched its part of intact, as (step, marker,
        the node's folder of its files, the sharded states to load it into, the byte ranges
        other ranks sent this one), or None for a fresh start.

        Two rounds, each agreed by all ranks: every rank fetches ``.metadata`` and works out the
        ranges its plan reads; then each fetches the files :func:`assign_reads` gives it, and
        sends the ranges it is the source of. A checksum that fails on any rank passes the
        checkpoint over for the next older one.
        """
        corrupt: dict[int, str] = {}
        while True:
            found = on_rank0(self.rank, lambda: self._pick(corrupt))
            if found is None:
                return None
            step, marker = found
            folder = node_dir(self.layout.run_uri, step, marker)
            sharded: dict[str, Any] = {}
            needs: dict[str, tuple[Range, ...]] = {}
            problem: tuple[str, str] | None = None  # (what, "corrupt" or the failure's cause)
            fetched: list[str] = []
            try:
                if fetch_listed(self.storage, self.layout, step, marker, ".metadata", folder):
                    fetched.append(".metadata")
                metadata = dcp.FileSystemReader(folder).read_metadata()
                sharded = {name: state.state_dict() for name, state in self.sharded.items()}
                needs = needed_ranges(sharded, metadata, self.rank == 0)
            except Exception as exc:  # every rank must still reach the gather
                problem = self._fetch_problem(exc)
            held = local_tier.held(folder, marker)  # this node's verified files: fetched by its ranks
            reason, agreed = self._agree(step, problem, (needs, held))
            all_needs = [n for n, _ in agreed]
            if reason is not None:
                corrupt[step] = reason  # the next pick logs it and passes over it
                shutil.rmtree(folder, ignore_errors=True)  # every rank is done with it (agreed)
                continue
            assignment = assign_reads(all_needs, held=[h for _, h in agreed])
            offer: dict[str, dict[Range, bytes]] = {}
            read = [".metadata", *assignment.fetched_by(self.rank), self._per_rank_source(marker)]
            try:
                for name in read[1:]:
                    if fetch_listed(self.storage, self.layout, step, marker, name, folder):
                        fetched.append(name)
                for name, ranges in assignment.to_send(self.rank, all_needs).items():
                    offer[name] = read_ranges(folder / name, ranges)
            except Exception as exc:
                problem = self._fetch_problem(exc)
            # with what each rank read and downloaded: where the load found its files
            reason, agreed_offers = self._agree(
                step, problem, (offer, (local_tier.node_key(cache_dir()), read, fetched))
            )
            offers = [o for o, _ in agreed_offers]
            if reason is not None:
                corrupt[step] = reason
                shutil.rmtree(folder, ignore_errors=True)  # every rank is done with it (agreed)
                continue
            relayed = {
                name: {r: offers[assignment.source[name]][name][r] for r in ranges}
                for name, ranges in assignment.relayed_to(self.rank, all_needs).items()
            }
            log.info(
                "checkpoint: step %d: rank %d fetched %s into the node cache, reads %d file(s) there, "
                "%d byte(s) sent by other ranks",
                step,
                self.rank,
                fetched or "nothing",
                len(assignment.fetched_by(self.rank)),
                sum(len(b) for ranges in relayed.values() for b in ranges.values()),
            )
            self._count_restored(step, [t for _, t in agreed_offers])
            return step, marker, folder, sharded, relayed

    def _count_restored(self, step: int, touched: list[tuple[str, list[str], list[str]]]) -> None:
        """Where the load of ``step`` found its files, all nodes together (:attr:`restore_files`),
        from each rank's ``(node, files read, files downloaded)``; rank 0 logs it."""
        self.restore_files = local_tier.restore_files(touched)
        if self.rank == 0:
            local, total = self.restore_files["local"], sum(self.restore_files.values())
            log.info(
                "checkpoint: step %d restored with %d of %d file(s) from the node-local tier, %d from storage",
                step,
                local,
                total,
                total - local,
            )
