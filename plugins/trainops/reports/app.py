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
the ``cost`` in its ``job.json``, or, for a live run or one older than the accounting, the
accounting of it now. Its first line is its outcome (:mod:`trainops.reports.run_outcome`), for
which the app also reads the gate's decision and the promotion record beside it
(``eval/gate.json``, ``eval/promotion.json``), the versions
promoted from it (the production pointers, as for the bar of links) and its ``config.yaml``
(``train.max_steps``, for a live run's progress), each with the checks of any report.

``GET <base_url>/trainops/fleet[?limit=N][&dag=DAG]`` is the fleet page
(:mod:`trainops.reports.fleet`): the last ``N`` runs of each DAG (default
:data:`FLEET_DEFAULT_RUNS`, at most :data:`FLEET_MAX_RUNS`), found by listing every root
(:func:`find_runs`): runs under a DAG's own storage root below a listed root are found too. Each ``job.json`` passes the checks every
report does (under a root, no ``.`` segments, no symbolic link out, at most
:data:`MAX_REPORT_BYTES`); one that fails them, or cannot be read, is a row saying why. The page
needs website access, and shows only the DAGs whose task instances the user may read.

A stored record that is damaged or foreign (a ``job.json``, ``card.json``, production pointer or
dataset manifest that is cut short, or not of its kind's shape: :mod:`trainops.shapes`) is a
page (200) that names the file, the field and what was expected, with what the file holds; on
the home and fleet pages it is the row's reason. Never a 500.

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

Every page carries a bar of links (the trainops home, the fleet page, its Airflow run, its
run's report or model cards) and reloads while its run is live: :mod:`trainops.reports.frame`
decides, from what :mod:`trainops.reports.around` finds. ``GET <base_url>/trainops/`` is the
home page (:mod:`trainops.reports.home`, read by :mod:`trainops.reports.reader`).

The checks and the reading are in :mod:`trainops.reports.access` (the runs' listing in
:mod:`trainops.reports.fleet_reader`); this module holds the routes
and the access checks of Airflow's auth manager. It imports FastAPI and Airflow's API security
modules, so only the API server imports it: the plugin builds the app on the first request
(see ``trainops.plugin``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView, DagAccessEntity
from airflow.api_fastapi.core_api.security import get_user, requires_access_dag, requires_access_view
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import HTTPException
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainops.links import airflow_base_url
from trainops.reports import fleet, pages, run_page
from trainops.reports.access import (
    CONN_ID_ENV,
    JOB_NAME,
    ReportRequestError,
    ReportTarget,
    allowed_roots,
    check_report_uri,
    read_report,
    read_run_metrics,
    required_access,
)
from trainops.reports.around import around_report
from trainops.reports.card_page import render_card_page
from trainops.reports.fleet_reader import FLEET_DEFAULT_RUNS, find_runs, fleet_dag, fleet_limit
from trainops.reports.frame import Around, frame_links
from trainops.reports.home import home_page
from trainops.reports.home_runs import dag_run_rows
from trainops.reports.html import framed
from trainops.reports.notes_check import notes_conn_id, notes_problem
from trainops.reports.reader import Reads, max_steps_of, read_home

# Re-exported: the checks as the app applies them (trainops.reports.access holds them).
__all__ = [
    "ReportRequestError",
    "allowed_roots",
    "check_report_uri",
    "create_app",
    "report_page",
    "required_access",
]

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


def _authorize(request: Request, user, dag_id: str | None) -> None:
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
    report = None
    if target.uri.endswith(pages.JSON_SUFFIXES):
        try:
            report = json.loads(data.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            report = None
    reads = Reads(roots, conn_id)
    return around_report((target.root, target.relative), report, reads.read, reads.listing, reads.locate)


def _json_beside(job: ReportTarget, name: str, roots: Sequence[str], conn_id: str | None) -> dict | None:
    """The JSON object ``name`` (``eval/metrics.json``: the loss curve's eval points;
    ``eval/gate.json`` and ``eval/promotion.json``: the outcome) below the run folder of ``job``, read with the checks of
    any report; None when there is none yet, or it cannot be read or is not a JSON object (the
    page then says there is no evaluation, or no decision)."""
    uri = job.uri[: -len(JOB_NAME)] + name  # trainer.contract.RunLayout: eval_metrics, eval_gate, promotion
    try:
        found = json.loads(read_report(check_report_uri(uri, roots), conn_id))
    except (ReportRequestError, ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def _max_steps(job: ReportTarget, data: bytes, roots: Sequence[str], conn_id: str | None) -> int | None:
    """The run's ``train.max_steps`` (its ``config.yaml``), for its progress; None if unknown."""
    try:
        record = json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return max_steps_of(Reads(roots, conn_id), record) if isinstance(record, dict) else None


def _served_under(roots: Sequence[str]) -> Callable[[str], bool]:
    """Whether a URI on a page may link to its report: one this app would serve."""

    def served(uri: str) -> bool:
        try:
            check_report_uri(uri, roots)
        except ReportRequestError:
            return False
        return True

    return served


def report_page(target: ReportTarget, roots: Sequence[str], conn_id: str | None) -> str:
    """The page of the checked report ``target``, with its bar of links, as ``GET /report``
    serves it once the user may read it (also what ``docs/img/screenshots.py`` measures)."""
    data = read_report(target, conn_id)
    around = _around(target, data, roots, conn_id)
    if target.uri.endswith("/card.json"):
        page = render_card_page(target.uri, data, linkable=_served_under(roots))
    elif target.uri.endswith("/" + JOB_NAME):
        metrics, problem, where = read_run_metrics(target, roots, conn_id)
        page = run_page.render_run_report(
            target.uri,
            data,
            metrics,
            metrics_problem=problem,
            metrics_uri=where,
            now=time.time(),
            evaluation=_json_beside(target, "eval/metrics.json", roots, conn_id),
            gate=_json_beside(target, "eval/gate.json", roots, conn_id),
            promotion=_json_beside(target, "eval/promotion.json", roots, conn_id),
            promoted=around.cards,
            max_steps=_max_steps(target, data, roots, conn_id),
            linkable=_served_under(roots),
        )
    else:
        page = pages.render_report(target.uri, data)
    return _framed(page, around)


def create_app() -> FastAPI:
    """The report app, to mount at ``/trainops``; needs Airflow's auth manager initialised."""
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
        return HTMLResponse(report_page(target, roots, conn_id), headers=_HEADERS)

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
        _authorize(request, user, None)
        try:
            roots = allowed_roots()
        except ValueError as exc:
            raise ReportRequestError(500, str(exc)) from None
        conn_id = os.environ.get(CONN_ID_ENV) or "aws_default"
        now = time.time()
        may_read = _may_read_dag(request, user)
        runs, models, datasets, hidden, problems = read_home(roots, conn_id, may_read=may_read, now=now)
        dag_runs, dag_runs_problem = dag_run_rows(roots, conn_id, may_read=may_read, known=runs, now=now)
        problems = [*problems, *filter(None, [notes_problem(notes_conn_id())])]
        page = home_page(
            runs,
            models,
            datasets,
            base_url=airflow_base_url(),
            hidden_dags=hidden,
            problems=problems,
            dag_runs=dag_runs,
            dag_runs_problem=dag_runs_problem,
            now=now,
        )
        live = any((entry["run"]["job"] or {}).get("status") == "running" for entry in runs) or any(
            r.outcome.kind == "running" for r in dag_runs
        )
        return HTMLResponse(_framed(page, live=live), headers=_HEADERS)

    return app
