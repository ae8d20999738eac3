"""The report app: stored trainops reports as HTML, served by Airflow's API server.

``GET <base_url>/trainops/report?uri=<storage URI>`` reads one stored report (a dataset's
``validation.json``, a run's ``eval/gate.json`` or ``job.json``, a model version's
``card.json``, a Markdown or other text file) and renders it with
:mod:`trainops.reports.pages`. The plugin mounts the app at ``/trainops``.

Which objects are served: only URIs under a trainops storage root, that is the default root
(``$TRAINOPS_STORAGE_ROOT``, see :mod:`trainops.settings`) plus any roots listed in
``$TRAINOPS_REPORT_ROOTS`` (comma or space separated, for DAGs that pass their own
``storage_root``). URIs with ``.`` or ``..`` segments or another scheme get 400, URIs
outside every root (another bucket or prefix, a path or symbolic link leading out of the
root) get 403, and only ``.json`` and text files (``.md``, ``.yaml``, ...) of at most
:data:`MAX_REPORT_BYTES` are read. ``s3://`` is read with the Airflow connection named by
``$TRAINOPS_REPORTS_AWS_CONN_ID`` (default ``aws_default``), as the operators do through
:func:`trainops.hooks.storage.storage_for`. A run's ``job.json`` is shown as the run report:
the app also reads the run's metrics beside it (its parts and any ``metrics.jsonl`` of the
previous version; same checks, at most :data:`MAX_METRICS_BYTES` together, only what is new
since the last request for the run) for the loss curve and throughput, and says why when it
cannot.

The report page of a run shows its cost and goodput (:mod:`trainops.reports.cost_page`):
the ``cost`` in its ``job.json``, or, for a run older than the accounting, the accounting of
it now.

``GET <base_url>/trainops/fleet[?limit=N][&dag=DAG]`` is the fleet page
(:mod:`trainops.reports.fleet`): the last ``N`` runs of each DAG (default
:data:`FLEET_DEFAULT_RUNS`, at most :data:`FLEET_MAX_RUNS`), found by listing every root
(:func:`find_runs`): runs under a DAG's own storage root below a listed root are found too. Each ``job.json`` passes the checks every
report does (under a root, no ``.`` segments, no symbolic link out, at most
:data:`MAX_REPORT_BYTES`); one that fails them, or cannot be read, is a row saying why. The page
needs website access, and shows only the DAGs whose task instances the user may read.

A storage outage is a 503 page that names it, with ``Retry-After``, after riding it out for at
most :data:`OUTAGE_TOLERANCE_S` per request: a person is waiting for the page, and the API
server's request threads are not to be held for the operators' two minutes.

Authentication: Airflow does NOT protect plugin apps. ``init_plugins`` in
``airflow/api_fastapi/app.py`` (Airflow 3.3.2, lines 229-253) attaches each entry of
``fastapi_apps`` with a bare ``app.mount(url_prefix, subapp)``; the core API is
authenticated by dependencies on its own routers, which a mounted app does not inherit, and
the root middlewares (``init_middlewares``, ``airflow/api_fastapi/core_api/app.py`` line
173: JWT refresh, the auth manager's own middlewares, gzip) refresh a session cookie when
one is sent but require none. So every request here depends on Airflow's own ``get_user``
(``airflow/api_fastapi/core_api/security.py`` line 145), which accepts the UI's session
cookie (scoped to ``[api] base_url``'s path, so a browser sends it to ``/trainops`` too) or an
``Authorization: Bearer`` token, and answers 401 otherwise. It then asks the auth manager:
reports under ``runs/<dag_id>/`` need read access to that DAG's task instances
(``requires_access_dag``), every other report needs access to the Airflow website
(``requires_access_view(AccessView.WEBSITE)``).

This module imports FastAPI; Airflow's API security modules are imported only by
:func:`create_app`, which the plugin calls on the first request (see ``trainops.plugin``).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import HTTPException
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainer.contract import MetricsReader, MetricsRecord, MetricsTooLarge
from trainops.reports import fleet, pages, run_page
from trainops.reports.frame import Around, frame_links
from trainops.reports.html import framed

if TYPE_CHECKING:
    from trainer.storage import Storage

__all__ = [
    "FLEET_DEFAULT_RUNS",
    "FLEET_MAX_RUNS",
    "FLEET_MAX_SCANNED",
    "MAX_METRICS_BYTES",
    "MAX_REPORT_BYTES",
    "OUTAGE_TOLERANCE_S",
    "ReportRequestError",
    "ReportTarget",
    "allowed_roots",
    "check_real_path",
    "check_report_uri",
    "create_app",
    "find_runs",
    "fleet_dag",
    "fleet_limit",
    "read_report",
    "read_run_metrics",
    "read_with_client",
    "required_access",
]

REPORT_ROOTS_ENV = "TRAINOPS_REPORT_ROOTS"
CONN_ID_ENV = "TRAINOPS_REPORTS_AWS_CONN_ID"
MAX_REPORT_BYTES = 5 * 1024 * 1024
MAX_METRICS_BYTES = 32 * 1024 * 1024  # a run's metrics, read for its job.json's page
READERS_KEPT = 8  # runs whose metrics readers are kept between requests (see read_run_metrics)
# Seconds one storage request of a page rides out an outage before the page says so (503).
OUTAGE_TOLERANCE_S = 10.0
RETRY_AFTER_S = 30  # what the 503 page's Retry-After header suggests
JOB_NAME = "job.json"
FLEET_DEFAULT_RUNS = 20  # runs per DAG on the fleet page without ?limit=
FLEET_MAX_RUNS = 100  # the most ?limit= may ask for: each run is one job.json read
FLEET_MAX_SCANNED = 1000  # job.json objects per DAG whose time is asked (one HEAD each)

_HEADERS = {
    # Report contents are escaped; the policy is a second line: no script, no fetches.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ReportRequestError(Exception):
    """A request the app refuses or cannot serve; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class ReportTarget:
    """A checked request: the report's URI, the root holding it, and its path below the root."""

    uri: str
    root: str
    relative: str


