"""Notes on the DAG run and on a task instance, written from a running task.

Airflow 3.3's Task SDK lets a task read its DAG run's note (``context["dag_run"].note``) but
not write it: the execution API that workers talk to has no route for notes. So a note is
written one of two ways, tried in this order:

1. **The metadata database**, where the task runs in the process that owns it: ``dag.test()``
   (so ``python -m trainops demo``) and ``airflow tasks test``. A task run by an executor's
   supervisor has its database access blocked (Airflow 3), and this way is skipped.
2. **Airflow's public REST API**: ``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}`` and
   ``.../taskInstances/{task_id}`` with ``update_mask=note``, through the Airflow connection
   named by ``[trainops] airflow_api_conn_id`` (default ``trainops_airflow_api``): its host is
   the API server's base URL (``http://airflow-api-server:8080``); with a login and password
   a token is fetched from ``/auth/token``, or the extra ``{"token": "..."}`` is used as it is.
   The user needs permission to edit DAG runs and task instances.

Where neither is available, a warning says how to enable the second; nothing else changes (a
note is where a person looks first, never what a decision depends on). A note the user wrote
when triggering the run is kept: ours is appended. Credentials never reach the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from trainer.storage.retry import backoff_delay
from trainops.gate.verdict import fit_note
from trainops.operators.base import task_identity

__all__ = [
    "DEFAULT_API_CONN_ID",
    "NOTE_BUDGET_S",
    "TRANSIENT_STATUSES",
    "combined_note",
    "retry_wait",
    "write_notes",
]

DEFAULT_API_CONN_ID = "trainops_airflow_api"

# The whole note write through the API (the token, the run's note, the task's note, and every
# retry of each) gives up after about this long: a note is where a person looks first, never
# worth holding a worker. A rollout that outlasts it leaves the note in the task's log.
NOTE_BUDGET_S = 30.0
# Statuses that mean "not now" (throttled; a load balancer with no healthy API server behind
# it, or one that timed out waiting for it): retried. Every other status >= 400 is final: bad
# credentials, no permission, an unknown run, a bad request, and a 500 (a bug retrying won't fix).
TRANSIENT_STATUSES = frozenset({429, 502, 503, 504})
REQUEST_TIMEOUT_S = 10.0  # each of one request's connect, write and read timeouts, cut to what is left
FIRST_DELAY_S = 0.5  # a lost reply or a reset is usually cured by a quick retry
MAX_DELAY_S = 8.0
RETRY_AFTER_CAP_S = 10.0  # a longer Retry-After is not waited out in full
MIN_TRY_S = 1.0  # no retry is started with less than this left of the budget


def combined_note(existing: str | None, ours: str) -> str:
    """``ours`` after a note already there (a person's, written at trigger time), unless that
    note already holds it (a retried task); cut to the API's limit."""
    if not existing or not existing.strip():
        return fit_note(ours)
    if ours in existing:
        return existing
    return fit_note(f"{existing.rstrip()}\n\n{ours}")


def api_conn_id() -> str:
    """``[trainops] airflow_api_conn_id`` (env ``AIRFLOW__TRAINOPS__AIRFLOW_API_CONN_ID``)."""
    from airflow.configuration import conf

    return conf.get("trainops", "airflow_api_conn_id", fallback=DEFAULT_API_CONN_ID) or DEFAULT_API_CONN_ID


def write_notes(context: Mapping[str, Any], *, run_note: str, task_note: str | None, log: Any) -> str | None:
    """Append ``run_note`` to the DAG run's note and ``task_note`` (if any) to this task
    instance's; return how (``"database"`` or ``"api"``), or None when neither way is open."""
    ti = context.get("ti")
    if ti is None:
        return None
    ids = task_identity(context)
    if _via_database(ids, run_note, task_note):
        return "database"
    conn_id = api_conn_id()
    dag_run = context.get("dag_run")
    existing = getattr(dag_run, "note", None)
    try:
        if _via_api(conn_id, ids, combined_note(existing, run_note), task_note):
            return "api"
    except Exception as exc:  # a note never fails the task
        log.warning("could not set the run note through Airflow's API (connection %r): %s", conn_id, exc)
        return None
    log.warning(
        "the run note was not set: this worker cannot write Airflow's metadata database, and there is "
        "no Airflow connection %r to reach Airflow's REST API with; create one (host: the API "
        "server's URL, login and password of a user who may edit DAG runs) or set "
        "[trainops] airflow_api_conn_id. The note was:\n%s",
        conn_id,
        run_note,
    )
    return None


def _via_database(ids: Mapping[str, Any], run_note: str, task_note: str | None) -> bool:
    try:
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            dag_run = session.scalar(select(DagRun).filter_by(dag_id=ids["dag_id"], run_id=ids["run_id"]))
            if dag_run is None:
                return False
            dag_run.note = combined_note(dag_run.note, run_note)
            if task_note is not None:
                row = session.scalar(select(TaskInstance).filter_by(**ids))
                if row is not None:
                    row.note = combined_note(row.note, task_note)
        return True
    except Exception:  # blocked (a supervised worker), or no database here: try the API
        return False


def _via_api(
    conn_id: str, ids: Mapping[str, Any], run_note: str, task_note: str | None, *, client: Any = None
) -> bool:
    """PATCH the notes through Airflow's public API; False when there is no connection.
    ``client``: an httpx client to use instead of one for the connection's host (tests)."""
    import httpx
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    if client is None:
        client = httpx.Client(base_url=_base_url(conn), timeout=10.0)
    with client:
        token = (conn.extra_dejson or {}).get("token")
        if not token:
            reply = client.post("/auth/token", json={"username": conn.login, "password": conn.password})
            _check(reply, "POST /auth/token")
            token = reply.json()["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        run_path = f"/api/v2/dags/{quote(ids['dag_id'], safe='')}/dagRuns/{quote(ids['run_id'], safe='')}"
        reply = client.patch(
            run_path, params={"update_mask": "note"}, json={"note": run_note}, headers=headers
        )
        _check(reply, f"PATCH {run_path}")
        if task_note is not None:
            ti_path = f"{run_path}/taskInstances/{quote(ids['task_id'], safe='')}"
            if ids["map_index"] >= 0:
                ti_path += f"/{ids['map_index']}"
            # The API replaces a task instance's note: this task wrote it, so nothing is lost.
            reply = client.patch(
                ti_path, params={"update_mask": "note"}, json={"note": fit_note(task_note)}, headers=headers
            )
            _check(reply, f"PATCH {ti_path}")
    return True


def _base_url(conn: Any) -> str:
    host = (conn.host or "").rstrip("/")
    if not host:
        raise ValueError(f"Airflow connection {conn.conn_id!r} has no host: set it to the API server's URL")
    if "://" not in host:
        host = f"{conn.schema or 'http'}://{host}"
    if conn.port and host.count(":") < 2:
        host = f"{host}:{conn.port}"
    return host


def _check(reply: Any, what: str) -> None:
    if reply.status_code >= 400:
        # The body says why (permission, unknown run); it never holds our credentials.
        raise RuntimeError(f"{what} answered {reply.status_code}: {reply.text[:200]}")


def retry_wait(
    status: int | None,
    fault: str | None,
    *,
    retry: int,
    retry_after: str | None = None,
    draw: float = 0.5,
    left_s: float = NOTE_BUDGET_S,
) -> float | None:
    """Seconds to wait before retry number ``retry`` (1, 2, ...) of a request that answered
    ``status``, or failed without a reply (``fault``: ``"timeout"`` or ``"connection"``); None
    when it must not be retried: the failure is permanent (any status but
    :data:`TRANSIENT_STATUSES`), or waiting would leave less than :data:`MIN_TRY_S` of the
    ``left_s`` seconds the note write has left.

    The wait doubles from :data:`FIRST_DELAY_S` up to :data:`MAX_DELAY_S`, its upper half drawn
    (``draw`` in [0, 1)), unless the reply said ``Retry-After: <seconds>``: then that, at most
    :data:`RETRY_AFTER_CAP_S`. (An HTTP-date ``Retry-After`` is not read: the backoff applies.)
    """
    if fault is None and status not in TRANSIENT_STATUSES:
        return None
    wait = backoff_delay(retry, draw, first=FIRST_DELAY_S, cap=MAX_DELAY_S)
    asked = _seconds(retry_after) if fault is None else None
    if asked is not None:
        wait = min(asked, RETRY_AFTER_CAP_S)
    if wait + MIN_TRY_S > left_s:
        return None
    return wait


def _seconds(value: str | None) -> float | None:
    """A ``Retry-After`` of delay-seconds, or None (absent, an HTTP-date, nonsense)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


def _fault(exc: BaseException) -> str | None:
    """What a request that got no reply ran into, when trying again may cure it: a timeout, or a
    connection refused, reset or closed without a reply; None for anything else."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return "connection"
    return None
