"""Checkpoints in storage with a commit protocol (DESIGN.md, "Checkpoint commit protocol").

Save (collective): every rank writes its DCP shard and a small ``extra_rank<r>.pt`` (step,
cursor, scheduler, scaler, RNG) into its own node-local staging dir, uploads them, and only
when every rank is done does rank 0 write ``_COMMITTED`` and then ``latest.json``, then
prune. Saves are synchronous for now; asynchronous uploads are a later issue.

Load: rank 0 picks the newest checkpoint whose ``_COMMITTED`` checks out and tells the
others; each rank downloads it into its cache and DCP loads it, resharding as needed.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer import commit, parallel
from trainer.contract import RunLayout, join
from trainer.data import cache_dir
from trainer.storage import NotFound, sha256_file

log = logging.getLogger("trainer.checkpoint")


def _fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _run_key(run_uri: str) -> str:
    return hashlib.sha256(run_uri.encode()).hexdigest()[:16]


class Checkpointer:
    def __init__(self, storage, run_uri: str, rank: int, world_size: int, keep: int):
        self.storage, self.layout = storage, RunLayout(run_uri)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        # Rank-specific: ranks sharing a node must not clobber each other's files.
        self.local_root = cache_dir() / "checkpoints" / _run_key(run_uri) / f"rank{rank}"
        self.last_committed: int | None = None

    # --- save (collective) -----------------------------------------------------------
    def save(self, step: int, model, optimizer, extras: dict, meta: dict | None = None) -> None:
        """Write, upload and commit the checkpoint for ``step``; every rank must call it."""
        staging = _fresh_dir(self.local_root / "save")
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=dcp.FileSystemWriter(staging))
        torch.save(extras, staging / f"extra_rank{self.rank}.pt")

        prefix = self.layout.checkpoint(step)
        if self.rank == 0:
            # An earlier attempt may have left a partial (or even committed) folder for this step.
            self.storage.delete_prefix(prefix)
        parallel.barrier()
        files = []
        for path in sorted(staging.iterdir()):
            self.storage.upload_file(path, join(prefix, path.name))
            files.append({"name": path.name, "size": path.stat().st_size, "sha256": sha256_file(path)})
        gathered = parallel.gather_objects(files)
        if self.rank == 0:
            marker = commit.commit_marker(step=step, files=[f for part in gathered for f in part],
                                          world_size=self.world_size, time=time.time(), **(meta or {}))
            self.storage.put_json(self.layout.committed_marker(step), marker)
            self.storage.put_json(self.layout.latest, {"step": step, "uri": prefix})
            log.info("checkpoint: committed step %d (%d files) at %s", step, len(marker["files"]), prefix)
            self.prune(step)
        self.last_committed = step
        shutil.rmtree(staging, ignore_errors=True)

    def prune(self, just_committed: int) -> None:
        by_step = commit.group_by_step(self.storage.list(self.layout.checkpoints), self.layout.checkpoints)
        committed = {s for s, files in by_step.items() if commit.COMMITTED in files}
        for step in commit.prune_plan(list(by_step), committed, self.keep, just_committed):
            self.storage.delete_prefix(self.layout.checkpoint(step))
            log.info("checkpoint: pruned step %d (keeping the newest %d)", step, self.keep)

    # --- choose (any single process) -----------------------------------------------------
    def find_latest(self) -> tuple[int | None, dict | None]:
        """The newest trustworthy checkpoint as (step, marker); (None, None) when there is none."""
        by_step = commit.group_by_step(self.storage.list(self.layout.checkpoints), self.layout.checkpoints)
        skipped = []
        for step in commit.newest_first(by_step):
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
                raise RuntimeError(f"checkpoint file {uri} has sha256 {got}, _COMMITTED says {entry['sha256']}; "
                                   f"the checkpoint is corrupt: delete its _COMMITTED to fall back to an older one")
        return local

    # --- load (collective) -----------------------------------------------------------
    def load_latest(self, model, optimizer) -> tuple[int, dict] | None:
        """Restore model and optimizer from the newest valid checkpoint; (step, extras) or None."""
        step, marker = self.find_latest() if self.rank == 0 else (None, None)
        step, marker = parallel.broadcast_object((step, marker))
        if step is None:
            return None
        local = self.download(step, marker)
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
