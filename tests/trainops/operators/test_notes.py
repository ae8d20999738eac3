"""Notes from a task: a person's note is kept, a worker with no way to write says how, and the
API path rides out what passes (503s, resets, lost replies, timeouts, a restart) against a real
HTTP server in a thread, never doubling a note, and gives up at once on what does not."""

import contextlib
import json
import logging
import socket
import struct
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

from trainops.gate.verdict import NOTE_LIMIT
from trainops.operators.notes import combined_note, write_notes


def test_our_note_follows_the_persons_and_is_not_repeated_on_a_retry():
    assert combined_note(None, "REJECTED: x") == "REJECTED: x"
    assert combined_note("  ", "REJECTED: x") == "REJECTED: x"
    mine = "trying lr 3e-4"
    assert combined_note(mine, "REJECTED: x") == "trying lr 3e-4\n\nREJECTED: x"
    assert combined_note("trying lr 3e-4\n\nREJECTED: x", "REJECTED: x") == "trying lr 3e-4\n\nREJECTED: x"
    assert len(combined_note("a" * 900, "b" * 900)) == NOTE_LIMIT
    # the newest part stays whole, the note before it is cut to make room: a long approval
    # does not push promote's reason out
    approval, skipped = "APPROVED: " + "x" * 950, "NOT PROMOTED: identical to production v1."
    combined = combined_note(approval, skipped)
    assert len(combined) <= NOTE_LIMIT and combined.endswith(" [...]\n\n" + skipped)


class Log:
    def __init__(self):
        self.warnings = []
        self.infos = []

    def warning(self, message, *args):
        self.warnings.append(message % args)

    def info(self, message, *args):
        self.infos.append(message % args)


def test_without_the_database_or_a_connection_the_note_is_logged_with_how_to_enable_it(monkeypatch):
    from trainops.operators import notes

    monkeypatch.setattr(notes, "_via_database", lambda *a: False)  # as under a supervisor
    monkeypatch.delenv("AIRFLOW_CONN_TRAINOPS_AIRFLOW_API", raising=False)
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="gate", map_index=-1)
    log = Log()
    assert write_notes({"ti": ti}, run_note="REJECTED: x", task_note=None, log=log) is None
    (warning,) = log.warnings
    assert "no Airflow connection 'trainops_airflow_api'" in warning
    assert "[trainops] airflow_api_conn_id" in warning and warning.endswith("REJECTED: x")
    assert "airflow connections add trainops_airflow_api --conn-type http" in warning  # the fix, as a command


def test_an_api_that_refuses_is_a_warning_never_a_failure_and_shows_no_credentials(monkeypatch, no_waiting):
    from trainops.operators import notes

    monkeypatch.setattr(notes, "_via_database", lambda *a: False)
    conn = {"conn_type": "http", "host": "http://127.0.0.1:9", "login": "ada", "password": "s3cret-pw"}
    monkeypatch.setenv("AIRFLOW_CONN_TRAINOPS_AIRFLOW_API", json.dumps(conn))
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="gate", map_index=-1)
    log = Log()
    assert write_notes({"ti": ti}, run_note="REJECTED: x", task_note="x", log=log) is None
    (warning,) = log.warnings
    assert "could not set the run note through Airflow's API (connection 'trainops_airflow_api')" in warning
    assert "POST /auth/token gave up after " in warning and "last: ConnectError: " in warning
    assert len(no_waiting) >= 3  # refused connections were retried (without waiting here)
    assert "s3cret-pw" not in warning


def test_no_task_instance_no_note():
    assert write_notes({}, run_note="x", task_note=None, log=Log()) is None


# --------------------------------------------------------------------------- the API, with faults
PASSWORD = "s3cret-pw"
RUN_PATH = "/api/v2/dags/d/dagRuns/r"
TI_PATH = f"{RUN_PATH}/taskInstances/gate"


class _Dropped(Exception):
    """The connection was dropped on purpose: serve nothing more on it."""


