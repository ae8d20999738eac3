"""Checks of the operators' plain parameter values: pure and import-free, cheap enough for every
DAG parse. Each error names the parameter and the value and says what to pass instead.

A templated parameter holds a Jinja string or an XComArg until the task runs
(:func:`known_at_run_time`); the operator checks it with the same function once it is rendered.
A bad value raises :class:`ParameterError`, which a retry cannot fix (see
:mod:`trainops.operators.fail_fast`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainer.contract import check_name


class ParameterError(ValueError):
    """An operator parameter's value is invalid; the message names it and what to pass."""


def known_at_run_time(value: object) -> bool:
    """A Jinja template or an XComArg, or a dict or list holding one: its value exists only
    once the task runs."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if callable(getattr(value, "resolve", None)):
        return True
    if isinstance(value, Mapping):
        return any(known_at_run_time(k) or known_at_run_time(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(known_at_run_time(v) for v in value)
    return False


def name_param(parameter: str, value: object) -> str:
    """A model or dataset name (:func:`trainer.contract.check_name`, the one check of names);
    :class:`ParameterError` naming ``parameter``, the value and what to do otherwise."""
    try:
        return check_name(value, parameter)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None


def as_int(name: str, value: object, *, minimum: int, text: bool = False) -> int:
    """``value`` as an int >= ``minimum``; ValueError naming ``name`` otherwise.

    :param text: accept digits as text too (``"2"``): what a rendered template gives.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        raise ParameterError(
            f"{name} must be an integer >= {minimum}, got the text {value!r}; write {value.strip()} without quotes"
        )
    else:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def optional_int(name: str, value: object, *, minimum: int) -> int | None:
    """None, or ``value`` as an int >= ``minimum`` (:func:`as_int`)."""
    return None if value is None else as_int(name, value, minimum=minimum)


def seconds(name: str, value: object, *, default: float | None) -> float:
    """``value`` as a positive, finite number of seconds; ValueError naming ``name`` otherwise.
    A poll interval of 0 or less polls without pause (-1 made 14,797 status calls in 3.3 s).

    :param default: the parameter's default, named in the error as an example.
    """
    example = f"such as {default:g} (the default)" if default is not None else "such as 3600"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(
            f"{name} must be a positive number of seconds, got {value!r}; pass a number {example}"
        )
    if not math.isfinite(value) or value <= 0:
        raise ParameterError(
            f"{name} must be a positive number of seconds, got {value!r}; pass a number {example}"
        )
    return float(value)


def optional_seconds(name: str, value: object, *, default: float | None) -> float | None:
    """None (no limit), or :func:`seconds`."""
    return None if value is None else seconds(name, value, default=default)


def dataset_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot name a dataset version in storage, or None (its syntax only: whether
    anything is there is for the operator to read when the task runs)."""
    shape = "file:///abs/path/datasets/<name>/<version> or s3://<bucket>/<prefix>/datasets/<name>/<version>"
    if uri.startswith("s3://"):
        if not uri[len("s3://") :].split("/", 1)[0]:
            return f"dataset URI {uri!r} names no bucket: use {shape}"
        return None
    if uri.startswith("file://"):
        path = uri[len("file://") :]
        if not path.removeprefix("localhost").startswith("/"):
            return f"dataset URI {uri!r} is not an absolute path: use {shape}"
        return None
    return f"dataset URI {uri!r} is not a file:// or s3:// URI: use {shape}"


def dataset_uri(dataset: object) -> str:
    """The dataset version URI of a ``dataset`` parameter (a StageDatasetOperator result or a
    URI); ParameterError naming the value otherwise."""
    uri = dataset.get("uri") if isinstance(dataset, Mapping) else dataset
    if not isinstance(uri, str) or not uri.strip():
        raise ParameterError(
            f"dataset must be a StageDatasetOperator result or a dataset version URI, got {dataset!r}"
        )
    problem = dataset_uri_problem(uri)
    if problem:
        raise ParameterError(f"{problem}, or pass the StageDatasetOperator result (stage.output)")
    return uri
