"""Checkpoints in storage with a commit protocol (DESIGN.md, "Checkpoint commit protocol").

Save (collective): every rank writes its DCP shard and a small ``extra_rank<r>.pt`` (step,
cursor, scheduler, scaler, RNG) into its own node-local staging dir, uploads them, and only
when every rank is done does rank 0 write ``_COMMITTED`` and then ``latest.json``, then
prune. Regular saves are asynchronous: the loop waits only while DCP copies the state to
CPU memory ("staging"); writing, uploading and the commit run in a background thread, on a
process group of their own. One save is in flight at most. The emergency (preemption) and
final saves are synchronous.

Load: rank 0 picks the newest checkpoint whose ``_COMMITTED`` checks out and tells the
others; each rank downloads it into its cache and DCP loads it, resharding as needed. A
checkpoint whose files fail their checksums on any rank is skipped for the next older one.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer import commit, parallel
from trainer.contract import RunLayout, join
from trainer.data import cache_dir
from trainer.storage import NotFound, sha256_file

log = logging.getLogger("trainer.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or committed; the previous committed one stays valid."""


class CorruptCheckpoint(RuntimeError):
    """A committed checkpoint's file does not match the checksum in its ``_COMMITTED``."""


def _fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _run_key(run_uri: str) -> str:
    return hashlib.sha256(run_uri.encode()).hexdigest()[:16]


