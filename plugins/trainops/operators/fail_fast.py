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
from collections.abc import Callable
from typing import Any, TypeVar, cast

from airflow.sdk.exceptions import AirflowFailException, ParamValidationError

from trainer.config import ConfigError
from trainops.cluster.spec import JobSpecError
from trainops.gate.errors import GateConfigError, GateInputError
from trainops.operators.params import ParameterError
from trainops.recovery.record import RunFolderTaken
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


def fail_fast(func: F) -> F:
    """Decorate an operator's ``execute`` (``execute_complete``) or a ``@task`` function: an
    error :func:`unretryable` classifies fails the task at once, whatever its ``retries``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AirflowFailException:
            raise
        except Exception as exc:
            if not unretryable(exc):
                raise
            raise AirflowFailException(
                f"{exc} [{type(exc).__name__}: not retried, every try would fail the same way; "
                "fix the input and run again]"
            ) from exc

    return cast("F", wrapper)
