"""Checkpoints in storage with a commit protocol (DESIGN.md, "Checkpoint commit protocol").

A :class:`Checkpointer` is built once with the states it owns (``trainer.state``): ``model``
and ``optim`` go through DCP, every rank writing its shards; the others (train state,
scheduler, scaler) are small and per rank, in ``extra_rank<r>.pt``.

Save (collective): every rank writes its files into its own node-local staging dir and
uploads them; only when every rank is done does rank 0 write ``_COMMITTED`` and then
``latest.json``, then prune. Regular saves are asynchronous: the loop waits only while DCP
copies the state to CPU memory ("staging"); writing, uploading and the commit run in a
background thread, on a process group of their own. One save is in flight at most. The
emergency (preemption) and final saves are synchronous.

Load: rank 0 picks the newest checkpoint whose ``_COMMITTED`` checks out and tells the
others; each rank downloads it into its cache and DCP loads it, resharding as needed. A
checkpoint whose files fail their checksums on any rank is skipped for the next older one.
Picking and fetching are ``trainer.checkpoint_files``, which single processes use too.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from trainer import commit, parallel
from trainer.checkpoint_files import (
    CorruptCheckpoint,
    download,
    find_latest,
    fresh_dir,
    local_root,
    per_rank_file,
    per_rank_state_dicts,
)
from trainer.contract import RunLayout, join
from trainer.state import TrainState
from trainer.storage import Storage, sha256_file

log = logging.getLogger("trainer.checkpoint")

# The states DCP saves and reshards; their names are the top-level keys of its state dict.
SHARDED = ("model", "optim")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or committed; the previous committed one stays valid."""


