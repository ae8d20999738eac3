"""Checkpoint commit decisions as plain functions over plain data (no I/O, no torch).

A checkpoint ``checkpoints/step_<N>/`` is trusted only if its ``_COMMITTED`` marker lists
files that all exist with the listed sizes. ``trainer.checkpoint`` does the I/O around these.
"""

from __future__ import annotations

from trainer.contract import checkpoint_step_of

COMMITTED = "_COMMITTED"
MARKER_FORMAT = "trainops.checkpoint/v1"


def commit_marker(*, step: int, files: list[dict], world_size: int, time: float, **extra) -> dict:
    """The ``_COMMITTED`` document: ``files`` holds ``{"name", "size", "sha256"}`` entries."""
    names = [f["name"] for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"checkpoint step {step} lists a file twice: {sorted(names)}")
    return {
        "format": MARKER_FORMAT,
        "step": int(step),
        "world_size": int(world_size),
        "time": time,
        "files": sorted(files, key=lambda f: f["name"]),
        **extra,
    }


def marker_problem(marker: dict | None, sizes: dict[str, int | None], step: int) -> str | None:
    """Why the checkpoint at ``step`` cannot be trusted, or None if it can.

    ``sizes`` maps each file name listed by the marker to its size in storage (None: missing).
    """
    if marker is None:
        return "no _COMMITTED marker (its save did not finish)"
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return f"_COMMITTED is not a {MARKER_FORMAT} document"
    if marker.get("step") != step:
        return f"_COMMITTED says step {marker.get('step')!r}, the folder says step {step}"
    if not marker.get("files"):
        return "_COMMITTED lists no files"
    for entry in marker["files"]:
        size = sizes.get(entry["name"])
        if size is None:
            return f"file {entry['name']} listed in _COMMITTED is missing"
        if size != entry["size"]:
            return f"file {entry['name']} has {size} bytes, _COMMITTED says {entry['size']}"
    return None


def group_by_step(uris: list[str], checkpoints_prefix: str) -> dict[int, dict[str, str]]:
    """``{step: {file name: uri}}`` for every object directly inside a ``step_<N>`` folder."""
    prefix = checkpoints_prefix.rstrip("/") + "/"
    out: dict[int, dict[str, str]] = {}
    for uri in uris:
        if not uri.startswith(prefix):
            continue
        folder, _, name = uri[len(prefix) :].rpartition("/")
        step = checkpoint_step_of(folder) if folder and "/" not in folder else None
        if step is not None:
            out.setdefault(step, {})[name] = uri
    return out


def newest_first(steps) -> list[int]:
    return sorted(steps, reverse=True)


def prune_plan(steps: list[int], committed: set[int], keep: int, just_committed: int) -> list[int]:
    """Steps whose folders to delete after ``just_committed`` was committed, oldest first.

    Keeps the ``keep`` newest committed checkpoints up to ``just_committed`` (always that one).
    Folders older than it and not kept go: superseded commits and leftovers of interrupted
    saves. Folders newer than it are never touched, whatever wrote them.
    """
    if keep < 1:
        raise ValueError(f"checkpoint.keep must be at least 1, got {keep}")
    candidates = [s for s in newest_first(committed | {just_committed}) if s <= just_committed]
    kept = set(candidates[:keep]) | {just_committed}
    return sorted(s for s in steps if s < just_committed and s not in kept)
