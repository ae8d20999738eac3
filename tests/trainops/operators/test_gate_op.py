"""EvaluationGateOperator with plain dicts on real storage."""

from __future__ import annotations

import json

import pytest

from trainer.contract import RunLayout, join
from trainer.storage import open_storage
from trainops.gate import GateConfigError, GateInputError
from trainops.operators.gate import EvaluationGateOperator


def evaluation(run_uri: str, eval_loss: float, production: float | None = None) -> dict:
    return {
        "metrics_uri": join(run_uri, "eval", "metrics.json"),
        "run_uri": run_uri,
        "model_name": "demo-lm",
        "candidate": {"eval_loss": eval_loss, "perplexity": 2.718 ** eval_loss, "tokens": 4096,
                      "slices": {"wiki": {"eval_loss": eval_loss}}},
        "production": None if production is None else {
            "eval_loss": production, "perplexity": 2.718 ** production, "tokens": 4096,
            "slices": {}},
        "production_version": None if production is None else 3,
    }


CHECKS = [
    {"name": "loss under 4.0", "kind": "threshold", "metric": "eval_loss", "op": "<=",
     "value": 4.0},
    {"name": "no regression", "kind": "no_regression", "metric": "eval_loss", "tolerance": 0.01},
]


def run_gate(root: str, evaluation_dict: dict, **kwargs) -> dict:
    op = EvaluationGateOperator(task_id="gate", evaluation=evaluation_dict, checks=CHECKS,
                                storage_root=root, aws_conn_id=None, **kwargs)
    return op.execute({})


@pytest.mark.parametrize("root_fixture", ["file_root", "s3_root"])
def test_approved_gate_writes_its_decision_and_returns_json(request, root_fixture):
    root = request.getfixturevalue(root_fixture)
    run_uri = join(root, "runs", "retrain", "manual_1", "train")
    result = run_gate(root, evaluation(run_uri, 3.0, production=3.0))

    assert json.loads(json.dumps(result, allow_nan=False)) == result
    assert result["approved"] is True
    assert result["gate_uri"] == RunLayout(run_uri).eval_gate
    assert result["production_version"] == 3
    assert (result["model_name"], result["run_uri"]) == ("demo-lm", run_uri)
    assert [c["name"] for c in result["checks"]] == ["loss under 4.0", "no regression"]

    written = open_storage(root).get_json(result["gate_uri"])
    assert written["approved"] is True
    assert written["checks"] == result["checks"]
    assert written["model_name"] == "demo-lm"
    assert written["metrics_uri"] == join(run_uri, "eval", "metrics.json")
    assert written["decided_at"].endswith("+00:00")


def test_rejection_does_not_fail_the_task(file_root):
    run_uri = join(file_root, "runs", "r")
    result = run_gate(file_root, evaluation(run_uri, 3.5, production=3.0))
    assert result["approved"] is False
    failed = [c for c in result["checks"] if not c["passed"]]
    assert [(c["name"], c["observed"], c["expected"]) for c in failed] == [
        ("no regression", 3.5, "<= 3.03")]
    assert open_storage(file_root).get_json(result["gate_uri"])["approved"] is False


def test_default_checks_approve_a_first_model(file_root):
    op = EvaluationGateOperator(task_id="gate", evaluation=evaluation(join(file_root, "r"), 5.0),
                                storage_root=file_root, aws_conn_id=None)
    result = op.execute({})
    assert result["approved"] is True
    assert result["production_version"] is None
    assert result["checks"][1]["note"] == "no production model yet"


def test_broken_checks_fail_when_the_dag_is_parsed():
    with pytest.raises(GateConfigError, match=r"check #0.*'tolerance'.*-1"):
        EvaluationGateOperator(
            task_id="gate", evaluation={},
            checks=[{"kind": "no_regression", "metric": "eval_loss", "tolerance": -1}])


def test_malformed_evaluation_fails_with_the_field_named(file_root):
    bad = evaluation(join(file_root, "r"), 3.0)
    del bad["candidate"]["eval_loss"]
    with pytest.raises(GateInputError, match=r"candidate metric 'eval_loss'"):
        run_gate(file_root, bad)


def test_run_on_other_storage_than_the_root_is_refused(file_root):
    with pytest.raises(ValueError, match=r"s3://elsewhere/run.*storage_root"):
        run_gate(file_root, evaluation("s3://elsewhere/run", 3.0))


def test_evaluation_is_a_templated_field():
    assert "evaluation" in EvaluationGateOperator.template_fields
