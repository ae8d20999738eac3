"""Fail fast on what a retry cannot fix.

A misspelt setting, an invalid trainer config, a broken gate definition or data that failed
its expectations fail the same way on every try: Airflow's retries only delay the red task
and repeat the error. :func:`unretryable` is the one classification (pure, over the exception
and its causes); :func:`fail_fast` applies it at an operator's or a task's edge, turning such
an error into ``AirflowFailException`` (failed at once, no retry) with the original message.
Everything else (storage and network outages, a source not written yet, a lost cluster API)
keeps Airflow's retries.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException, ParamValidationError

from trainer.config import ConfigError
from trainops.cluster.spec import JobSpecError
from trainops.gate.errors import GateConfigError, GateInputError
from trainops.operators import notes  # write_notes looked up at each call: tests replace it
from trainops.operators.params import ParameterError
from trainops.recovery.record import RunFolderTaken
from trainops.runs.dag_runs import failure_note
from trainops.settings import SettingsError
from trainops.staging.errors import StagingError

__all__ = ["UNRETRYABLE", "fail_fast", "unretryable"]

# Errors in what the user gave (trainer config, operator parameters, DAG params, settings, check
# definitions, job specs, data that failed validation, a run folder another run owns): the same
# input fails the same way again.
UNRETRYABLE: tuple[type[BaseException], ...] = (
    ConfigError,
    SettingsError,
    ParamValidationError,
    ParameterError,
    GateConfigError,
    GateInputError,
    JobSpecError,
    StagingError,
    RunFolderTaken,
)

F = TypeVar("F", bound=Callable[..., Any])


def unretryable(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is one a retry cannot fix."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, UNRETRYABLE):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def _context(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The task's context: an operator's ``execute(self, context)`` gets it (Airflow passes it by
    keyword); a ``@task`` function asks Airflow for the running task's."""
    given = args[1] if len(args) > 1 else kwargs.get("context")
    if isinstance(given, Mapping) and given.get("ti") is not None:
        return given
    try:
        current = get_current_context()
    except Exception:  # not inside a running task (a unit test calling the function)
        return None
    return current if current.get("ti") is not None else None


def _leave_note(args: tuple[Any, ...], kwargs: Mapping[str, Any], exc: BaseException) -> None:
    """Say on the DAG run (and the task) what failed, ``FAILED at <task>: <reason>``, so the
    run's note, the home page and ``python -m trainops runs`` name it. Never raises (a note is
    never worth a second failure)."""
    context = _context(args, kwargs)
    if context is None:
        return
    log = getattr(args[0], "log", None) if args else None
    try:
        note = failure_note(str(context["ti"].task_id), str(exc))
        notes.write_notes(context, run_note=note, task_note=note, log=log or logging.getLogger(__name__))
    except Exception:  # the task's own failure is the one to report
        logging.getLogger(__name__).warning("could not leave the failure note", exc_info=True)


def fail_fast(func: F) -> F:
    """Decorate an operator's ``execute`` (``execute_complete``) or a ``@task`` function: an
    error :func:`unretryable` classifies fails the task at once, whatever its ``retries``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AirflowFailException as exc:
            if exc.__cause__ is not None and unretryable(exc.__cause__):
                _leave_note(args, kwargs, exc)  # the operator chose the message: the input's fault
            raise
        except Exception as exc:
            if not unretryable(exc):
                raise
            _leave_note(args, kwargs, exc)
            raise AirflowFailException(
                f"{exc} [{type(exc).__name__}: not retried, every try would fail the same way; "
                "fix the input and run again]"
            ) from exc

    return cast("F", wrapper)
