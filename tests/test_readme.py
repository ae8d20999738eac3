"""The README's promises that can drift: its operator parameter table stays complete."""

import inspect
import re
from pathlib import Path

import pytest

from trainops.operators import (
    EvaluateModelOperator,
    EvaluationGateOperator,
    FSDPTrainingOperator,
    PromoteModelOperator,
    StageDatasetOperator,
)
from trainops.operators.rollback import RollbackModelOperator

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
OPERATORS = (
    StageDatasetOperator,
    FSDPTrainingOperator,
    EvaluateModelOperator,
    EvaluationGateOperator,
    PromoteModelOperator,
    RollbackModelOperator,
)


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda c: c.__name__)
def test_every_operator_parameter_is_in_the_readme_table(operator):
    documented = set(re.findall(rf"^\| {operator.__name__} \| `(\w+)` \|", README, re.M))
    parameters = {n for n in inspect.signature(operator.__init__).parameters if n not in ("self", "kwargs")}
    assert parameters - documented == set(), "missing from the README's parameter table"
    assert documented - parameters == set(), "in the README but not a parameter any more"