# ----------------------------------------------------------------------------- pure checks


def _split(uri: str) -> tuple[str, str, str]:
    """``(scheme, bucket, path)``; file URIs have an empty bucket and an absolute path."""
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://") :].partition("/")
        return "s3", bucket, key
    path = uri[len("file://") :]
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    return "file", "", path


def _below(path: str, base: str) -> str | None:
    """``path`` relative to ``base`` ("" for a bucket-wide root), or None when not below it."""
    base = base.rstrip("/")
    if not base:
        relative = path.lstrip("/")
    elif path.startswith(base + "/"):
        relative = path[len(base) + 1 :]
    else:
        return None
    return relative or None


def check_report_uri(uri: str, roots: Sequence[str]) -> ReportTarget:
    """Where ``uri`` lies among ``roots``; raise ReportRequestError (400, 403) if it may not be read.

    :param uri: what the request asked for, e.g. ``s3://bucket/root/datasets/d/v/validation.json``.
    :param roots: allowed storage roots, validated (no trailing slash).
    """
    if not uri or not uri.strip():
        raise ReportRequestError(
            400,
            "the uri parameter is empty: pass ?uri=<storage URI of a "
            "report>, such as the one an operator's link points to",
        )
    if _CONTROL.search(uri):
        raise ReportRequestError(400, f"uri {uri!r} contains control characters")
    if not uri.startswith(("file://", "s3://")):
        raise ReportRequestError(
            400, f"uri {uri!r} is not a trainops storage URI: use s3://bucket/... or file:///..."
        )
    scheme, bucket, path = _split(uri)
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ReportRequestError(
            400, f"uri {uri!r} contains a '.' or '..' segment: give the report's direct URI"
        )
    if scheme == "file":
        if not path.startswith("/"):
            raise ReportRequestError(400, f"uri {uri!r} is not an absolute file:/// URI")
        path = posixpath.normpath(path)
    for root in roots:
        root_scheme, root_bucket, root_path = _split(root)
        if (root_scheme, root_bucket) != (scheme, bucket):
            continue
        if scheme == "file":
            root_path = posixpath.normpath(root_path)
        relative = _below(path, root_path)
        if relative is not None:
            canonical = f"s3://{bucket}/{path}" if scheme == "s3" else f"file://{path}"
            break
    else:
        raise ReportRequestError(
            403,
            f"uri {uri!r} is outside the trainops storage roots {list(roots)}; only "
            f"reports under them are served (the API server adds roots from "
            f"${REPORT_ROOTS_ENV})",
        )
    if not canonical.endswith(pages.JSON_SUFFIXES + pages.TEXT_SUFFIXES):
        suffixes = ", ".join(pages.JSON_SUFFIXES + pages.TEXT_SUFFIXES)
        raise ReportRequestError(
            400, f"uri {uri!r} is not a report: only files ending in {suffixes} are rendered"
        )
    return ReportTarget(uri=canonical, root=root, relative=relative)