class Checkpointer:
    """Saves and restores the states it was built with; every rank builds one at the same point.

    :param states: what a checkpoint holds, by name (``trainer.state.checkpoint_states``);
        ``model`` and ``optim`` are required.
    :param meta: fields for the ``_COMMITTED`` marker (what rebuilds the model: ``model``,
        ``data_uri``, ``precision``); the train state's ``cursor`` is added at every save.
    :param on_commit: called with the step on every rank once a commit is agreed.
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
    ):
        missing = [name for name in SHARDED if name not in states]
        if missing:
            raise ValueError(f"a Checkpointer needs the states {list(SHARDED)}; {missing} missing")
        self.storage, self.layout = storage, RunLayout(run_uri)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.sharded = {name: states[name] for name in SHARDED}
        self.per_rank = {name: state for name, state in states.items() if name not in SHARDED}
        self.meta, self.on_commit = dict(meta or {}), on_commit
        self.local_root = local_root(run_uri, rank)
        self.last_committed: int | None = None
        # Background saves run collectives while the loop runs its own: never on the training
        # group (collectives on one group must be issued in the same order by every rank). A
        # collective call: every rank constructs its Checkpointer at the same point.
        self.group = dist.new_group(backend="gloo")
        self._thread: threading.Thread | None = None
        self._in_flight_step: int | None = None
        self._error: BaseException | None = None

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
        staging = fresh_dir(self.local_root / "save")
        per_rank = self._per_rank_snapshot()
        dcp.save(dict(self.sharded), storage_writer=dcp.FileSystemWriter(staging), process_group=self.group)
        torch.save(per_rank, staging / per_rank_file(self.rank))
        self._upload_and_commit(step, staging, self._marker_meta())

    def save_async(self, step: int) -> float:
        """Start the checkpoint for ``step``; returns the seconds the caller was blocked.

        Waits for the previous save first. Returns once the state is copied to CPU memory, so
        the caller may update the weights right away; :meth:`wait` says how it ended.
        """
        started = time.monotonic()
        self.wait()
        waited = time.monotonic() - started
        staging = fresh_dir(self.local_root / "save")
        meta, per_rank = self._marker_meta(), self._per_rank_snapshot()
        result = dcp.async_save(
            dict(self.sharded), storage_writer=dcp.FileSystemWriter(staging), process_group=self.group
        )
        # Newer torch answers with a pair of futures (staged, uploaded); older with the upload's.
        upload: Future[Any] = result if isinstance(result, Future) else result.upload_completion
        torch.save(per_rank, staging / per_rank_file(self.rank))
        blocked = time.monotonic() - started
        self._error, self._in_flight_step = None, step
        self._thread = threading.Thread(
            target=self._finish,
            args=(step, upload, staging, meta, blocked - waited, waited, started),
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
        meta: dict[str, Any],
        staged: float,
        waited: float,
        started: float,
    ) -> None:
        try:
            upload.result()
            self._upload_and_commit(step, staging, meta)
            # The loop blocked for the staging, plus any wait for the previous save: a wait
            # means checkpoints come faster than storage takes them (raise checkpoint.every_steps).
            log.info(
                "checkpoint: step %d staged in %.2fs (loop blocked), after waiting %.2fs for the previous "
                "save; committed in %.1fs",
                step,
                staged,
                waited,
                time.monotonic() - started,
            )
        except BaseException as exc:
            self._error = exc

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the save in flight, if any; False if it is still running after ``timeout``.

        Raises CheckpointError if it failed (the previous committed checkpoint stays valid).
        """
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        self._thread, step = None, self._in_flight_step
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(
                f"the checkpoint of step {step} failed in the background ({type(error).__name__}: "
                f"{error}); the last committed one is step {self.last_committed}"
            ) from error
        return True

    def _upload_and_commit(self, step: int, staging: Path, meta: dict[str, Any]) -> None:
        """Upload this rank's files; rank 0 commits once every rank's upload succeeded (collective)."""
        prefix = self.layout.checkpoint(step)
        if self.rank == 0:
            # An earlier attempt may have left a partial (or even committed) folder for this step.
            self.storage.delete_prefix(prefix)
        dist.barrier(group=self.group)
        files: list[dict[str, Any]] = []
        problem: str | None = None
        try:
            for path in sorted(staging.iterdir()):
                files.append({"name": path.name, "size": path.stat().st_size, "sha256": sha256_file(path)})
                # Handed over: on file:// (same filesystem) renamed into place, not copied.
                self.storage.upload_file(path, join(prefix, path.name), move=True)
        except Exception as exc:  # every rank must still reach the gather below
            problem = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        gathered: list[Any] = [None] * self.world_size
        dist.gather_object((files, problem), gathered if self.rank == 0 else None, dst=0, group=self.group)
        if self.rank == 0:
            problem = next((p for _, p in gathered if p), None)
            if problem is None:
                try:
                    self._commit(step, prefix, [f for part, _ in gathered for f in part], meta)
                except Exception as exc:
                    problem = f"rank 0: {type(exc).__name__}: {exc}"
        box = [problem]
        dist.broadcast_object_list(box, src=0, group=self.group)  # every rank learns the outcome
        shutil.rmtree(staging, ignore_errors=True)
        if box[0] is not None:
            raise CheckpointError(f"checkpoint step {step} was not committed: {box[0]}")
        self.last_committed = step
        if self.on_commit is not None:
            self.on_commit(step)

    def _commit(self, step: int, prefix: str, files: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        marker = commit.commit_marker(
            step=step, files=files, world_size=self.world_size, time=time.time(), **meta
        )
        self.storage.put_json(self.layout.committed_marker(step), marker)
        self.storage.put_json(self.layout.latest, {"step": step, "uri": prefix})
        log.info("checkpoint: committed step %d (%d files) at %s", step, len(marker["files"]), prefix)
        self.prune(step)

    def prune(self, just_committed: int) -> None:
        by_step = commit.group_by_step(self.storage.list(self.layout.checkpoints), self.layout.checkpoints)
        committed = {s for s, files in by_step.items() if commit.COMMITTED in files}
        for step in commit.prune_plan(list(by_step), committed, self.keep, just_committed):
            self.storage.delete_prefix(self.layout.checkpoint(step))
            log.info("checkpoint: pruned step %d (keeping the newest %d)", step, self.keep)

    def load_latest(self) -> int | None:
        """Restore every state from the newest valid checkpoint; its step, or None (a fresh start).

        A different world size resumes too: the sharded states are resharded, and a rank with
        no per-rank file of its own takes rank 0's (step, cursor and schedule are global).
        """
        agreed = self._download_agreed()
        if agreed is None:
            return None
        step, local = agreed
        dcp.load(dict(self.sharded), storage_reader=dcp.FileSystemReader(local))
        mine = local / per_rank_file(self.rank)
        saved = per_rank_state_dicts(
            torch.load(mine if mine.exists() else local / per_rank_file(0), weights_only=True)
        )
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
        shutil.rmtree(local, ignore_errors=True)
        return step

    def _download_agreed(self) -> tuple[int, Path] | None:
        """The newest checkpoint that every rank downloaded intact, as (step, local folder)."""
        corrupt: set[int] = set()
        while True:
            found = find_latest(self.storage, self.layout, frozenset(corrupt)) if self.rank == 0 else None
            found = parallel.broadcast_object(found)
            if found is None:
                return None
            step, marker = found
            local: Path | None = None
            problem: str | None = None
            try:
                local = download(self.storage, self.layout, step, marker, self.local_root)
            except CorruptCheckpoint as exc:
                problem = str(exc)
            problems: list[str | None] = [None] * self.world_size
            dist.all_gather_object(problems, problem)  # all ranks load the same one, or none
            reasons = [p for p in problems if p]
            if local is not None and not reasons:
                return step, local
            if self.rank == 0:
                log.warning("checkpoint: skipped step %d: %s", step, reasons[0])
            corrupt.add(step)