class Checkpointer:
    def __init__(self, storage, run_uri: str, rank: int, world_size: int, keep: int, on_commit=None):
        self.storage, self.layout = storage, RunLayout(run_uri)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        # Rank-specific: ranks sharing a node must not clobber each other's files.
        self.local_root = cache_dir() / "checkpoints" / _run_key(run_uri) / f"rank{rank}"
        self.last_committed: int | None = None
        self.on_commit = on_commit  # called with the step on every rank once a commit is agreed
        # Background saves run collectives while the loop runs its own: never on the training
        # group (collectives on one group must be issued in the same order by every rank). A
        # collective call: every rank constructs its Checkpointer at the same point.
        # (A plain process, such as ``trainer export``, only reads and needs none.)
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._thread: threading.Thread | None = None
        self._in_flight_step: int | None = None
        self._error: BaseException | None = None

    # --- save (collective) -----------------------------------------------------------
    def save(self, step: int, model, optimizer, extras: dict, meta: dict | None = None) -> None:
        """Write, upload and commit the checkpoint for ``step`` now; every rank must call it."""
        self.wait()
        staging = _fresh_dir(self.local_root / "save")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save(
            {"model": model_sd, "optim": optim_sd},
            storage_writer=dcp.FileSystemWriter(staging),
            process_group=self.group,
        )
        torch.save(extras, staging / f"extra_rank{self.rank}.pt")
        self._upload_and_commit(step, staging, meta)

    def save_async(self, step: int, model, optimizer, extras: dict, meta: dict | None = None) -> float:
        """Start the checkpoint for ``step``; returns the seconds the caller was blocked.

        Waits for the previous save first. Returns once the state is copied to CPU memory, so
        the caller may update the weights right away; :meth:`wait` says how it ended.
        """
        started = time.monotonic()
        self.wait()
        waited = time.monotonic() - started
        staging = _fresh_dir(self.local_root / "save")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        result = dcp.async_save(
            {"model": model_sd, "optim": optim_sd},
            storage_writer=dcp.FileSystemWriter(staging),
            process_group=self.group,
        )
        upload = getattr(result, "upload_completion", result)  # newer stagers answer with a pair
        torch.save(extras, staging / f"extra_rank{self.rank}.pt")
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
        upload,
        staging: Path,
        meta: dict | None,
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

    def _upload_and_commit(self, step: int, staging: Path, meta: dict | None) -> None:
        """Upload this rank's files; rank 0 commits once every rank's upload succeeded (collective)."""
        prefix = self.layout.checkpoint(step)
        if self.rank == 0:
            # An earlier attempt may have left a partial (or even committed) folder for this step.
            self.storage.delete_prefix(prefix)
        dist.barrier(group=self.group)
        files, problem = [], None
        try:
            for path in sorted(staging.iterdir()):
                files.append({"name": path.name, "size": path.stat().st_size, "sha256": sha256_file(path)})
                # Handed over: on file:// (same filesystem) renamed into place, not copied.
                self.storage.upload_file(path, join(prefix, path.name), move=True)
        except Exception as exc:  # every rank must still reach the gather below
            problem = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        gathered = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object((files, problem), gathered, dst=0, group=self.group)
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

    def _commit(self, step: int, prefix: str, files: list[dict], meta: dict | None) -> None:
        marker = commit.commit_marker(
            step=step, files=files, world_size=self.world_size, time=time.time(), **(meta or {})
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

    # --- choose (any single process) -----------------------------------------------------
    def find_latest(self, exclude: frozenset[int] = frozenset()) -> tuple[int | None, dict | None]:
        """The newest trustworthy checkpoint as (step, marker); (None, None) when there is none."""
        by_step = commit.group_by_step(self.storage.list(self.layout.checkpoints), self.layout.checkpoints)
        skipped = []
        for step in commit.newest_first(by_step):
            if step in exclude:
                continue
            marker = None
            if commit.COMMITTED in by_step[step]:
                try:
                    marker = self.storage.get_json(self.layout.committed_marker(step))
                except (NotFound, ValueError):
                    marker = None
            sizes = {}
            for entry in (marker or {}).get("files", []) if isinstance(marker, dict) else []:
                head = self.storage.head(join(self.layout.checkpoint(step), entry["name"]))
                sizes[entry["name"]] = head["size"] if head else None
            problem = commit.marker_problem(marker, sizes, step)
            if problem is None:
                for old_step, reason in skipped:
                    log.warning("checkpoint: skipped step %d: %s", old_step, reason)
                log.info("checkpoint: picked step %d at %s", step, self.layout.checkpoint(step))
                return step, marker
            skipped.append((step, problem))
        for old_step, reason in skipped:
            log.warning("checkpoint: skipped step %d: %s", old_step, reason)
        return None, None

    def download(self, step: int, marker: dict) -> Path:
        """Fetch every file of the committed checkpoint into this rank's cache, checksummed."""
        local = _fresh_dir(self.local_root / "load" / f"step_{step:08d}")
        for entry in marker["files"]:
            uri = join(self.layout.checkpoint(step), entry["name"])
            path = local / entry["name"]
            self.storage.download_file(uri, path)
            got = sha256_file(path)
            if got != entry["sha256"]:
                raise CorruptCheckpoint(
                    f"checkpoint file {uri} has sha256 {got}, _COMMITTED says {entry['sha256']}; "
                    f"the checkpoint is corrupt: delete its _COMMITTED to fall back to an older one"
                )
        return local

    # --- load (collective) -----------------------------------------------------------
    def load_latest(self, model, optimizer) -> tuple[int, dict] | None:
        """Restore model and optimizer from the newest valid checkpoint; (step, extras) or None."""
        corrupt: set[int] = set()
        while True:
            step, marker = self.find_latest(frozenset(corrupt)) if self.rank == 0 else (None, None)
            step, marker = parallel.broadcast_object((step, marker))
            if step is None:
                return None
            try:
                local, problem = self.download(step, marker), None
            except CorruptCheckpoint as exc:
                local, problem = None, str(exc)
            problems = [None] * self.world_size
            dist.all_gather_object(problems, problem)  # all ranks load the same one, or none
            problems = [p for p in problems if p]
            if not problems:
                break
            if self.rank == 0:
                log.warning("checkpoint: skipped step %d: %s", step, problems[0])
            corrupt.add(step)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=dcp.FileSystemReader(local))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        # A different world size resumes too: step, cursor and schedule are global; RNG is per rank.
        extra = local / f"extra_rank{self.rank}.pt"
        extras = torch.load(extra if extra.exists() else local / "extra_rank0.pt", weights_only=True)
        self.last_committed = step
        shutil.rmtree(local, ignore_errors=True)
        return step, extras


def load_model_weights(local_dir: Path, model) -> None:
    """Fill a plain (unsharded) model from a downloaded DCP checkpoint, in a single process."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        # DCP warns that it found no process group; a single process is exactly what we mean.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=dcp.FileSystemReader(local_dir), no_dist=True)
    model.load_state_dict(state["model"])