class FakeApi:
    """Airflow's public API as far as notes go, on 127.0.0.1, in a thread: ``POST /auth/token``
    for the login ``ada`` and :data:`PASSWORD` (a fresh random token each time), and
    ``PATCH`` of the run's and the gate task's note with ``update_mask=note``, which replaces the
    stored note as Airflow does. ``faults[kind]`` (kind: ``"token"``, ``"run"``, ``"ti"``) lists
    what happens to that kind's next requests, one entry per request:

    - a status (``503``, ``403``), or ``(status, {"Retry-After": "3"})``: answered, nothing done;
    - ``"reset"``: the connection is reset (TCP RST) before anything is done;
    - ``"lost"``: the request is acted on, then the connection is closed without a reply;
    - ``"hang"``: nothing is done and nothing answered until the server stops;
    - ``"echo"``: a 422 whose body echoes the request, as FastAPI's validation errors do.

    ``requests`` records every request as ``(kind, what was done)``."""

    def __init__(self, run_note: str | None = None, port: int = 0) -> None:
        self.notes: dict[str, str | None] = {"run": run_note, "ti": None}
        self.faults: dict[str, list] = {"token": [], "run": [], "ti": []}
        self.requests: list[tuple[str, str]] = []
        self.tokens: set[str] = set()
        self.port = port
        self.released = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> "FakeApi":
        api = self

        class Handler(_ApiHandler):
            owner = api

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.requests if k == kind)

    def _next_fault(self, kind: str):
        with self._lock:
            return self.faults[kind].pop(0) if self.faults[kind] else None


