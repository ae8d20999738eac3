"""Checkpoint commit decisions as plain functions over plain data (no I/O, no torch).

A checkpoint ``checkpoints/step_<N>/`` is trusted only if its ``_COMMITTED`` marker lists
files that all exist with the listed sizes. The files sit in the folder of the attempt that
wrote them, ``step_<N>/attempt_<k>/``, which the marker names (``dir``); markers written before
that have no ``dir`` and their files sit in ``step_<N>/`` itself. ``trainer.checkpoint.save`` does
the I/O around these.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainer.contract import ATTEMPT_DIR_PREFIX, attempt_of_files_dir, checkpoint_step_of

COMMITTED = "_COMMITTED"
MARKER_FORMAT = "trainops.checkpoint/v1"


def commit_marker(
    *, step: int, files: list[dict], world_size: int, time: float, attempt: int | None = None, **extra
) -> dict:
    """The ``_COMMITTED`` document: ``files`` holds ``{"name", "size", "sha256"}`` entries.

    :param attempt: the attempt that wrote the checkpoint; its files are in ``attempt_<k>/``.
    """
    names = [f["name"] for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"checkpoint step {step} lists a file twice: {sorted(names)}")
    owner = {} if attempt is None else {"attempt": int(attempt), "dir": f"{ATTEMPT_DIR_PREFIX}{int(attempt)}"}
    return {
        "format": MARKER_FORMAT,
        "step": int(step),
        "world_size": int(world_size),
        "time": time,
        "files": sorted(files, key=lambda f: f["name"]),
        **owner,
        **extra,
    }


def files_dir(marker: dict) -> str:
    """The folder inside ``step_<N>/`` that holds the marker's files ("" for ``step_<N>/`` itself).

    Only an attempt folder is accepted: a marker must never send a reader outside its checkpoint.
    """
    folder = marker.get("dir") or ""
    if folder and attempt_of_files_dir(folder) is None:
        raise ValueError(f"_COMMITTED names the files folder {folder!r}; expected attempt_<number>")
    return folder


def file_name(relative: str) -> tuple[int | None, str] | None:
    """``(attempt, name)`` for an object's path inside ``step_<N>/`` (attempt None: directly in
    it); None for anything deeper or in another folder."""
    folder, _, name = relative.rpartition("/")
    if not folder:
        return None, name
    attempt = attempt_of_files_dir(folder)
    return (attempt, name) if attempt is not None else None


def marker_problem(marker: dict | None, sizes: dict[str, int | None] | None, step: int) -> str | None:
    """Why the checkpoint at ``step`` cannot be trusted, or None if it can.

    ``sizes`` maps each file name listed by the marker to its size in storage (None: missing);
    ``sizes=None`` checks the marker's shape only.
    """
    if marker is None:
        return "no _COMMITTED marker (its save did not finish)"
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return f"_COMMITTED is not a {MARKER_FORMAT} document"
    if marker.get("step") != step:
        return f"_COMMITTED says step {marker.get('step')!r}, the folder says step {step}"
    if not marker.get("files"):
        return "_COMMITTED lists no files"
    try:
        files_dir(marker)
    except ValueError as exc:
        return str(exc)
    if sizes is None:
        return None
    for entry in marker["files"]:
        size = sizes.get(entry["name"])
        if size is None:
            return f"file {entry['name']} listed in _COMMITTED is missing"
        if size != entry["size"]:
            return f"file {entry['name']} has {size} bytes, _COMMITTED says {entry['size']}"
    return None


def group_by_step(uris: list[str], checkpoints_prefix: str) -> dict[int, dict[str, str]]:
    """``{step: {path inside the step folder: uri}}`` for every object directly inside a
    ``step_<N>`` folder or inside one of its ``attempt_<k>`` folders (``attempt_2/.metadata``)."""
    prefix = checkpoints_prefix.rstrip("/") + "/"
    out: dict[int, dict[str, str]] = {}
    for uri in uris:
        if not uri.startswith(prefix):
            continue
        folder, _, relative = uri[len(prefix) :].partition("/")
        step = checkpoint_step_of(folder) if relative else None
        if step is not None and file_name(relative) is not None:
            out.setdefault(step, {})[relative] = uri
    return out


def attempts_in(files: dict[str, str]) -> set[int]:
    """The attempts with a files folder among one step's objects (from :func:`group_by_step`)."""
    found = (file_name(relative) for relative in files)
    return {entry[0] for entry in found if entry is not None and entry[0] is not None}


def superseded(files: dict[str, str], attempt: int) -> tuple[list[int], list[str]]:
    """What ``attempt``'s new commit of a step made obsolete in that step's folder: the older
    attempts with a files folder there, and the files written before attempts had folders. Never
    ``_COMMITTED``, never a newer attempt's files."""
    older = sorted(a for a in attempts_in(files) if a < attempt)
    legacy = sorted(uri for relative, uri in files.items() if "/" not in relative and relative != COMMITTED)
    return older, legacy


def newest_first(steps: Iterable[int]) -> list[int]:
    return sorted(steps, reverse=True)
