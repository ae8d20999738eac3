"""The node-local checkpoint tier: each node keeps its ranks' files of the newest checkpoint.

A save lands on node-local disk first (each rank's staging folder, ``trainer.checkpoint.save``)
and goes to storage in the background. Before a rank hands its staged files to the upload, it
links each one into the node's folder of that checkpoint (``files.node_dir``: by run, step and
the attempt that wrote it), the folder a load fetches into. Once the commit is agreed, each
file gets its sidecar (``trainer.checkpoint.node_cache``: the size and sha256 learnt while it
was written), and the node's older checkpoint folders go. A load then finds the files this node
wrote verified against ``_COMMITTED`` and reads them in place; any other file it fetches from
storage, checksummed, as before. So an in-place restart (``trainer.runtime.restarts``) or a
bad-loss rollback reads its own shards from local disk, and a whole-gang relaunch onto fresh
pods, whose disk is empty, reads storage.

A link costs no copy and no second write (the staging folder and the tier are on the same
disk); the upload then moves or reads the staged name. Where a link cannot be made, that file
simply is not in the tier. The commit protocol is unchanged: ``_COMMITTED`` and the fence say
which checkpoint counts, and a tier file is used only when its sidecar matches the marker's
checksum and the file was not modified since (its mtime).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.checkpoint import node_cache
from trainer.checkpoint.files import Written, node_dir
from trainer.contract import ATTEMPT_DIR_PREFIX, checkpoint_step_of

log = logging.getLogger("trainer.checkpoint")


def folder(run_uri: str, step: int, attempt: int) -> Path:
    """The node's folder of checkpoint ``step`` written by ``attempt`` (what a load reads)."""
    return node_dir(run_uri, step, {"dir": f"{ATTEMPT_DIR_PREFIX}{int(attempt)}"})


@dataclass
class Kept:
    """The files one rank linked into the tier for one save (:func:`keep`)."""

    folder: Path
    names: list[str] = field(default_factory=list)


def keep(staged: Iterable[Path], into: Path) -> Kept:
    """Link each staged file into the tier folder ``into`` (replacing whatever an earlier,
    uncommitted save of the same step left under its name). The tier only saves a download:
    a file that cannot be linked (a full or read-only disk, a folder in its place) stays out of
    it, and the save goes on to storage as it would without the tier."""
    kept = Kept(into)
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning(
            "checkpoint: the node-local tier is unavailable (%s); this save goes to storage only", exc
        )
        return kept
    for path in staged:
        target = into / path.name
        try:
            node_cache.sidecar(target).unlink(missing_ok=True)  # never a sidecar beside other bytes
            target.unlink(missing_ok=True)
            os.link(path, target)
        except OSError as exc:
            log.debug("checkpoint: %s stays out of the node-local tier (%s)", path.name, exc)
            continue
        kept.names.append(path.name)
    return kept


def committed(kept: Kept, written: Written) -> None:
    """The save ``kept`` belongs to was committed: mark its files verified, with the size and
    sha256 learnt while they were written (the very figures in ``_COMMITTED``)."""
    for name in kept.names:
        found = written.get(name)
        if found is not None:
            node_cache.record_verified(kept.folder / name, *found)


def dropped(kept: Kept) -> None:
    """The save ``kept`` belongs to was not committed: its files leave the tier."""
    for name in kept.names:
        node_cache.sidecar(kept.folder / name).unlink(missing_ok=True)
        (kept.folder / name).unlink(missing_ok=True)


def held(into: Path, marker: Mapping[str, Any]) -> list[str]:
    """The files of the checkpoint ``marker`` commits that the node's folder ``into`` holds
    verified against it (their size and sha256), and so need not be fetched."""
    return sorted(
        entry["name"]
        for entry in marker.get("files", [])
        if node_cache.is_verified(into / entry["name"], entry["sha256"], entry["size"])
    )


def prune(run_uri: str, newest: int) -> list[int]:
    """Remove the node's checkpoint folders of steps other than ``newest`` (the tier holds one
    checkpoint); the steps removed."""
    root = node_dir(run_uri, newest, {}).parents[1]  # .../node
    removed = []
    for path in root.glob("step_*") if root.is_dir() else []:
        step = checkpoint_step_of(path.name)
        if step is not None and step != newest:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(step)
    return sorted(removed)


def node_key(cache: Path) -> str:
    """Which node a rank is on, for counting a load's files once per node: its host and its
    node cache (local nodes share the host, pods on a cluster share the cache's path)."""
    return f"{socket.gethostname()}:{cache}"


def restore_files(touched: list[tuple[str, list[str], list[str]]]) -> dict[str, int]:
    """``{"local": n, "storage": m}`` for a load, from each rank's ``(node, files it read,
    files it downloaded)``: a file counts once per node; it came from storage if a rank of that
    node downloaded it, else the node held it already (the tier)."""
    read: dict[str, set[str]] = {}
    fetched: dict[str, set[str]] = {}
    for node, names, downloaded in touched:
        read.setdefault(node, set()).update(names)
        fetched.setdefault(node, set()).update(downloaded)
    storage = sum(len(fetched[n] & read[n]) for n in read)
    return {"local": sum(len(read[n]) for n in read) - storage, "storage": storage}
