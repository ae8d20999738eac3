"""Finding the training runs under the served roots, for the fleet page and the home page: one
listing of each root (:func:`list_roots`), every ``runs/<dag>/<run>/<task>/job.json`` in it
(:mod:`trainops.cost.runs`), the newest of each DAG (:func:`find_runs`), each read through the
checks of :mod:`trainops.reports.access` and checked as a run's record
(:func:`trainops.shapes.check_job`: a damaged one is a row that says which field is wrong); and
the fleet page's query parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trainer.contract import safe_segment
from trainer.storage import StorageError, StorageUnavailable
from trainops.cost.runs import run_of
from trainops.hooks.storage import storage_for
from trainops.reports import access, fleet
from trainops.reports.access import JOB_NAME, ReportRequestError, ReportTarget
from trainops.shapes import ShapeError, check_job, load

if TYPE_CHECKING:
    from trainer.storage import Storage

__all__ = [
    "FLEET_DEFAULT_RUNS",
    "FLEET_MAX_RUNS",
    "FLEET_MAX_SCANNED",
    "find_runs",
    "fleet_dag",
    "fleet_limit",
    "list_roots",
]

FLEET_DEFAULT_RUNS = 20  # runs per DAG on the fleet page without ?limit=
FLEET_MAX_RUNS = 100  # the most ?limit= may ask for: each run is one job.json read
FLEET_MAX_SCANNED = 1000  # job.json objects per DAG whose time is asked (one HEAD each)


def fleet_limit(value: str) -> int:
    """The fleet page's ``limit`` parameter: runs per DAG, :data:`FLEET_DEFAULT_RUNS` when
    empty, at most :data:`FLEET_MAX_RUNS`; ReportRequestError (400) when not a positive integer."""
    if not value.strip():
        return FLEET_DEFAULT_RUNS
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ReportRequestError(
            400, f"limit {value!r} is not a positive whole number: pass ?limit=20 (at most {FLEET_MAX_RUNS})"
        )
    return min(limit, FLEET_MAX_RUNS)


def fleet_dag(value: str) -> str | None:
    """The fleet page's ``dag`` parameter as the runs' folder name, or None when empty;
    ReportRequestError (400) for a name that cannot be a folder (``.``, ``..``, control characters)."""
    if not value:
        return None
    if access.CONTROL.search(value):
        raise ReportRequestError(400, f"dag {value!r} contains control characters")
    try:
        return safe_segment(value)
    except ValueError as exc:
        raise ReportRequestError(400, f"dag {value!r} is not a DAG id: {exc}") from None


def _run_ids(target: ReportTarget) -> tuple[str, str, str] | None:
    """``(dag_id, run_id, task_id)`` of ``[<prefix>/]runs/<dag>/<run>/<task>/job.json``
    (:func:`trainops.cost.runs.run_of`), else None; also None when the page's access check
    would ask about another DAG (a ``runs`` folder inside a run), so a run is shown only to
    those who may open its report."""
    run = run_of(target.relative)
    if run is None or access.required_access(target) != run.dag_id:
        return None
    return run.dag_id, run.run_id, run.task


def find_runs(
    roots: Sequence[str],
    aws_conn_id: str | None,
    *,
    limit: int,
    dag_id: str | None = None,
    may_read: Callable[[str], bool] = lambda dag: True,
    listed: Sequence[tuple[str, Storage, list[str] | None]] | None = None,
) -> tuple[list[fleet.FleetRun], int, list[str]]:
    """``(runs, hidden DAGs, problems)``: the newest ``limit`` runs of each DAG under ``roots``.

    A run is a ``runs/<dag>/<run>/<task>/job.json`` in a listing of ``<root>``, at any depth
    (:mod:`trainops.cost.runs`: a DAG's own storage root may lie below a listed one). Each is checked as any report is (under its root, no ``.``
    segment, no symbolic link out of the root) and read with the same byte cap; DAGs that
    ``may_read`` refuses are counted, not read. The newest are those whose ``job.json`` was
    written last (one HEAD each, for the :data:`FLEET_MAX_SCANNED` highest run ids of a DAG).
    A run that cannot be read is returned with the reason; a root that cannot be listed is a
    problem, and the other roots are still shown. ``listed``: the roots already listed by
    :func:`list_roots` (the home page lists once for runs, models and datasets).
    """
    problems: list[str] = []
    if listed is None:
        listed, problems = list_roots(roots, aws_conn_id)
    found: dict[str, tuple[Storage, ReportTarget, tuple[str, str, str]]] = {}
    for root, storage, uris in listed:
        for uri in uris or []:
            if not uri.endswith("/" + JOB_NAME):
                continue
            try:
                target = access.check_report_uri(uri, [root])
            except ReportRequestError:
                continue  # a name with a "." segment or control characters is no run of ours
            ids = _run_ids(target)
            if ids is not None and (dag_id is None or ids[0] == dag_id):
                found.setdefault(target.uri, (storage, target, ids))
    by_dag: dict[str, list[tuple[Storage, ReportTarget, tuple[str, str, str]]]] = {}
    for item in found.values():
        by_dag.setdefault(item[2][0], []).append(item)
    hidden = 0
    runs: list[fleet.FleetRun] = []
    down: set[str] = set()  # roots found unavailable while this page was read
    for dag in sorted(by_dag):
        if not may_read(dag):
            hidden += 1
            continue
        candidates = sorted(by_dag[dag], key=lambda item: item[2][1:], reverse=True)[:FLEET_MAX_SCANNED]
        if len(by_dag[dag]) > FLEET_MAX_SCANNED:
            problems.append(
                f"DAG {dag!r} has {len(by_dag[dag])} runs; only the {FLEET_MAX_SCANNED} with the highest "
                "run ids were considered"
            )
        dated = [(_mtime(storage, target, down), storage, target, ids) for storage, target, ids in candidates]
        dated.sort(key=lambda d: (d[0] is None, -(d[0] or 0.0)))
        for mtime, storage, target, ids in dated[:limit]:
            runs.append(_read_run(storage, target, ids, mtime, down))
    return runs, hidden, problems


def list_roots(
    roots: Sequence[str], aws_conn_id: str | None, *, what: str = "its runs are"
) -> tuple[list[tuple[str, Storage, list[str] | None]], list[str]]:
    """``([(root, client, URIs or None when unlisted)], problems)``: one listing of each root,
    each problem a sentence naming the root that could not be listed and saying that ``what``
    (``its runs are``) not shown."""
    listed: list[tuple[str, Storage, list[str] | None]] = []
    problems: list[str] = []
    for root in roots:
        storage = storage_for(root, aws_conn_id, outage_tolerance_s=access.OUTAGE_TOLERANCE_S)
        try:
            listed.append((root, storage, list(storage.list(root))))
        except StorageUnavailable:
            listed.append((root, storage, None))
            problems.append(
                f"storage is unavailable: listing {root!r} kept failing for {access.OUTAGE_TOLERANCE_S:g} s, "
                f"so {what} not shown; reload this page in a minute"
            )
        except (StorageError, OSError) as exc:
            listed.append((root, storage, None))
            problems.append(f"could not list {root!r}, so {what} not shown: {exc}")
    return listed, problems


def _mtime(storage: Storage, target: ReportTarget, down: set[str]) -> float | None:
    """When the run's job.json was last written, None when that cannot be told (it is read,
    and its problem shown, later). A root found unavailable joins ``down``: its other runs
    are not asked, so an outage costs a page one tolerance, not one per run."""
    if target.root in down:
        return None
    try:
        head = storage.head(target.uri)
    except StorageUnavailable:
        down.add(target.root)
        return None
    except (StorageError, OSError):
        return None
    mtime = head.get("mtime") if head else None
    return float(mtime) if isinstance(mtime, (int, float)) else None


def _read_run(
    storage: Storage, target: ReportTarget, ids: tuple[str, str, str], mtime: float | None, down: set[str]
) -> fleet.FleetRun:
    run = fleet.FleetRun(
        dag_id=ids[0], run_id=ids[1], task_id=ids[2], uri=target.uri, mtime=mtime, job=None, problem=None
    )
    if target.root in down:
        return {
            **run,
            "problem": (
                f"not read: the storage behind {target.root!r} was unavailable for this page; reload "
                "it in a minute"
            ),
        }
    try:
        if target.uri.startswith("file://"):
            access.check_real_path(target)
        data = access.read_with_client(storage, target, access.MAX_REPORT_BYTES)
    except ReportRequestError as exc:
        if exc.status == 503:
            down.add(target.root)
        return {**run, "problem": exc.message}
    try:
        job = load(data.decode("utf-8", errors="replace"), target.uri, check_job)
    except ShapeError as exc:
        return {**run, "problem": str(exc)}
    return {**run, "job": job}
