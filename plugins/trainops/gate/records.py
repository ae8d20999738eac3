"""The gate's records: check definitions, the outcome of one check, and the decision.

A check definition stays a plain dict (it comes from DAG code, YAML or a DAG param, and is
stored in ``gate.json`` as it was validated); outcomes and the decision have fixed keys.
"""

# No postponed annotations here: TypedDict tells required from NotRequired keys at run time
# only from evaluated annotations (``__required_keys__``).
from typing import Any, NotRequired, TypedDict

__all__ = ["Check", "CheckResult", "Decision", "FailingSlice", "Outcome"]

# A check definition: ``kind``, ``name`` and the kind's fields (see trainops.gate.checks).
Check = dict[str, Any]


class FailingSlice(TypedDict):
    slice_column: str
    slice: str
    value: float | None  # the checked column's value on the slice (None: null)


class Outcome(TypedDict):
    """What one check found."""

    observed: float | None  # the candidate's value; None when missing or not finite
    expected: str | None  # the condition it had to meet, as text
    passed: bool
    note: str
    slices: NotRequired[list[FailingSlice]]  # slice checks: the failing slices
    # no_regression with confidence: the bootstrap interval of candidate - production
    interval: NotRequired[list[float]]
    confidence: NotRequired[float]


class CheckResult(Outcome):
    name: str
    kind: str
    metric: str  # "slices" for slice checks


class Decision(TypedDict):
    approved: bool  # every check passed
    checks: list[CheckResult]
    production_version: int | None  # what the candidate was compared with
