"""The gate's records describe what the gate returns and stores, key for key.

TypedDicts are not checked at run time, so this holds the declared records to the real
decisions (which ``gate.json``, the XCom result and the promotion's re-gates carry).
"""

from __future__ import annotations

import json
import math

from trainops.gate.checks import decide
from trainops.gate.records import CheckResult, Decision, FailingSlice


def metrics(loss: float, slices: dict[str, float]) -> dict:
    return {
        "eval_loss": loss,
        "perplexity": math.exp(loss),
        "tokens": 1000,
        "slices": {
            "source": {
                k: {"eval_loss": v, "perplexity": math.exp(v), "tokens": 100} for k, v in slices.items()
            }
        },
    }


CHECKS = [
    {"kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 3.0},
    {"kind": "no_regression", "metric": "eval_loss", "tolerance": 0.0},
    {"kind": "slice_no_regression", "tolerance": 0.05},
]


def test_a_decision_has_exactly_the_declared_keys_and_is_json():
    decision = decide(
        CHECKS, metrics(2.9, {"wiki": 2.5, "web": 3.4}), metrics(2.8, {"wiki": 2.5, "web": 3.0}), 4
    )
    assert set(decision) == set(Decision.__annotations__)
    assert (decision["approved"], decision["production_version"]) == (False, 4)
    required = CheckResult.__required_keys__
    for result in decision["checks"]:
        assert required <= set(result) <= required | CheckResult.__optional_keys__
    threshold, no_regression, slices = decision["checks"]
    assert "slices" not in threshold and "slices" not in no_regression
    assert [set(s) for s in slices["slices"]] == [set(FailingSlice.__annotations__)]
    assert slices["slices"][0]["slice"] == "web"
    assert json.loads(json.dumps(decision)) == decision