def required_access(target: ReportTarget) -> str | None:
    """The DAG whose task-instance read access the report needs, or None (website access):
    a report below ``runs/<dag_id>/``, whether under the root itself or under a DAG's own
    storage root below it (``team-a/runs/<dag_id>/...``, see :mod:`trainops.cost.runs`)."""
    parts = target.relative.split("/")
    for i, part in enumerate(parts[:-2]):
        if part == "runs" and parts[i + 1]:
            return parts[i + 1]
    return None


# ----------------------------------------------------------------------------- I/O


def allowed_roots() -> list[str]:
    """The default storage root and the roots in ``$TRAINOPS_REPORT_ROOTS``, read each call."""
    from trainops.settings import default_storage_root, resolve_storage_root

    roots = [default_storage_root()]
    for item in re.split(r"[,\s]+", os.environ.get(REPORT_ROOTS_ENV, "")):
        if not item:
            continue
        try:
            roots.append(resolve_storage_root(item))
        except ValueError as exc:
            raise ValueError(f"${REPORT_ROOTS_ENV} entry {item!r} is invalid: {exc}") from None
    return list(dict.fromkeys(roots))


def check_real_path(target: ReportTarget) -> None:
    """Refuse a file:// report that a symbolic link places outside its root."""
    path, root = _split(target.uri)[2], _split(target.root)[2]
    real, real_root = os.path.realpath(path), os.path.realpath(root or "/")
    if real_root != "/" and not real.startswith(real_root.rstrip("/") + "/"):
        raise ReportRequestError(
            403,
            f"uri {target.uri!r} leads outside the storage root {target.root!r} through a "
            "symbolic link; only reports inside the root are served",
        )


def read_report(target: ReportTarget, aws_conn_id: str | None, max_bytes: int = MAX_REPORT_BYTES) -> bytes:
    """The report's bytes, read with the operators' storage client (with the app's outage
    tolerance); ReportRequestError if not: 503 naming the outage when storage is unavailable."""
    from trainops.hooks.storage import storage_for

    if target.uri.startswith("file://"):
        check_real_path(target)
    storage = storage_for(target.root, aws_conn_id, outage_tolerance_s=OUTAGE_TOLERANCE_S)
    return read_with_client(storage, target, max_bytes)


