"""Committed checkpoints as files: where a rank keeps them, how one is verified, picked and fetched.

A checkpoint ``checkpoints/step_<N>/`` is trusted only if its ``_COMMITTED`` lists files that
all exist with their sizes (``trainer.commit`` decides); a download is checked against the
listed sha256 too. Any single process can read them: the :class:`trainer.checkpoint.Checkpointer`
on rank 0 when it picks one to resume from, and ``trainer export`` / ``trainer evaluate``.

Files of a checkpoint: DCP's ``.metadata`` and ``__<r>_<i>.distcp`` shards (the model and the
optimizer), and one ``extra_rank<r>.pt`` per rank holding the per-rank states by name.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn

from trainer import commit
from trainer.contract import RunLayout, join
from trainer.data import cache_dir
from trainer.storage import NotFound, Storage, sha256_file

log = logging.getLogger("trainer.checkpoint")  # one logger for everything about checkpoints


class CorruptCheckpoint(RuntimeError):
    """A committed checkpoint's file does not match the checksum in its ``_COMMITTED``."""


def fresh_dir(path: Path) -> Path:
    """``path`` as a new empty folder (whatever was there is gone)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def local_root(run_uri: str, rank: int) -> Path:
    """This rank's node-local folder for one run's checkpoint files (staging and downloads).

    Rank-specific: ranks sharing a node must not clobber each other's files.
    """
    return cache_dir() / "checkpoints" / hashlib.sha256(run_uri.encode()).hexdigest()[:16] / f"rank{rank}"


def per_rank_file(rank: int) -> str:
    """The name of the file that holds ``rank``'s per-rank states."""
    return f"extra_rank{rank}.pt"


def per_rank_state_dicts(saved: dict[str, Any]) -> dict[str, Any]:
    """The per-rank states of an ``extra_rank<r>.pt``, by state name.

    Checkpoints written before the states had names hold one flat dict (``step``, ``cursor``,
    ``rng``, ``scheduler``, ``scaler``, ``world_size``); they are read as the same states.
    """
    if "train_state" in saved:
        return saved
    named = {"train_state": {k: saved[k] for k in ("step", "cursor", "rng")}, "scheduler": saved["scheduler"]}
    if saved.get("scaler"):
        named["scaler"] = saved["scaler"]
    return named


def checked_marker(
    storage: Storage, layout: RunLayout, step: int, listed: bool = True
) -> tuple[dict[str, Any] | None, str | None]:
    """``(marker, problem)`` for the checkpoint at ``step``: problem is None when it can be trusted.

    :param listed: whether a listing showed a ``_COMMITTED`` (False: it is not fetched).
    """
    marker: object = None
    if listed:
        try:
            marker = storage.get_json(layout.committed_marker(step))
        except (NotFound, ValueError):
            marker = None
    sizes: dict[str, int | None] = {}
    for entry in marker.get("files", []) if isinstance(marker, dict) else []:
        head = storage.head(join(layout.checkpoint(step), entry["name"]))
        sizes[entry["name"]] = head["size"] if head else None
    found = marker if isinstance(marker, dict) else None
    return found, commit.marker_problem(found, sizes, step)


def find_latest(
    storage: Storage, layout: RunLayout, exclude: frozenset[int] = frozenset()
) -> tuple[int, dict[str, Any]] | None:
    """The newest trustworthy checkpoint as ``(step, marker)``; None when there is none.

    The log names the one picked and why each newer one was skipped.
    """
    by_step = commit.group_by_step(storage.list(layout.checkpoints), layout.checkpoints)
    skipped = []
    picked = None
    for step in commit.newest_first(by_step):
        if step in exclude:
            continue
        marker, problem = checked_marker(storage, layout, step, listed=commit.COMMITTED in by_step[step])
        if problem is None and marker is not None:
            picked = step, marker
            break
        skipped.append((step, problem))
    for old_step, reason in skipped:
        log.warning("checkpoint: skipped step %d: %s", old_step, reason)
    if picked is not None:
        log.info("checkpoint: picked step %d at %s", picked[0], layout.checkpoint(picked[0]))
    return picked


def download(storage: Storage, layout: RunLayout, step: int, marker: dict[str, Any], root: Path) -> Path:
    """Fetch every file of the committed checkpoint into ``root/load/step_<N>``, checksummed."""
    local = fresh_dir(root / "load" / f"step_{step:08d}")
    for entry in marker["files"]:
        uri = join(layout.checkpoint(step), entry["name"])
        path = local / entry["name"]
        storage.download_file(uri, path)
        got = sha256_file(path)
        if got != entry["sha256"]:
            raise CorruptCheckpoint(
                f"checkpoint file {uri} has sha256 {got}, _COMMITTED says {entry['sha256']}; "
                f"the checkpoint is corrupt: delete its _COMMITTED to fall back to an older one"
            )
    return local


def load_model_weights(local_dir: Path, model: nn.Module) -> None:
    """Fill a plain (unsharded) model from a downloaded DCP checkpoint, in a single process."""
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        # DCP warns that it found no process group; a single process is exactly what we mean.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=dcp.FileSystemReader(local_dir), no_dist=True)
    model.load_state_dict(state["model"])