class _ApiHandler(BaseHTTPRequestHandler):
    owner: FakeApi
    protocol_version = "HTTP/1.1"  # keep-alive, as a real API server

    def handle(self) -> None:
        with contextlib.suppress(_Dropped, ConnectionError):
            super().handle()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: ``requests`` says what happened."""

    def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self, *, reset: bool) -> None:
        """Close the connection without a reply: with a TCP RST (``reset``), or a clean FIN."""
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            self.connection.shutdown(socket.SHUT_RDWR)
        self.rfile.close()
        self.wfile.close()
        self.connection.close()
        raise _Dropped

    def do_POST(self) -> None:
        self._serve("token")

    def do_PATCH(self) -> None:
        path = urlsplit(self.path).path
        self._serve("run" if path == RUN_PATH else "ti" if path == TI_PATH else "unknown")

    def _serve(self, kind: str) -> None:
        api = self.owner
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        fault = api._next_fault(kind) if kind in api.faults else None
        if fault == "reset":
            api.requests.append((kind, "reset"))
            self._drop(reset=True)
        if fault == "hang":
            api.requests.append((kind, "hung"))
            api.released.wait(5)
            self._drop(reset=False)
        if fault == "echo":
            api.requests.append((kind, "422"))
            self._answer(422, {"detail": [{"type": "missing", "loc": ["body", "x"], "input": body}]})
            return
        if fault is not None and fault != "lost":
            status, headers = fault if isinstance(fault, tuple) else (fault, {})
            api.requests.append((kind, str(status)))
            self._answer(status, {"detail": f"fault {status}"}, headers)
            return
        if kind == "token":
            if body != {"username": "ada", "password": PASSWORD}:
                api.requests.append((kind, "401"))
                self._answer(401, {"detail": "Invalid credentials"})
                return
            token = f"jwt-{uuid.uuid4().hex}"
            api.tokens.add(token)
            status, reply = 201, {"access_token": token}
        elif kind == "unknown":
            status, reply = 404, {"detail": "The DagRun was not found"}
        elif self.headers.get("Authorization", "").removeprefix("Bearer ") not in api.tokens:
            status, reply = 401, {"detail": "Not authenticated"}
        else:
            assert parse_qs(urlsplit(self.path).query) == {"update_mask": ["note"]}
            api.notes[kind] = body["note"]  # the API replaces the note
            status, reply = 200, {"note": body["note"]}
        api.requests.append((kind, "lost" if fault == "lost" else str(status)))
        if fault == "lost":
            self._drop(reset=False)
        self._answer(status, reply)


@pytest.fixture
def no_waiting(monkeypatch):
    """Retries without waiting: each backoff is recorded, and the module's clock runs on by it.
    (``raising=False``: the same tests run against a notes.py without retries, and fail there.)"""
    from trainops.operators import notes

    waits: list[float] = []
    monkeypatch.setattr(notes, "_sleep", waits.append, raising=False)
    monkeypatch.setattr(notes, "_clock", lambda: time.monotonic() + sum(waits), raising=False)
    return waits


@pytest.fixture
def api(monkeypatch, no_waiting):
    """A :class:`FakeApi` that the connection ``trainops_airflow_api`` names (login and
    password), as for a worker under a supervisor (no database)."""
    from trainops.operators import notes

    monkeypatch.setattr(notes, "_via_database", lambda *a: False)
    server = FakeApi(run_note="trying lr 3e-4").start()
    connect(monkeypatch, server.url)
    yield server
    server.stop()


def connect(monkeypatch, url: str, **fields) -> None:
    conn = {"conn_type": "http", "host": url, "login": "ada", "password": PASSWORD, **fields}
    monkeypatch.setenv("AIRFLOW_CONN_TRAINOPS_AIRFLOW_API", json.dumps(conn))


def write(run_note: str | None = "trying lr 3e-4") -> tuple[str | None, Log]:
    """write_notes for the gate task of run ``r`` of DAG ``d`` whose note was ``run_note``."""
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="gate", map_index=-1)
    context = {"ti": ti, "dag_run": SimpleNamespace(note=run_note)}
    log = Log()
    return write_notes(context, run_note="REJECTED: x", task_note="REJECTED: x", log=log), log


def logged(log: Log, caplog) -> str:
    """Everything logged: the task's log, and every Python logger's (httpx's too)."""
    return "\n".join([*log.warnings, *log.infos, caplog.text])


def assert_no_secret(text: str, api: FakeApi) -> None:
    assert PASSWORD not in text
    for token in api.tokens:
        assert token not in text


def test_503s_then_success_the_note_is_set_once_and_the_persons_note_kept(api, no_waiting, caplog):
    caplog.set_level(logging.DEBUG)
    api.faults["token"] = [503]
    api.faults["run"] = [503, 502, 504]
    how, log = write()
    assert how == "api"
    assert api.notes == {"run": "trying lr 3e-4\n\nREJECTED: x", "ti": "REJECTED: x"}
    assert (api.count("token"), api.count("run"), api.count("ti")) == (2, 4, 1)
    assert log.warnings == []
    assert len(no_waiting) == 4  # a retry after each fault, after a backoff
    assert any(f"PATCH {RUN_PATH} answered 502" in line and "retry 2 in" in line for line in log.infos)
    assert_no_secret(logged(log, caplog), api)


def test_a_lost_reply_is_retried_and_the_note_is_not_doubled(api, caplog):
    caplog.set_level(logging.DEBUG)
    api.faults["run"] = ["lost"]  # the server set the note, the reply never came
    api.faults["ti"] = ["lost"]
    how, log = write()
    assert how == "api"
    assert api.requests.count(("run", "lost")) == 1 and api.count("run") == 2
    assert api.count("ti") == 2
    assert api.notes == {"run": "trying lr 3e-4\n\nREJECTED: x", "ti": "REJECTED: x"}
    assert_no_secret(logged(log, caplog), api)


def test_a_reset_connection_and_a_timeout_are_retried(api, monkeypatch):
    from trainops.operators import notes

    monkeypatch.setattr(notes, "REQUEST_TIMEOUT_S", 0.2, raising=False)
    api.faults["token"] = ["reset"]
    api.faults["run"] = ["hang"]
    how, log = write()
    assert how == "api", log.warnings
    assert api.requests[:2] == [("token", "reset"), ("token", "201")]
    assert api.requests[2:4] == [("run", "hung"), ("run", "200")]
    assert api.notes["run"] == "trying lr 3e-4\n\nREJECTED: x"


def test_an_api_server_restarting_is_waited_for(monkeypatch, no_waiting):
    """Connection refused while it restarts, then it answers, on the same port."""
    from trainops.operators import notes

    monkeypatch.setattr(notes, "_via_database", lambda *a: False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connect(monkeypatch, f"http://127.0.0.1:{port}")
    server = FakeApi(run_note="trying lr 3e-4", port=port)

    def wait(seconds: float) -> None:
        no_waiting.append(seconds)
        if len(no_waiting) == 2:  # up again after two refusals
            server.start()

    monkeypatch.setattr(notes, "_sleep", wait, raising=False)
    try:
        how, log = write()
    finally:
        if len(no_waiting) >= 2:
            server.stop()
    assert how == "api", log.warnings
    assert server.requests == [("token", "201"), ("run", "200"), ("ti", "200")]
    assert server.notes["run"] == "trying lr 3e-4\n\nREJECTED: x"


def test_retry_after_is_honoured_and_capped(api, no_waiting):
    from trainops.operators.notes import RETRY_AFTER_CAP_S

    api.faults["run"] = [(429, {"Retry-After": "3"}), (503, {"Retry-After": "600"})]
    how, _ = write()
    assert how == "api"
    assert no_waiting == [3.0, RETRY_AFTER_CAP_S]
    assert api.count("run") == 3


def test_an_api_down_for_longer_than_the_budget_gives_up_with_tries_time_and_the_note(
    api, no_waiting, caplog
):
    from trainops.operators.notes import NOTE_BUDGET_S

    caplog.set_level(logging.DEBUG)
    api.faults["run"] = [503] * 100
    how, log = write()
    assert how is None
    tries = api.count("run")
    assert 4 <= tries <= 12  # backoff, not a hammering
    assert api.notes["run"] == "trying lr 3e-4"  # unchanged, not lost
    (warning,) = log.warnings
    assert warning.startswith(
        "could not set the run note through Airflow's API (connection 'trainops_airflow_api'): "
    )
    assert f"PATCH {RUN_PATH} gave up after {tries} tries over " in warning
    assert "last: answered 503: " in warning and "fault 503" in warning
    assert warning.endswith("The note was:\nREJECTED: x")
    assert sum(no_waiting) <= NOTE_BUDGET_S
    assert_no_secret(logged(log, caplog), api)


@pytest.mark.parametrize(
    ("status", "hint"),
    [
        (400, "malformed"),
        (403, "may not edit DAG runs and task instances"),
        (404, "knows no such DAG run or task instance"),
        (409, "conflict"),
        (422, "malformed"),
        (500, "not retried"),
    ],
)
def test_a_permanent_refusal_is_not_retried_and_says_what_to_do(api, no_waiting, caplog, status, hint):
    caplog.set_level(logging.DEBUG)
    api.faults["run"] = [status]
    how, log = write()
    assert how is None
    assert api.count("run") == 1 and api.count("ti") == 0 and no_waiting == []
    (warning,) = log.warnings
    assert f"PATCH {RUN_PATH} answered {status}: " in warning and f"fault {status}" in warning
    assert hint in warning and warning.endswith("The note was:\nREJECTED: x")
    assert_no_secret(logged(log, caplog), api)


def test_a_wrong_password_is_not_retried_and_never_shown(api, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    connect(monkeypatch, api.url, password="wrong-" + PASSWORD)
    how, log = write()
    assert how is None and api.requests == [("token", "401")]
    (warning,) = log.warnings
    assert (
        "POST /auth/token answered 401" in warning and "check the connection's login and password" in warning
    )
    assert PASSWORD not in logged(log, caplog)


def test_a_reply_that_echoes_the_password_is_cut_before_it_is_logged(api, caplog):
    caplog.set_level(logging.DEBUG)
    api.faults["token"] = ["echo"]  # FastAPI's 422 repeats the body it got
    how, log = write()
    assert how is None and api.count("token") == 1
    (warning,) = log.warnings
    assert "POST /auth/token answered 422: " in warning and '"password": "***"' in warning
    assert_no_secret(logged(log, caplog), api)


def test_a_401_on_a_patch_gets_one_fresh_token(api, caplog):
    caplog.set_level(logging.DEBUG)
    api.faults["run"] = [401]  # e.g. an API server restarted with another signing secret
    how, log = write()
    assert how == "api"
    assert api.requests == [("token", "201"), ("run", "401"), ("token", "201"), ("run", "200"), ("ti", "200")]
    assert_no_secret(logged(log, caplog), api)

    api.requests.clear()
    api.faults["run"] = [401, 401]
    how, log = write()
    assert how is None
    assert [k for k, _ in api.requests] == ["token", "run", "token", "run"]  # one fresh token, no more
    assert "check that every API server has the same [api_auth] jwt_secret" in log.warnings[0]
    assert_no_secret(logged(log, caplog), api)


def test_a_refused_token_from_the_extra_is_final(api, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    connect(monkeypatch, api.url, login=None, password=None, extra={"token": "jwt-given-and-stale"})
    how, log = write()
    assert how is None and api.requests == [("run", "401")]
    (warning,) = log.warnings
    assert "the token in the connection's extra was refused" in warning
    assert "jwt-given-and-stale" not in logged(log, caplog)


def test_a_task_note_refused_after_the_run_note_was_set_says_which(api):
    api.faults["ti"] = [403]
    how, log = write()
    assert how is None
    assert api.notes["run"] == "trying lr 3e-4\n\nREJECTED: x"
    (warning,) = log.warnings
    assert warning.startswith("could not set the task instance's note through Airflow's API")
    assert f"PATCH {TI_PATH} answered 403" in warning


# --------------------------------------------------------------------------- the retry decision
@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 500, 501])
def test_retry_wait_never_retries_a_permanent_status(status):
    from trainops.operators.notes import retry_wait

    assert retry_wait(status, None, retry=1) is None
    assert retry_wait(status, None, retry=1, retry_after="1") is None


def test_retry_wait_backs_off_with_jitter_within_bounds():
    from trainops.operators.notes import FIRST_DELAY_S, MAX_DELAY_S, MIN_TRY_S, retry_wait

    for fault in ("timeout", "connection"):
        assert retry_wait(None, fault, retry=1, draw=0.0) == FIRST_DELAY_S / 2
    for status in (429, 502, 503, 504):
        assert retry_wait(status, None, retry=1, draw=0.999) == pytest.approx(FIRST_DELAY_S, rel=1e-3)
    assert retry_wait(503, None, retry=2, draw=0.0) == FIRST_DELAY_S
    assert retry_wait(503, None, retry=3, draw=0.0) == 2 * FIRST_DELAY_S
    assert retry_wait(503, None, retry=50, draw=0.999, left_s=100) == pytest.approx(MAX_DELAY_S, rel=1e-3)
    # no retry that would leave less than MIN_TRY_S of the budget for the try itself
    assert retry_wait(503, None, retry=1, draw=0.0, left_s=FIRST_DELAY_S / 2 + MIN_TRY_S) is not None
    assert retry_wait(503, None, retry=1, draw=0.0, left_s=MIN_TRY_S) is None
    assert retry_wait(None, "timeout", retry=1, left_s=0.0) is None


def test_retry_wait_honours_retry_after_seconds_capped():
    from trainops.operators.notes import RETRY_AFTER_CAP_S, retry_wait

    assert retry_wait(429, None, retry=1, retry_after="3") == 3.0
    assert retry_wait(503, None, retry=4, retry_after=" 0 ") == 0.0
    assert retry_wait(503, None, retry=1, retry_after="3600") == RETRY_AFTER_CAP_S
    assert retry_wait(503, None, retry=1, retry_after="3", left_s=3.5) is None  # would not fit
    backoff = retry_wait(503, None, retry=1, draw=0.0)
    for nonsense in ("Wed, 21 Oct 2026 07:28:00 GMT", "-1", "soon", ""):
        assert retry_wait(503, None, retry=1, draw=0.0, retry_after=nonsense) == backoff
