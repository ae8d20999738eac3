"""The trainops operators. Each returns a JSON-serializable dict in XCom (see docs/operators.md)."""

from trainops.operators.evaluate import EvaluateModelOperator
from trainops.operators.evaluate_checkpoints import EvaluateCheckpointsOperator
from trainops.operators.gate import EvaluationGateOperator
from trainops.operators.promote import PromoteModelOperator
from trainops.operators.rollback import RollbackModelOperator
from trainops.operators.stage import StageDatasetOperator
from trainops.operators.train import FSDPTrainingOperator

__all__ = [
    "EvaluateCheckpointsOperator",
    "EvaluateModelOperator",
    "EvaluationGateOperator",
    "FSDPTrainingOperator",
    "PromoteModelOperator",
    "RollbackModelOperator",
    "StageDatasetOperator",
]
