"""Numbers in check definitions: how a numeric field is read, and how a number is shown.

A numeric field (``value``, ``tolerance``, a slice expectation's ``min_value`` and
``max_value``) may be a Jinja template such as ``"{{ params.max_eval_loss }}"`` when the
operator renders the checks. :func:`number_rule` says how it is read in each of the
:data:`TEMPLATE_MODES`: None (numbers only), ``"allow"`` (keep templates, at DAG parse) or
``"rendered"`` (read rendered text as a number, when the task runs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeGuard

from trainops.gate.errors import GateConfigError

__all__ = ["TEMPLATE_MODES", "NumberRule", "fmt", "is_number", "number_rule", "show"]

TEMPLATE_MODES = (None, "allow", "rendered")

# (where, field, value) -> the field as a float, or the template kept as it is.
NumberRule = Callable[[str, str, object], float | str]


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, but not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def show(value: object) -> str:
    """A field's value in a check's default name or expected text."""
    return fmt(value) if is_number(value) else str(value)


def _is_template(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def number_rule(templates: str | None) -> NumberRule:
    """How a numeric field is read: a finite number, plus templates per ``templates``."""

    def number(where: str, field: str, value: object) -> float | str:
        if templates == "allow" and _is_template(value):
            return str(value)
        if templates == "rendered" and isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise GateConfigError(
                    f"{where} field {field!r} rendered to {value!r}, which is not a number; "
                    "fix the template or the param it reads"
                ) from None
        if not is_number(value) or not math.isfinite(value):
            raise GateConfigError(f"{where} needs a finite number in field {field!r}, got {value!r}")
        return float(value)

    return number
