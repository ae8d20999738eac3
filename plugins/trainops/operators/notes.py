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

   API servers restart (rollouts) and sit behind load balancers, so each request (the token's
   and each PATCH) is retried on what passes: a 429, 502, 503 or 504 reply (after its
   ``Retry-After`` seconds, at most :data:`RETRY_AFTER_CAP_S`), a connection refused or reset
   or closed without a reply, a timeout; with exponential backoff and jitter. The whole write
   gives up after about :data:`NOTE_BUDGET_S` seconds. Any other status is final and warned
   about at once (400, 401, 403, 404, 409, 422, and a 500): credentials, permissions, an
   unknown run do not mend by waiting. One exception: a 401 on a PATCH with a token fetched
   here gets one fresh token (an API server that restarted with another signing secret), once
   per write. A retry is harmless where the server acted but the reply was lost: every try
   sends the same whole note, computed once from the note the run had at the start, so the
   note is set to the same text again, never doubled; the task instance's note is replaced.
   Which failures are retried and for how long is :func:`retry_wait`, a pure function.

Where neither is available, a warning says how to enable the second; nothing else changes (a
note is where a person looks first, never what a decision depends on); where the API refuses
or stays unreachable, a warning says why (the status, what to do; or how many tries over how
long, and the last error) and prints the note. A note never fails the task. A note the user
wrote when triggering the run is kept: ours is appended. Credentials (the password, a token)
never reach the log nor an exception's message: they are cut out of the API's replies too.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx
from airflow.configuration import conf
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from sqlalchemy import select

from trainer.storage.retry import backoff_delay
from trainops.gate.verdict import NOTE_LIMIT, fit_note
from trainops.operators.base import task_identity

__all__ = [
    "DEFAULT_API_CONN_ID",
    "NOTE_BUDGET_S",
    "TRANSIENT_STATUSES",
    "NoteNotWritten",
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

# The clock and the sleep of the retries: tests replace them, to retry without waiting.
_clock = time.monotonic
_sleep = time.sleep


def combined_note(existing: str | None, ours: str) -> str:
    """``ours`` after a note already there (a person's, written at trigger time), unless that
    note already holds it (a retried task); cut to the API's limit."""
    if not existing or not existing.strip():
        return fit_note(ours)
    if ours in existing:
        return existing
    # Ours whole, the note before it cut to make room: the newest part is what the run ended on.
    ours = fit_note(ours)
    room = NOTE_LIMIT - len(ours) - 2
    return f"{fit_note(existing.rstrip(), room)}\n\n{ours}" if room > len(" [...]") else ours


def api_conn_id() -> str:
    """``[trainops] airflow_api_conn_id`` (env ``AIRFLOW__TRAINOPS__AIRFLOW_API_CONN_ID``)."""
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
        # The run's whole note, computed once from the note it had: every try sends the same.
        if _via_api(conn_id, ids, combined_note(existing, run_note), task_note, log=log):
            return "api"
    except Exception as exc:  # a note never fails the task
        which = "the task instance's note" if getattr(exc, "run_note_set", False) else "the run note"
        log.warning(
            "could not set %s through Airflow's API (connection %r): %s. The note was:\n%s",
            which,
            conn_id,
            exc,
            run_note,
        )
        return None
    log.warning(
        "the run note was not set: this worker cannot write Airflow's metadata database, and there is "
        "no Airflow connection %r to reach Airflow's REST API with. Create it: airflow connections "
        "add %s --conn-type http --conn-host http://<api-server>:8080 --conn-login <user> "
        "--conn-password <password> (a user who may edit DAG runs; `make airflow` makes it for its "
        "own server; `python -m trainops doctor` checks it), or set [trainops] airflow_api_conn_id. "
        "The note was:\n%s",
        conn_id,
        conn_id,
        run_note,
    )
    return None


def _via_database(ids: Mapping[str, Any], run_note: str, task_note: str | None) -> bool:
    try:
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

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
    conn_id: str,
    ids: Mapping[str, Any],
    run_note: str,
    task_note: str | None,
    *,
    client: Any = None,
    log: Any = None,
) -> bool:
    """PATCH the notes through Airflow's public API; False when there is no connection.

    ``run_note`` is the whole note the run gets, computed once before the first try, so a
    retried PATCH whose first reply was lost sets the same text again and never doubles it.
    ``client``: an httpx client to use instead of one for the connection's host (tests).
    ``log``: where each retry is said (``info``). Raises :class:`NoteNotWritten` when a request
    is refused for good or its transient failures outlast :data:`NOTE_BUDGET_S`."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    # A client given (Starlette's TestClient) keeps its own timeouts: it warns at one per request.
    ours = client is None
    if client is None:
        client = httpx.Client(base_url=_base_url(conn), timeout=REQUEST_TIMEOUT_S)
    given_token = (conn.extra_dejson or {}).get("token")
    calls = _Calls(
        client, log, login=conn.login, password=conn.password, token=given_token, cut_timeouts=ours
    )
    run_path = f"/api/v2/dags/{quote(ids['dag_id'], safe='')}/dagRuns/{quote(ids['run_id'], safe='')}"
    with client:
        if not given_token:
            calls.token = calls.fetch_token()
        calls.patch_note(run_path, run_note, fetched=not given_token)
        if task_note is not None:
            ti_path = f"{run_path}/taskInstances/{quote(ids['task_id'], safe='')}"
            if ids["map_index"] >= 0:
                ti_path += f"/{ids['map_index']}"
            # The API replaces a task instance's note: this task wrote it, so nothing is lost.
            try:
                calls.patch_note(ti_path, fit_note(task_note), fetched=not given_token)
            except NoteNotWritten as exc:
                exc.run_note_set = True
                raise
    return True


class NoteNotWritten(Exception):
    """A note could not be written through the API: why, with no credential in it."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the refusing status, for a request refused for good
        self.run_note_set = False  # the run note was written; the task instance's was not


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
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return "connection"
    return None


