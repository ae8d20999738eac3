"""Notes from a task: a person's note is kept, and a worker with no way to write says how."""

from types import SimpleNamespace

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


class Log:
    def __init__(self):
        self.warnings = []

    def warning(self, message, *args):
        self.warnings.append(message % args)


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


def test_an_api_that_refuses_is_a_warning_never_a_failure_and_shows_no_credentials(monkeypatch):
    import json

    from trainops.operators import notes

    monkeypatch.setattr(notes, "_via_database", lambda *a: False)
    conn = {"conn_type": "http", "host": "http://127.0.0.1:9", "login": "ada", "password": "s3cret-pw"}
    monkeypatch.setenv("AIRFLOW_CONN_TRAINOPS_AIRFLOW_API", json.dumps(conn))
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="gate", map_index=-1)
    log = Log()
    assert write_notes({"ti": ti}, run_note="REJECTED: x", task_note="x", log=log) is None
    (warning,) = log.warnings
    assert "could not set the run note through Airflow's API (connection 'trainops_airflow_api')" in warning
    assert "s3cret-pw" not in warning


def test_no_task_instance_no_note():
    assert write_notes({}, run_note="x", task_note=None, log=Log()) is None


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
