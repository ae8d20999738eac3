"""Which errors fail a task at once, and the decorator that applies it at a task's edge."""

import pytest
from airflow.sdk.exceptions import AirflowFailException, ParamValidationError

from trainer.config import ConfigError, load_config
from trainops.gate.checks import validate_checks
from trainops.operators.fail_fast import fail_fast, unretryable
from trainops.operators.params import as_int, dataset_uri
from trainops.recipes.form import SettingsError, check_settings
from trainops.staging.errors import DataValidationError, SourceNotFound, SourceUnreachable


def raised_by(call) -> BaseException:
    with pytest.raises(BaseException) as caught:
        call()
    return caught.value


def test_what_the_user_gave_is_unretryable():
    assert unretryable(raised_by(lambda: check_settings({"max_step": 3}, source="conf")))
    assert unretryable(raised_by(lambda: load_config(None, ["train.lrr=1"])))
    assert unretryable(raised_by(lambda: validate_checks([{"kind": "thresold"}])))
    assert unretryable(ParamValidationError("nodes: 0 is less than the minimum of 1"))
    assert unretryable(DataValidationError("2 expectations failed", summary={}))
    assert unretryable(raised_by(lambda: as_int("nodes", "lots", minimum=1)))
    assert unretryable(raised_by(lambda: dataset_uri("data/demo/v1")))


def test_outages_and_program_errors_keep_their_retries():
    assert not unretryable(SourceNotFound("file:///raw/tickets is empty"))
    assert not unretryable(SourceUnreachable("s3 endpoint down"))
    assert not unretryable(ConnectionResetError("reset by peer"))
    assert not unretryable(RuntimeError("trainer exited 1"))
    assert not unretryable(ValueError("a plain ValueError is not known to be the user's"))


def test_an_error_raised_from_an_unretryable_one_is_unretryable():
    def wrap():
        try:
            raise ConfigError("unknown key 'train.lrr'")
        except ConfigError as exc:
            raise ValueError("trainer_config is invalid") from exc

    assert unretryable(raised_by(wrap))


def test_fail_fast_turns_a_misspelt_setting_into_a_failure_without_retry_with_the_hint():
    @fail_fast
    def plan(conf):
        return check_settings(conf, source="retrain_manual conf")

    with pytest.raises(AirflowFailException) as caught:
        plan({"max_step": 3})
    message = str(caught.value)
    assert "unknown setting(s) 'max_step' (did you mean 'max_steps'?)" in message
    assert "SettingsError: not retried" in message
    assert isinstance(caught.value.__cause__, SettingsError)
    assert plan({"max_steps": 3})["max_steps"] == 3  # a good input passes through untouched


def test_fail_fast_leaves_retryable_errors_and_skips_alone():
    from airflow.sdk.exceptions import AirflowSkipException

    @fail_fast
    def flaky():
        raise SourceUnreachable("s3 endpoint down")

    @fail_fast
    def skip():
        raise AirflowSkipException("nothing to do")

    with pytest.raises(SourceUnreachable):
        flaky()
    with pytest.raises(AirflowSkipException):
        skip()


def test_fail_fast_keeps_the_signature_airflow_reads_for_context_arguments():
    import inspect

    @fail_fast
    def plan(params=None, dag_run=None) -> dict:
        return {}

    assert list(inspect.signature(plan).parameters) == ["params", "dag_run"]


def test_an_operators_input_failure_leaves_a_note_naming_the_task_and_the_reason(monkeypatch):
    """The run's note (and so the home page and `python -m trainops runs`) says what failed."""
    from types import SimpleNamespace

    from trainops.operators import notes

    written = []
    monkeypatch.setattr(notes, "write_notes", lambda context, **kw: written.append(kw))

    class Op:
        log = SimpleNamespace(warning=lambda *a, **k: None)

        @fail_fast
        def execute(self, context):
            check_settings({"max_step": 3}, source="conf")

    with pytest.raises(AirflowFailException):
        Op().execute({"ti": SimpleNamespace(task_id="train")})
    (note,) = written
    assert note["run_note"].startswith("FAILED at train: ") and "max_step" in note["run_note"]
    assert note["task_note"] == note["run_note"]
    # a retryable error leaves no note: the task is not done failing
    written.clear()

    class Flaky(Op):
        @fail_fast
        def execute(self, context):
            raise ConnectionResetError("reset")

    with pytest.raises(ConnectionResetError):
        Flaky().execute({"ti": SimpleNamespace(task_id="train")})
    assert written == []


def test_a_failure_the_operator_worded_itself_leaves_the_note_when_the_input_caused_it(monkeypatch):
    """stage.py raises AirflowFailException from the DataValidationError: the run's note says so."""
    from types import SimpleNamespace

    from trainops.operators import notes

    written = []
    monkeypatch.setattr(notes, "write_notes", lambda context, **kw: written.append(kw))

    class Stage:
        log = SimpleNamespace(warning=lambda *a, **k: None)

        @fail_fast
        def execute(self, context):
            try:
                raise DataValidationError("2 expectations failed", summary={})
            except DataValidationError as exc:
                raise AirflowFailException(str(exc)) from exc

    with pytest.raises(AirflowFailException):
        Stage().execute(context={"ti": SimpleNamespace(task_id="stage")})
    assert [w["run_note"] for w in written] == ["FAILED at stage: 2 expectations failed"]
