"""Notes from a task: a person's note is kept, and a worker with no way to write says how."""

from types import SimpleNamespace

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