def read_with_client(storage: Storage, target: ReportTarget, max_bytes: int) -> bytes:
    """:func:`read_report` with a client at hand (the root and link checks already done)."""
    from trainer.storage import NotFound, StorageError, StorageUnavailable

    try:
        head = storage.head(target.uri)
        if head is None:
            raise NotFound(target.uri)
        if head.get("size", 0) > max_bytes:
            raise ReportRequestError(
                413,
                f"{target.uri!r} holds {head['size']} bytes, more than the "
                f"{max_bytes} a report page shows; download it with your storage "
                "tools instead",
            )
        return storage.get(target.uri)
    except NotFound:
        raise ReportRequestError(
            404, f"no report at {target.uri!r}: the task has not written it (yet), or it was deleted"
        ) from None
    except StorageUnavailable as exc:
        last = re.search(r"\(last: (.*?)\), beyond", str(exc))
        why = f" (last: {last.group(1)})" if last else ""
        raise ReportRequestError(
            503,
            f"storage is unavailable: reading {target.uri!r} kept failing for "
            f"{OUTAGE_TOLERANCE_S:g} s{why}. This is an outage of the storage behind "
            f"{target.root!r}, not a missing report: reload this page in a minute, and check the "
            "storage endpoint if it persists",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    except (StorageError, OSError) as exc:
        raise ReportRequestError(502, f"could not read {target.uri!r}: {exc}") from None


def read_run_metrics(
    job: ReportTarget, roots: Sequence[str], aws_conn_id: str | None
) -> tuple[list[MetricsRecord] | None, str | None, str]:
    """``(records, None, where)`` of the metrics beside a run's ``job.json``, or
    ``(None, why, where)``; ``where`` is the parts' folder, or the previous version's
    ``metrics.jsonl`` when the run has only that.

    Read by :class:`trainer.contract.MetricsReader`: the run's parts and the previous version's
    ``metrics.jsonl``. Each object goes through the same checks as any report (under a root,
    no symbolic link out of it), and together they may hold at most :data:`MAX_METRICS_BYTES`.
    The reader of each recently shown run is kept (:data:`READERS_KEPT`), so a reload reads
    only the parts written since.
    """
    from trainer.storage import StorageError, StorageUnavailable
    from trainops.hooks.storage import storage_for

    run_uri = job.uri[: -len("/" + JOB_NAME)]

    def check(uri: str) -> None:
        target = check_report_uri(uri, roots)
        if target.uri.startswith("file://"):
            check_real_path(target)

    storage = storage_for(job.root, aws_conn_id, outage_tolerance_s=OUTAGE_TOLERANCE_S)
    reader, lock = _readers.reader(storage, job.root, run_uri, check)
    try:
        with lock:
            # this request's client (its connection may have changed) and roots
            reader.storage, reader.check = storage, check
            records = reader.records()
            found, parts = reader.found, reader.parts_held
    except ReportRequestError as exc:
        return None, exc.message, reader.parts_uri + "/"
    except MetricsTooLarge as exc:
        return None, str(exc), reader.parts_uri + "/"
    except StorageUnavailable:
        return (
            None,
            (
                f"storage is unavailable: reading the metrics under {run_uri!r} kept failing for "
                f"{OUTAGE_TOLERANCE_S:g} s; reload this page in a minute"
            ),
            reader.parts_uri + "/",
        )
    except (StorageError, OSError) as exc:
        return None, f"could not read the metrics under {run_uri!r}: {exc}", reader.parts_uri + "/"
    finally:
        _readers.trim()
    where = reader.parts_uri + "/" if parts else reader.legacy_uri
    if not found:
        return None, f"no metrics were found next to {JOB_NAME} (no step logged yet?)", where
    return records, None, where


# ----------------------------------------------------------------------------- the fleet


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
    from trainer.contract import safe_segment

    if not value:
        return None
    if _CONTROL.search(value):
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
    from trainops.cost.runs import run_of

    run = run_of(target.relative)
    if run is None or required_access(target) != run.dag_id:
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
                target = check_report_uri(uri, [root])
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
    from trainer.storage import StorageError, StorageUnavailable
    from trainops.hooks.storage import storage_for

    listed: list[tuple[str, Storage, list[str] | None]] = []
    problems: list[str] = []
    for root in roots:
        storage = storage_for(root, aws_conn_id, outage_tolerance_s=OUTAGE_TOLERANCE_S)
        try:
            listed.append((root, storage, list(storage.list(root))))
        except StorageUnavailable:
            listed.append((root, storage, None))
            problems.append(
                f"storage is unavailable: listing {root!r} kept failing for {OUTAGE_TOLERANCE_S:g} s, "
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
    from trainer.storage import StorageError, StorageUnavailable

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
            check_real_path(target)
        data = read_with_client(storage, target, MAX_REPORT_BYTES)
    except ReportRequestError as exc:
        if exc.status == 503:
            down.add(target.root)
        return {**run, "problem": exc.message}
    try:
        job = json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as exc:
        return {**run, "problem": f"job.json is not valid JSON ({exc})"}
    if not isinstance(job, dict):
        return {**run, "problem": f"job.json holds a JSON {type(job).__name__}, not a run record"}
    return {**run, "job": job}


class _KeptReaders:
    """The metrics readers of the runs shown lately, newest last: at most :data:`READERS_KEPT`,
    and fewer when together they hold more than :data:`MAX_METRICS_BYTES` (the newest stays).
    Each has a lock: one request at a time reads a run's new parts, and the next finds them read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str], tuple[MetricsReader, threading.Lock]] = OrderedDict()

    def reader(
        self, storage: Storage, root: str, run_uri: str, check: Callable[[str], None]
    ) -> tuple[MetricsReader, threading.Lock]:
        with self._lock:
            kept = self._kept.pop((root, run_uri), None)
            if kept is None:
                kept = MetricsReader(storage, run_uri, max_bytes=MAX_METRICS_BYTES), threading.Lock()
            self._kept[(root, run_uri)] = kept
            return kept

    def trim(self) -> None:
        with self._lock:
            while len(self._kept) > 1 and (
                len(self._kept) > READERS_KEPT
                or sum(reader.held_bytes for reader, _ in self._kept.values()) > MAX_METRICS_BYTES
            ):
                self._kept.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


_readers = _KeptReaders()


def _authorize(request: Request, user, dag_id: str | None) -> None:
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        AccessView,
        DagAccessEntity,
    )
    from airflow.api_fastapi.core_api.security import requires_access_dag, requires_access_view

    try:
        if dag_id is not None:
            requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE, param_dag_id=dag_id)(request, user)
        else:
            requires_access_view(AccessView.WEBSITE)(request, user)
    except HTTPException as exc:
        what = f"task reports of DAG {dag_id!r}" if dag_id else "trainops reports"
        raise ReportRequestError(exc.status_code, f"user {user.get_name()!r} may not read {what}") from None


def _may_read_dag(request: Request, user) -> Callable[[str], bool]:
    """Whether ``user`` may read the task reports of a DAG (the fleet page's filter)."""

    def may_read(dag_id: str) -> bool:
        try:
            _authorize(request, user, dag_id)
        except ReportRequestError:
            return False
        return True

    return may_read


def _framed(document: str, around: Around | None = None, *, live: bool = False) -> str:
    """``document`` with the bar of links every page carries (see :mod:`trainops.reports.frame`)."""
    from trainops.links import airflow_base_url

    links, refresh_s = frame_links(around or Around(live=live), base_url=airflow_base_url())
    return framed(document, links, refresh_s=refresh_s)


def _error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(
        _framed(pages.error_page(status, message)),
        status_code=status,
        headers={**_HEADERS, **(headers or {})},
    )


def _around(target: ReportTarget, data: bytes, roots: Sequence[str], conn_id: str | None) -> Around:
    """What lies around the report ``target`` (its Airflow run, run report, model cards)."""
    from trainops.reports.around import around_report
    from trainops.reports.reader import Reads

    report = None
    if target.uri.endswith(pages.JSON_SUFFIXES):
        try:
            report = json.loads(data.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            report = None
    reads = Reads(roots, conn_id)
    return around_report((target.root, target.relative), report, reads.read, reads.listing, reads.locate)


def create_app() -> FastAPI:
    """The report app, to mount at ``/trainops``; needs Airflow's auth manager initialised."""
    from airflow.api_fastapi.core_api.security import get_user

    app = FastAPI(title="trainops reports", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ReportRequestError)
    async def _refused(request: Request, exc: ReportRequestError) -> HTMLResponse:
        return _error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        message = str(exc.detail)
        if exc.status_code == 401:
            message += ": log in to Airflow in this browser, then open the link again"
        return _error_response(exc.status_code, message, exc.headers)

    @app.get("/report", response_class=HTMLResponse)
    def report(
        request: Request,
        uri: str = Query("", description="storage URI of the report"),
        user=Depends(get_user),
    ) -> HTMLResponse:
        try:
            roots = allowed_roots()
        except ValueError as exc:
            raise ReportRequestError(500, str(exc)) from None
        target = check_report_uri(uri, roots)
        _authorize(request, user, required_access(target))
        conn_id = os.environ.get(CONN_ID_ENV) or "aws_default"
        data = read_report(target, conn_id)
        if target.uri.endswith("/" + JOB_NAME):
            metrics, problem, where = read_run_metrics(target, roots, conn_id)
            page = run_page.render_run_report(
                target.uri, data, metrics, metrics_problem=problem, metrics_uri=where, now=time.time()
            )
        else:
            page = pages.render_report(target.uri, data)
        return HTMLResponse(_framed(page, _around(target, data, roots, conn_id)), headers=_HEADERS)

    @app.get("/fleet", response_class=HTMLResponse)
    def fleet_page(
        request: Request,
        limit: str = Query("", description=f"runs per DAG (default {FLEET_DEFAULT_RUNS})"),
        dag: str = Query("", description="only this DAG's runs"),
        user=Depends(get_user),
    ) -> HTMLResponse:
        _authorize(request, user, None)
        runs_per_dag, dag_id = fleet_limit(limit), fleet_dag(dag)
        try:
            roots = allowed_roots()
        except ValueError as exc:
            raise ReportRequestError(500, str(exc)) from None
        conn_id = os.environ.get(CONN_ID_ENV) or "aws_default"
        runs, hidden, problems = find_runs(
            roots, conn_id, limit=runs_per_dag, dag_id=dag_id, may_read=_may_read_dag(request, user)
        )
        page = fleet.fleet_page(
            runs, limit=runs_per_dag, dag_id=dag_id, hidden_dags=hidden, problems=problems
        )
        return HTMLResponse(_framed(page), headers=_HEADERS)

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request, user=Depends(get_user)) -> HTMLResponse:
        from trainops.links import airflow_base_url
        from trainops.reports.home import home_page
        from trainops.reports.reader import read_home

        _authorize(request, user, None)
        try:
            roots = allowed_roots()
        except ValueError as exc:
            raise ReportRequestError(500, str(exc)) from None
        conn_id = os.environ.get(CONN_ID_ENV) or "aws_default"
        runs, models, datasets, hidden, problems = read_home(
            roots, conn_id, may_read=_may_read_dag(request, user), now=time.time()
        )
        page = home_page(
            runs, models, datasets, base_url=airflow_base_url(), hidden_dags=hidden, problems=problems
        )
        live = any((entry["run"]["job"] or {}).get("status") == "running" for entry in runs)
        return HTMLResponse(_framed(page, live=live), headers=_HEADERS)

    return app
