"""A user's function named in a config value: ``package.module:function``.

Two keys take one: ``model.builder`` (the model to train, ``trainer.models.builder``) and each
entry of ``eval.metrics`` (a team's own scorer, ``trainer.evaluate.user``). The form is judged
here, torch-free, where the config is validated (and by the operators before launch); the
import is for the process that calls it: the module lives in the trainer image or on its
``PYTHONPATH``, not in the Airflow worker.
"""

from __future__ import annotations

import importlib
import keyword
from collections.abc import Callable
from typing import Any

from trainer.config.errors import ConfigError


def function_parts(key: str, value: object, example: str) -> tuple[str, str]:
    """``(module, function)`` of ``value`` (``package.module:function``, every part a Python
    identifier); a ConfigError naming ``key``, the value and an ``example`` otherwise. Pure:
    whether the module imports is for :func:`import_function` to find out."""
    if isinstance(value, str) and value.count(":") == 1:
        module, function = value.split(":")
        if all(
            part.isidentifier() and not keyword.iskeyword(part) for part in [*module.split("."), function]
        ):
            return module, function
    raise ConfigError(
        f"{key}: expected 'module:function', got {value!r}; name an importable module "
        f"and a function in it, e.g. {example!r}"
    )


def import_function(key: str, value: str, example: str) -> Callable[..., Any]:
    """The function ``value`` names; errors name ``key``, the value and what to fix."""
    module_name, function_name = function_parts(key, value, example)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ImportError(
            f"{key} {value!r}: cannot import {module_name!r} ({type(exc).__name__}: "
            f"{exc}); put its folder on PYTHONPATH or install it in the trainer image"
        ) from exc
    function: Callable[..., Any] | None = getattr(module, function_name, None)
    if not callable(function):
        raise AttributeError(f"{key} {value!r}: module {module_name!r} has no function {function_name!r}")
    return function