# What to do about a status that is not retried, by status (and for 401, by who made the token).
_HINTS = {
    400: "the API server refused the request as malformed: check that the connection's host is an "
    "Airflow 3 API server",
    401: "the login and password were refused: check the connection's login and password",
    403: "the connection's user may not edit DAG runs and task instances: give it that permission "
    "(or use another user's login)",
    404: "that API server knows no such DAG run or task instance: check that the connection's host "
    "is the API server of the deployment this task runs in",
    409: "the API server refused the change as a conflict",
    422: "the API server refused the request as malformed: check that the connection's host is an "
    "Airflow 3 API server",
}
_GIVEN_TOKEN_REFUSED = (
    "the token in the connection's extra was refused (expired, or from another deployment): set a "
    "fresh one, or give the connection a login and password instead"
)
_FRESH_TOKEN_REFUSED = (
    "a token fetched moments before was refused: check that every API server has the same "
    "[api_auth] jwt_secret"
)


class _Calls:
    """One note write's requests: one deadline for them all (:data:`NOTE_BUDGET_S`), each request
    retried on transient failures (:func:`retry_wait`), secrets cut out of every message."""

    def __init__(
        self,
        client: Any,
        log: Any,
        *,
        login: str | None,
        password: str | None,
        token: str | None,
        cut_timeouts: bool = True,
    ) -> None:
        self.client = client
        self.log = log
        self.login = login
        self.password = password
        self.token = token
        self.secrets = [s for s in (password, token) if s]
        self.refreshed = False  # one fresh token per note write, after a 401
        self.cut_timeouts = cut_timeouts  # each request's timeouts cut to what is left of the budget
        self.start = _clock()
        self.deadline = self.start + NOTE_BUDGET_S
        self.random = random.Random()

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def fetch_token(self) -> str:
        """A token for the connection's login and password, from ``POST /auth/token``."""
        reply = self.send("POST", "/auth/token", json={"username": self.login, "password": self.password})
        try:
            token = reply.json()["access_token"]
        except (ValueError, KeyError, TypeError):
            token = None
        if not isinstance(token, str) or not token:
            raise NoteNotWritten(
                f"POST /auth/token answered {reply.status_code} without an access_token: check that "
                "the connection's host is an Airflow 3 API server"
            )
        self.secrets.append(token)
        return token

    def patch_note(self, path: str, note: str, *, fetched: bool) -> None:
        """Set the note at ``path`` to ``note``; on a 401 with a token fetched here, once per note
        write, fetch a fresh one and try again (an API server restarted with another secret)."""
        try:
            self._patch(path, note)
        except NoteNotWritten as exc:
            if exc.status != 401 or not fetched or self.refreshed:
                raise
            self.refreshed = True
            self._say("PATCH %s answered 401; fetching a fresh token", path)
            self.token = self.fetch_token()
            self._patch(path, note)

    def _patch(self, path: str, note: str) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        self.send("PATCH", path, params={"update_mask": "note"}, json={"note": note}, headers=headers)

    def send(self, method: str, path: str, **kwargs: Any) -> Any:
        """The reply to a request that succeeded (< 400), retried while :func:`retry_wait` says."""
        what = f"{method} {path}"
        tries = 0
        while True:
            tries += 1
            left = self.deadline - _clock()
            status: int | None = None
            fault: str | None = None
            retry_after: str | None = None
            try:
                if self.cut_timeouts:
                    kwargs["timeout"] = min(REQUEST_TIMEOUT_S, max(left, MIN_TRY_S))
                reply = self.client.request(method, path, **kwargs)
            except Exception as exc:
                fault = _fault(exc)
                last = self.redact(f"{type(exc).__name__}: {exc}".rstrip(": "))
                if fault is None:
                    raise NoteNotWritten(f"{what} failed: {last}") from exc
            else:
                if reply.status_code < 400:
                    return reply
                status = reply.status_code
                retry_after = reply.headers.get("Retry-After")
                # The body says why (permission, unknown run); a validation error may echo what
                # was sent, so secrets are cut out before it is shortened.
                last = f"answered {status}: {self.redact(reply.text)[:200]}"
            wait = retry_wait(
                status,
                fault,
                retry=tries,
                retry_after=retry_after,
                draw=self.random.random(),
                left_s=self.deadline - _clock(),
            )
            if wait is None:
                if fault is None and status not in TRANSIENT_STATUSES:
                    hint = _HINTS.get(status or 0, f"a {status} is not retried: see the API server's log")
                    if status == 401 and path != "/auth/token":
                        hint = _FRESH_TOKEN_REFUSED if self.refreshed else _GIVEN_TOKEN_REFUSED
                    raise NoteNotWritten(f"{what} {last}; {hint}", status=status)
                raise NoteNotWritten(
                    f"{what} gave up after {tries} {'try' if tries == 1 else 'tries'} over "
                    f"{_clock() - self.start:.1f} s (a note waits at most {NOTE_BUDGET_S:g} s); "
                    f"last: {last}"
                )
            self._say("%s %s; retry %d in %.1f s", what, last, tries, wait)
            _sleep(wait)

    def _say(self, message: str, *args: Any) -> None:
        if self.log is not None and hasattr(self.log, "info"):
            self.log.info(message, *args)


def _base_url(conn: Any) -> str:
    host = (conn.host or "").rstrip("/")
    if not host:
        raise ValueError(f"Airflow connection {conn.conn_id!r} has no host: set it to the API server's URL")
    if "://" not in host:
        host = f"{conn.schema or 'http'}://{host}"
    if conn.port and host.count(":") < 2:
        host = f"{host}:{conn.port}"
    return host
