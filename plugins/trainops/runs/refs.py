"""Which run a person means: a run URI (``s3://...``, ``file://...``; with or without
``/job.json``), a path on this machine (relative or absolute), ``<dag_id>/<run_id>`` (the
``train`` task's run, or ``<dag_id>/<run_id>/<task>``), or ``latest`` (the newest run under the
storage root, by its ``job.json``'s time). Bad input raises :class:`RunRefError`, one line
saying what was expected and what was found."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainer.contract import run_prefix
from trainer.storage import Storage
from trainops.cost.runs import JOB_NAME, RunPath, run_of

LATEST = "latest"
SCANNED = 200  # runs of each DAG whose time is asked for ``latest`` (the newest by their run id)


class RunRefError(ValueError):
    """The reference names no run; the message says what was expected and what was found."""


@dataclass(frozen=True)
class RunRef:
    """A run: its URI (the run prefix) and ids; ``root`` is the storage root it lies under
    (where its model's production pointer is), "" when unknown."""

    run_uri: str
    dag_id: str
    run_id: str
    task: str
    root: str = ""


EXPECTED = "expected a run URI (s3://... or file://...), a run folder, <dag_id>/<run_id> or 'latest'"


def _from_uri(uri: str) -> RunRef:
    """``<root>/runs/<dag>/<run>/<task>[/job.json]`` as a run; the root is what precedes ``runs``."""
    uri = uri.rstrip("/")
    if uri.endswith("/" + JOB_NAME):
        uri = uri[: -len(JOB_NAME) - 1]
    parts = uri.split("/")
    if (
        len(parts) < 5
        or parts[-4] != "runs"
        or not all(parts[-3:])
        or "." in parts[-3:]
        or ".." in parts[-3:]
    ):
        # a run prefix laid out otherwise (a run_uri of its own): its job.json will tell
        return RunRef(uri, "", uri.rsplit("/", 1)[-1], "train", "")
    return RunRef(uri, parts[-3], parts[-2], parts[-1], "/".join(parts[:-4]))


def resolve(ref: str, root: str, store: Storage | None = None) -> RunRef:
    """The run ``ref`` names, under the storage ``root`` (see the module docstring). ``store``
    (the root's storage) is needed for ``latest``."""
    ref = ref.strip()
    if not ref:
        raise RunRefError(f"an empty run: {EXPECTED}")
    if "://" in ref:
        if not ref.startswith(("s3://", "file://")):
            raise RunRefError(f"{ref!r}: only s3:// and file:// runs can be read; {EXPECTED}")
        return _from_uri(ref)
    if ref == LATEST:
        if store is None:
            raise RunRefError("'latest' needs the storage root's listing")
        return latest(store, root)
    path = Path(ref).expanduser()
    if path.exists() or ref.startswith(("./", "../", "/", "~")) or os.sep + "runs" + os.sep in ref:
        if not path.exists():
            raise RunRefError(f"{ref!r}: no such folder on this machine; {EXPECTED}")
        return _from_uri("file://" + str(path.resolve()))
    parts = ref.split("/")
    if len(parts) in (2, 3) and all(parts):
        task = parts[2] if len(parts) == 3 else "train"
        try:
            uri = run_prefix(root, parts[0], parts[1], task)
        except ValueError as exc:
            raise RunRefError(f"{ref!r}: {exc}") from None
        return RunRef(uri, parts[0], parts[1], task, root)
    raise RunRefError(f"{ref!r}: {EXPECTED}")


def newest(store: Storage, root: str, *, dag_id: str | None = None, limit: int = 1) -> list[RunRef]:
    """The ``limit`` runs under ``root`` (of ``dag_id`` only, when given) whose ``job.json`` was
    written last, newest first: one listing of ``<root>/runs/``, then one HEAD for each of the
    :data:`SCANNED` newest run ids of each DAG (by the date in the id, ``manual__<date>``,
    ``scheduled__<date>``: a manual run is not outranked by the prefix ``scheduled``)."""
    base = root.rstrip("/") + "/"
    by_dag: dict[str, list[tuple[str, RunPath]]] = {}
    for uri in store.list(base + "runs/"):
        run = run_of(uri[len(base) :])
        if run is not None and not run.prefix and dag_id in (None, run.dag_id):
            by_dag.setdefault(run.dag_id, []).append((uri, run))
    candidates = [
        uri
        for runs in by_dag.values()
        for uri, _ in sorted(runs, key=lambda i: i[1].run_id.split("__", 1)[-1], reverse=True)[:SCANNED]
    ]
    dated = sorted(
        ((float((store.head(uri) or {}).get("mtime") or 0.0), uri) for uri in candidates), reverse=True
    )
    return [_from_uri(uri) for _, uri in dated[:limit]]


def latest(store: Storage, root: str) -> RunRef:
    """The run under ``root`` whose ``job.json`` was written last (:func:`newest`)."""
    found = newest(store, root)
    if not found:
        raise RunRefError(
            f"no run under {root} yet (no runs/<dag>/<run>/<task>/job.json): run `make demo` first"
        )
    return found[0]
