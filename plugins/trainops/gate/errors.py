"""The gate's errors: a bad check definition, and a malformed evaluation handed to the gate."""

from __future__ import annotations

__all__ = ["GateConfigError", "GateInputError"]


class GateConfigError(ValueError):
    """A check definition is invalid; raised at DAG parse."""


class GateInputError(ValueError):
    """The evaluation result handed to the gate is not well formed."""
