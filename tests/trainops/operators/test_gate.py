"""EvaluationGateOperator with plain dicts on real storage."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import AirflowFailException

from trainer.contract import RunLayout, join
from trainer.storage import StorageUnavailable, open_storage
from trainops.gate.checks import GateConfigError, GateInputError
from trainops.operators.gate import EvaluationGateOperator


def evaluation(run_uri: str, eval_loss: float, production: float | None = None) -> dict:
    return {
        "metrics_uri": join(run_uri, "eval", "metrics.json"),
        "run_uri": run_uri,
        "model_name": "demo-lm",
        "candidate": {
            "eval_loss": eval_loss,
            "perplexity": 2.718**eval_loss,
            "tokens": 4096,
            "slices": {"wiki": {"eval_loss": eval_loss}},
        },
        "production": None
        if production is None
        else {"eval_loss": production, "perplexity": 2.718**production, "tokens": 4096, "slices": {}},
        "production_version": None if production is None else 3,
    }


CHECKS = [
    {"name": "loss under 4.0", "kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 4.0},
    {"name": "no regression", "kind": "no_regression", "metric": "eval_loss", "tolerance": 0.01},
]


def run_gate(root: str, evaluation_dict: dict, **kwargs) -> dict:
    op = EvaluationGateOperator(
        task_id="gate",
        evaluation=evaluation_dict,
        checks=CHECKS,
        storage_root=root,
        aws_conn_id=None,
        **kwargs,
    )
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
    assert [(c["name"], c["observed"], c["expected"]) for c in failed] == [("no regression", 3.5, "<= 3.03")]
    assert open_storage(file_root).get_json(result["gate_uri"])["approved"] is False


def test_default_checks_approve_a_first_model(file_root):
    op = EvaluationGateOperator(
        task_id="gate",
        evaluation=evaluation(join(file_root, "r"), 5.0),
        storage_root=file_root,
        aws_conn_id=None,
    )
    result = op.execute({})
    assert result["approved"] is True
    assert result["production_version"] is None
    assert result["checks"][1]["note"] == "no production model yet"


def test_broken_checks_fail_when_the_dag_is_parsed():
    with pytest.raises(GateConfigError, match=r"check #0.*'tolerance'.*-1"):
        EvaluationGateOperator(
            task_id="gate",
            evaluation={},
            checks=[{"kind": "no_regression", "metric": "eval_loss", "tolerance": -1}],
        )


def test_malformed_evaluation_fails_with_the_field_named(file_root):
    bad = evaluation(join(file_root, "r"), 3.0)
    del bad["candidate"]["eval_loss"]
    # A malformed input fails the same way on every try: the task fails at once, no retry.
    with pytest.raises(AirflowFailException, match=r"candidate metric 'eval_loss'") as err:
        run_gate(file_root, bad)
    assert isinstance(err.value.__cause__, GateInputError)


def test_run_on_other_storage_than_the_root_is_refused(file_root):
    with pytest.raises(ValueError, match=r"s3://elsewhere/run.*storage_root"):
        run_gate(file_root, evaluation("s3://elsewhere/run", 3.0))


def test_evaluation_is_a_templated_field():
    assert "evaluation" in EvaluationGateOperator.template_fields


class FakeTI:
    dag_id, run_id, task_id, map_index = "d", "r", "gate", -1

    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def test_gate_report_uri_is_pushed_for_the_extra_link(file_root):
    ti = FakeTI()
    run_uri = join(file_root, "runs", "r")
    op = EvaluationGateOperator(
        task_id="gate",
        evaluation=evaluation(run_uri, 3.0),
        checks=CHECKS,
        storage_root=file_root,
        aws_conn_id=None,
    )
    result = op.execute({"ti": ti})
    assert ti.pushed == {"trainops_gate_report": result["gate_uri"]}
    # The validated definitions travel on, so a promotion can re-gate with them.
    assert [c["name"] for c in result["check_definitions"]] == ["loss under 4.0", "no regression"]
    assert (
        open_storage(file_root).get_json(result["gate_uri"])["check_definitions"]
        == result["check_definitions"]
    )


def test_on_reject_is_called_with_the_decision_only_on_rejection(file_root):
    calls = []
    run_uri = join(file_root, "runs", "r")
    run_gate(file_root, evaluation(run_uri, 3.0, production=3.0), on_reject=calls.append)
    assert calls == []
    result = run_gate(file_root, evaluation(run_uri, 3.5, production=3.0), on_reject=calls.append)
    assert calls == [result]
    assert calls[0]["approved"] is False and calls[0]["gate_uri"].endswith("eval/gate.json")


def test_a_failing_on_reject_callback_does_not_change_the_decision(file_root, capsys):
    def broken(decision):
        raise RuntimeError("chat is down")

    result = run_gate(file_root, evaluation(join(file_root, "r"), 3.5, production=3.0), on_reject=broken)
    assert result["approved"] is False
    out = capsys.readouterr().out
    assert "on_reject callback" in out and "chat is down" in out


def test_on_reject_must_be_callable():
    with pytest.raises(TypeError, match=r"on_reject must be a callable.*'email me'"):
        EvaluationGateOperator(task_id="gate", evaluation={}, on_reject="email me")


def test_templated_threshold_is_rendered_from_a_param_and_checked_again(file_root):
    checks = [
        {
            "name": "loss cap",
            "kind": "threshold",
            "metric": "eval_loss",
            "op": "<=",
            "value": "{{ params.max_eval_loss }}",
        }
    ]
    op = EvaluationGateOperator(
        task_id="gate",
        evaluation=evaluation(join(file_root, "r"), 3.0),
        checks=checks,
        storage_root=file_root,
        aws_conn_id=None,
    )
    assert "checks" in EvaluationGateOperator.template_fields
    op.render_template_fields({"params": {"max_eval_loss": 0.5}})
    result = op.execute({})
    assert result["approved"] is False
    assert result["checks"][0]["expected"] == "<= 0.5"

    bad = EvaluationGateOperator(
        task_id="gate",
        evaluation=evaluation(join(file_root, "r"), 3.0),
        checks=checks,
        storage_root=file_root,
        aws_conn_id=None,
    )
    bad.render_template_fields({"params": {"max_eval_loss": "lots"}})
    with pytest.raises(AirflowFailException, match=r"'loss cap'.*rendered to 'lots'.*not retried") as err:
        bad.execute({})
    assert isinstance(err.value.__cause__, GateConfigError)


def test_checks_from_an_upstream_task_are_checked_once_resolved(file_root):
    """The retraining DAGs hand the gate their plan's checks (an XCom, for the run's task): not
    known when the DAG is parsed, so checked when the task runs, before anything is decided."""
    from airflow.sdk import DAG, task

    with DAG("xcom_checks", schedule=None):

        @task
        def plan() -> list:
            return CHECKS

        op = EvaluationGateOperator(
            task_id="gate",
            evaluation=evaluation(join(file_root, "r"), 3.0),
            checks=plan(),
            storage_root=file_root,
            aws_conn_id=None,
        )
    assert op.upstream_task_ids == {"plan"}
    op.checks = CHECKS  # what Airflow resolves the XCom to
    assert op.execute({})["approved"] is True
    op.checks = [{"kind": "threshold", "metric": "acc", "op": ">=", "value": 0.9}]
    with pytest.raises(AirflowFailException, match=r"unknown metric 'acc'; the known metrics are"):
        op.execute({})


SLICE_CHECKS = [
    {
        "name": "every slice under 3.2",
        "kind": "slices",
        "expectation": {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "eval_loss", "max_value": 3.2},
        },
    },
    {"name": "no slice 2% worse", "kind": "slice_no_regression", "tolerance": 0.02},
]


def with_slices(ev: dict, candidate: dict, production: dict) -> dict:
    def side(losses):
        return {
            "source": {k: {"eval_loss": v, "perplexity": 2.718**v, "tokens": 100} for k, v in losses.items()}
        }

    ev["candidate"]["slices"] = side(candidate)
    ev["production"]["slices"] = side(production)
    return ev


def test_slice_checks_reject_and_gate_json_holds_the_table_and_failing_slices(file_root):
    ev = with_slices(
        evaluation(join(file_root, "runs", "r"), 3.0, production=3.0),
        {"wiki": 2.6, "web": 3.3},
        {"wiki": 2.5, "web": 3.4},
    )
    op = EvaluationGateOperator(
        task_id="gate", evaluation=ev, checks=SLICE_CHECKS, storage_root=file_root, aws_conn_id=None
    )
    result = op.execute({})
    assert result["approved"] is False
    under, regress = result["checks"]
    assert under["slices"] == [{"slice_column": "source", "slice": "web", "value": 3.3}]
    assert regress["slices"] == [{"slice_column": "source", "slice": "wiki", "value": 1.04}]
    written = open_storage(file_root).get_json(result["gate_uri"])
    assert [(r["slice"], r["eval_loss"], r["production_eval_loss"]) for r in written["slice_table"]] == [
        ("web", 3.3, 3.4),
        ("wiki", 2.6, 2.5),
    ]


def test_a_slice_expectation_gx_refuses_fails_before_anything_is_written(file_root):
    checks = [
        {
            "name": "odd bound",
            "kind": "slices",
            "expectation": {
                "type": "expect_column_values_to_be_between",
                "kwargs": {"column": "eval_loss", "max_value": 3, "strict_max": "maybe"},
            },
        }
    ]
    ev = evaluation(join(file_root, "runs", "r"), 3.0)
    op = EvaluationGateOperator(
        task_id="gate", evaluation=ev, checks=checks, storage_root=file_root, aws_conn_id=None
    )
    with pytest.raises(AirflowFailException, match=r"'odd bound': GX refuses") as err:
        op.execute({})
    assert isinstance(err.value.__cause__, GateConfigError)
    assert not open_storage(file_root).exists(RunLayout(ev["run_uri"]).eval_gate)


def _paired_gate(root: str, run_uri: str, records: dict | None) -> dict:
    """A confidence gate on an evaluation whose per-record figures are ``records`` (None: absent)."""
    evaluated = evaluation(run_uri, 3.1, production=3.0)
    evaluated["candidate"]["model_uri"], evaluated["production"]["model_uri"] = "file:///c", "file:///p"
    evaluated["records_uri"] = join(run_uri, "eval", "metrics.records.json")
    if records is not None:
        open_storage(root).put_json(evaluated["records_uri"], records)
    check = {
        "name": "paired",
        "kind": "no_regression",
        "metric": "eval_loss",
        "tolerance": 0.01,
        "confidence": 0.9,
    }
    op = EvaluationGateOperator(
        task_id="gate", evaluation=evaluated, checks=[check], storage_root=root, aws_conn_id=None
    )
    return op.execute({})["checks"][0]


def test_a_confidence_gate_pairs_the_records_of_the_models_it_compares_or_says_why_not(file_root):
    run_uri = join(file_root, "runs", "r")
    table = {"loss_sum": [3.0, 3.2, 3.1, 3.0], "loss_tokens": [1.0, 1.0, 1.0, 1.0]}
    theirs = {"loss_sum": [3.0, 3.0, 3.0, 3.0], "loss_tokens": [1.0, 1.0, 1.0, 1.0]}
    records = {
        "candidate_uri": "file:///c",
        "baseline_uri": "file:///p",
        "candidate": table,
        "baseline": theirs,
    }
    paired = _paired_gate(file_root, run_uri, records)
    assert paired["confidence"] == 0.9 and "paired bootstrap over 4 records" in paired["note"]
    # a missing file, or the figures of other models (an evaluation run again): the totals
    # decide, and the note says why; the gate never fails on it
    missing = _paired_gate(file_root, join(file_root, "runs", "gone"), None)
    assert (
        "interval" not in missing
        and "compared the totals, without the 90% interval: could not read" in missing["note"]
    )
    other = _paired_gate(file_root, run_uri, {**records, "baseline_uri": "file:///older"})
    assert "holds the figures of file:///older, not of the production file:///p" in other["note"]
    assert (missing["passed"], other["passed"]) == (False, False)  # 3.1 > 3.0 * 1.01 as totals


def test_a_storage_outage_fails_a_confidence_gate_rather_than_deciding_on_the_totals(
    faulty_s3_root, s3_faults, monkeypatch
):
    monkeypatch.setenv("AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE", "1")
    run_uri = join(faulty_s3_root, "runs", "r")
    table = {"loss_sum": [3.0, 3.2], "loss_tokens": [1.0, 1.0]}
    records = {
        "candidate_uri": "file:///c",
        "baseline_uri": "file:///p",
        "candidate": table,
        "baseline": table,
    }
    s3_faults.inject(refuse=1.0, ops={"GET"})  # 503 SlowDown on every read, longer than the tolerance
    try:
        with pytest.raises(StorageUnavailable):
            _paired_gate(faulty_s3_root, run_uri, records)
    finally:
        s3_faults.clear()
    assert "paired bootstrap over 2 records" in _paired_gate(faulty_s3_root, run_uri, records)["note"]
