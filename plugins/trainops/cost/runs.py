"""Where the training runs are: the one rule by which the fleet page and the estimate before
launch recognise a run's ``job.json`` in a storage listing.

A run's record is ``<storage root>/runs/<dag_id>/<run_id>/<task>/job.json``
(``trainer.contract.run_prefix``), where ``<task>`` is the task id, or ``<task_id>.<map_index>``
for a mapped task. The storage root a DAG passes (``storage_root``) may itself lie below the
root that is listed: a team's ``s3://bucket/trainops/team-a`` under ``s3://bucket/trainops``.
So a run is recognised by the last five segments of its path, at any depth below the listed
root, never by its depth. A listing is recursive on every backend (the storage client has no
delimiter listing), so one listing of a root finds the runs of every prefix below it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.storage import Storage

__all__ = ["JOB_NAME", "RunPath", "run_of", "runs_below", "task_matches"]

JOB_NAME = "job.json"
_MAPPED = re.compile(r"^(?P<task>.+)\.(?P<index>\d+)$")


@dataclass(frozen=True)
class RunPath:
    """A run's ``job.json`` found in a listing: ``prefix`` is the storage root it was written
    under, relative to the listed root ("" for that root itself)."""

    prefix: str
    dag_id: str
    run_id: str
    task: str  # the task id, or <task_id>.<map_index> for a mapped task


def run_of(relative: str) -> RunPath | None:
    """The run whose ``job.json`` is at ``relative`` (a path below the listed root, without a
    leading ``/``), or None when the path is not ``[<prefix>/]runs/<dag>/<run>/<task>/job.json``."""
    parts = relative.split("/")
    if len(parts) < 5 or parts[-1] != JOB_NAME or parts[-5] != "runs" or not all(parts[-4:-1]):
        return None
    if any(p in ("", ".", "..") for p in parts[:-5]):
        return None
    return RunPath(prefix="/".join(parts[:-5]), dag_id=parts[-4], run_id=parts[-3], task=parts[-2])


def task_matches(task: str, task_id: str) -> bool:
    """Whether a run's ``<task>`` segment is the task ``task_id`` (a mapped instance included);
    ``task_id`` as :func:`trainer.contract.safe_segment` writes it."""
    if task == task_id:
        return True
    mapped = _MAPPED.match(task)
    return mapped is not None and mapped.group("task") == task_id


def runs_below(storage: Storage, root: str, *, dag_id: str | None = None) -> list[tuple[str, RunPath]]:
    """``(job.json URI, RunPath)`` of the runs below ``root``, from one listing.

    :param dag_id: only this DAG's runs written under ``root`` itself (the estimate's view: a
        DAG writes to its own storage root), from a listing of ``<root>/runs/<dag_id>/``
        alone; as :func:`trainer.contract.safe_segment` writes it. None: every run at any
        depth, from a listing of the whole root (the fleet page's view).
    """
    base = root.rstrip("/") + "/"
    found = []
    for uri in storage.list(base + f"runs/{dag_id}" if dag_id else root):
        run = run_of(uri[len(base) :]) if uri.startswith(base) else None
        if run is not None and (dag_id is None or (run.dag_id == dag_id and not run.prefix)):
            found.append((uri, run))
    return found
