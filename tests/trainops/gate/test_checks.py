"""The gate's pure decisions and its configuration errors."""

from __future__ import annotations

import json
import math

import pytest

from trainops.gate.checks import (
    DEFAULT_CHECKS,
    GateConfigError,
    GateInputError,
    check_evaluation,
    decide,
    format_table,
    validate_checks,
)

LOSS_UNDER_4 = {
    "name": "loss under 4.0",
    "kind": "threshold",
    "metric": "eval_loss",
    "op": "<=",
    "value": 4.0,
}
NO_REGRESSION_1PCT = {
    "name": "no regression",
    "kind": "no_regression",
    "metric": "eval_loss",
    "tolerance": 0.01,
    "direction": "lower_is_better",
}


def metrics(eval_loss: float, perplexity: float | None = None) -> dict:
    return {
        "eval_loss": eval_loss,
        "perplexity": math.exp(eval_loss) if perplexity is None else perplexity,
        "tokens": 1000,
        "slices": {},
    }


def by_name(decision: dict) -> dict:
    return {c["name"]: c for c in decision["checks"]}


# ----------------------------------------------------------------------------- thresholds


@pytest.mark.parametrize(
    "op, value, observed, passed",
    [
        ("<=", 4.0, 4.0, True),
        ("<", 4.0, 4.0, False),
        ("<", 4.0, 3.99, True),
        (">=", 2.0, 2.0, True),
        (">", 2.0, 2.0, False),
        (">", 2.0, 2.5, True),
        ("<=", 4.0, 4.01, False),
    ],
)
def test_threshold_compares_the_candidate_with_the_value(op, value, observed, passed):
    check = {"kind": "threshold", "metric": "eval_loss", "op": op, "value": value}
    decision = decide([check], metrics(observed), None)
    [result] = decision["checks"]
    assert result["passed"] is passed
    assert decision["approved"] is passed
    assert result["observed"] == observed
    assert result["expected"] == f"{op} {value:g}"


def test_threshold_on_perplexity_reads_the_perplexity_metric():
    check = {"kind": "threshold", "metric": "perplexity", "op": "<", "value": 30}
    decision = decide([check], metrics(3.0, perplexity=31.5), None)
    assert decision["checks"][0]["observed"] == 31.5
    assert decision["approved"] is False


def test_a_candidate_with_nan_loss_fails_and_the_result_stays_json():
    decision = decide([LOSS_UNDER_4], metrics(float("nan"), perplexity=float("inf")), None)
    [result] = decision["checks"]
    assert result["passed"] is False
    assert result["observed"] is None
    assert "nan" in result["note"]
    json.dumps(decision, allow_nan=False)


# ------------------------------------------------------------------------- no regression


def test_no_regression_passes_without_a_production_model():
    decision = decide([NO_REGRESSION_1PCT], metrics(3.5), None)
    [result] = decision["checks"]
    assert result["passed"] is True
    assert result["note"] == "no production model yet"
    assert decision["production_version"] is None


def test_no_regression_tolerance_edge_is_inclusive():
    # 3.0 * 1.01 = 3.03: exactly at the bound passes, just above it fails.
    at_bound = decide([NO_REGRESSION_1PCT], metrics(3.03), metrics(3.0), production_version=4)
    above = decide([NO_REGRESSION_1PCT], metrics(3.0301), metrics(3.0), production_version=4)
    assert at_bound["approved"] is True
    assert above["approved"] is False
    assert above["checks"][0]["expected"] == "<= 3.03"
    assert "production v4 eval_loss 3" in above["checks"][0]["note"]
    assert above["production_version"] == 4


def test_no_regression_with_zero_tolerance_rejects_any_worse_candidate():
    check = {"kind": "no_regression", "metric": "eval_loss"}
    assert decide([check], metrics(2.5), metrics(2.5), 1)["approved"] is True
    assert decide([check], metrics(2.4), metrics(2.5), 1)["approved"] is True
    assert decide([check], metrics(2.5001), metrics(2.5), 1)["approved"] is False


def test_no_regression_on_a_higher_is_better_metric_mirrors_the_bound():
    check = {"kind": "no_regression", "metric": "f1_macro", "tolerance": 0.1}
    assert validate_checks([check])[0]["direction"] == "higher_is_better"  # the metric's own
    passed = decide([check], {"f1_macro": 0.81}, {"f1_macro": 0.9}, 1)
    failed = decide([check], {"f1_macro": 0.8}, {"f1_macro": 0.9}, 1)
    assert passed["approved"] is True
    assert failed["approved"] is False and failed["checks"][0]["expected"] == ">= 0.81"


def test_every_metric_the_evaluation_reports_can_be_gated_in_its_own_direction():
    """A classifier is gated on accuracy and macro-F1 as a language model on loss: a threshold
    compares as written; a no-regression reads 'worse' in the metric's direction."""
    candidate = {"eval_loss": 0.3, "accuracy": 0.91, "f1_macro": 0.88}
    production = {"eval_loss": 0.2, "accuracy": 0.93, "f1_macro": 0.9}
    checks = [
        {"kind": "threshold", "metric": "accuracy", "op": ">=", "value": 0.9},
        {"kind": "no_regression", "metric": "f1_macro", "tolerance": 0.05},
        {"kind": "no_regression", "metric": "eval_loss", "tolerance": 0.05},
    ]
    decision = decide(checks, candidate, production, 3)
    assert [c["passed"] for c in decision["checks"]] == [True, True, False]
    better = decide(checks, {**candidate, "eval_loss": 0.2, "f1_macro": 0.95}, production, 3)
    assert better["approved"] is True


def test_an_unknown_metric_or_a_direction_against_the_metrics_is_refused_listing_the_known():
    with pytest.raises(GateConfigError, match=r"unknown metric 'acc'; the known metrics are accuracy "):
        validate_checks([{"kind": "threshold", "metric": "acc", "op": ">=", "value": 0.9}])
    with pytest.raises(GateConfigError, match=r"accuracy \(higher is better; classification\)"):
        validate_checks([{"kind": "threshold", "metric": "acc", "op": ">=", "value": 0.9}])
    wrong = {"kind": "no_regression", "metric": "accuracy", "direction": "lower_is_better"}
    with pytest.raises(
        GateConfigError, match=r"says accuracy is lower_is_better, but accuracy is higher_is_better: drop"
    ):
        validate_checks([wrong])


def test_a_metric_the_evaluation_lacks_is_named_with_the_tasks_that_report_it():
    check = validate_checks([{"kind": "threshold", "metric": "accuracy", "op": ">=", "value": 0.9}])
    evaluation = {
        "run_uri": "file:///r",
        "model_name": "m",
        "production_version": None,
        "candidate": {"eval_loss": 2.0, "perplexity": 7.4},
        "production": None,
    }
    with pytest.raises(
        GateInputError,
        match=r"accuracy is reported for classification only; this evaluation holds eval_loss, perplexity\)$",
    ):
        check_evaluation(evaluation, check)


def test_a_production_model_with_nan_loss_does_not_block_candidates():
    decision = decide([NO_REGRESSION_1PCT], metrics(3.0), metrics(float("nan")), 2)
    assert decision["approved"] is True
    assert "production v2 eval_loss is nan" in decision["checks"][0]["note"]


def test_all_checks_must_pass_and_each_is_reported():
    decision = decide([LOSS_UNDER_4, NO_REGRESSION_1PCT], metrics(3.9), metrics(3.0), 1)
    results = by_name(decision)
    assert results["loss under 4.0"]["passed"] is True
    assert results["no regression"]["passed"] is False
    assert decision["approved"] is False


def test_default_checks_are_a_loose_threshold_and_strict_no_regression():
    checks = validate_checks(DEFAULT_CHECKS)
    assert [c["kind"] for c in checks] == ["threshold", "no_regression"]
    assert checks[1]["tolerance"] == 0.0
    assert decide(DEFAULT_CHECKS, metrics(3.0), None)["approved"] is True
    assert decide(DEFAULT_CHECKS, metrics(3.0), metrics(2.9), 1)["approved"] is False
    assert decide(DEFAULT_CHECKS, metrics(12.0), None)["approved"] is False


# ------------------------------------------------------------------------------ validation


def test_validate_fills_default_names_tolerance_and_direction():
    checks = validate_checks(
        [
            {"kind": "threshold", "metric": "eval_loss", "op": "<", "value": 3},
            {"kind": "no_regression", "metric": "perplexity"},
        ]
    )
    assert checks[0]["name"] == "eval_loss < 3"
    assert checks[0]["value"] == 3.0
    assert checks[1] == {
        "kind": "no_regression",
        "metric": "perplexity",
        "tolerance": 0.0,
        "direction": "lower_is_better",
        "name": "perplexity no regression (tolerance 0)",
    }


def threshold(**fields) -> dict:
    return {"kind": "threshold", "metric": "eval_loss", "op": "<", "value": 1, **fields}


def no_regression(**fields) -> dict:
    return {"kind": "no_regression", "metric": "eval_loss", **fields}


@pytest.mark.parametrize(
    "check, words",
    [
        (threshold(kind="thresold"), ["'thresold'", "kind"]),
        (threshold(metric="bleu"), ["'bleu'", "metric", "f1_macro"]),
        (threshold(op="=="), ["'=='", "op"]),
        ({"kind": "threshold", "metric": "eval_loss", "op": "<"}, ["'value'", "None"]),
        (threshold(value="4"), ["'value'", "'4'"]),
        (threshold(value=float("inf")), ["'value'", "inf"]),
        (no_regression(tolerance=-0.1), ["'tolerance'", "-0.1"]),
        (no_regression(direction="up"), ["'up'", "direction"]),
        (threshold(tolerance=0.1), ["'tolerance'", "unknown field"]),
        (threshold(name=""), ["'name'"]),
    ],
)
def test_config_errors_name_the_check_and_the_bad_field(check, words):
    good = {"kind": "threshold", "metric": "eval_loss", "op": "<", "value": 9}
    with pytest.raises(GateConfigError) as err:
        validate_checks([good, check])
    message = str(err.value)
    assert "check #1" in message
    for word in words:
        assert word in message


def test_config_error_names_the_check_by_name_when_it_has_one():
    with pytest.raises(GateConfigError, match=r"'loss cap'.*'>>'"):
        validate_checks(
            [{"name": "loss cap", "kind": "threshold", "metric": "eval_loss", "op": ">>", "value": 1}]
        )


@pytest.mark.parametrize(
    "checks, words",
    [
        ([], ["empty"]),
        ({"kind": "threshold"}, ["list"]),
        (["eval_loss < 4"], ["check #0", "'eval_loss < 4'"]),
        ([LOSS_UNDER_4, LOSS_UNDER_4], ["'loss under 4.0'", "unique"]),
    ],
)
def test_config_errors_for_the_list_itself(checks, words):
    with pytest.raises(GateConfigError) as err:
        validate_checks(checks)
    for word in words:
        assert word in str(err.value)


# ---------------------------------------------------------------------- evaluation input


def evaluation(**overrides) -> dict:
    base = {
        "metrics_uri": "file:///r/eval/metrics.json",
        "run_uri": "file:///r",
        "model_name": "demo-lm",
        "candidate": metrics(3.0),
        "production": metrics(3.1),
        "production_version": 1,
    }
    return {**base, **overrides}


def test_check_evaluation_accepts_a_well_formed_result():
    checks = validate_checks(DEFAULT_CHECKS)
    assert check_evaluation(evaluation(), checks)["model_name"] == "demo-lm"
    assert check_evaluation(evaluation(production=None, production_version=None), checks)


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"candidate": {"perplexity": 3.0}}, ["candidate", "'eval_loss'", "None"]),
        ({"production": {"eval_loss": "3.1"}}, ["production", "'eval_loss'", "'3.1'"]),
        ({"run_uri": None}, ["'run_uri'"]),
        ({"production_version": "1"}, ["'production_version'", "'1'"]),
        ({"production": None}, ["production_version 1", "no production metrics"]),
        ({"production_version": None}, ["production_version is None"]),
        ({"candidate": [3.0]}, ["'candidate'"]),
    ],
)
def test_malformed_evaluation_is_reported_by_field(overrides, words):
    with pytest.raises(GateInputError) as err:
        check_evaluation(evaluation(**overrides), validate_checks(DEFAULT_CHECKS))
    for word in words:
        assert word in str(err.value)


def test_evaluation_that_is_not_a_dict_is_rejected():
    with pytest.raises(GateInputError, match="EvaluateModelOperator"):
        check_evaluation("s3://b/eval/metrics.json", validate_checks(DEFAULT_CHECKS))


# ------------------------------------------------------------------------------- table


def test_format_table_shows_verdict_and_one_aligned_row_per_check():
    decision = decide([LOSS_UNDER_4, NO_REGRESSION_1PCT], metrics(3.9), metrics(3.0), 7)
    lines = format_table(decision).splitlines()
    assert lines[0] == "gate REJECTED: 1/2 checks passed, against production v7"
    assert lines[1].split() == ["check", "metric", "observed", "expected", "result", "note"]
    assert set(lines[2]) <= {"-", " "}
    assert len(lines) == 5
    assert "loss under 4.0" in lines[3] and "pass" in lines[3] and "3.9" in lines[3]
    assert "no regression" in lines[4] and "FAIL" in lines[4] and "<= 3.03" in lines[4]
    # Columns line up: "observed" starts at the same offset in header and rows.
    col = lines[1].index("observed")
    assert lines[3][col:].startswith("3.9")
    assert lines[4][col:].startswith("3.9")


def test_format_table_without_production():
    table = format_table(decide(DEFAULT_CHECKS, metrics(3.0), None))
    assert table.splitlines()[0] == "gate APPROVED: 2/2 checks passed, against no production model"
    assert "no production model yet" in table


# ---------------------------------------------------------------------------- templates


TEMPLATED = {
    "name": "loss cap",
    "kind": "threshold",
    "metric": "eval_loss",
    "op": "<=",
    "value": "{{ params.max_eval_loss }}",
}


def test_templates_are_kept_at_parse_and_read_as_numbers_once_rendered():
    parsed = validate_checks([TEMPLATED], templates="allow")
    assert parsed[0]["value"] == "{{ params.max_eval_loss }}"
    rendered = validate_checks([{**parsed[0], "value": "0.5"}], templates="rendered")
    assert rendered[0]["value"] == 0.5
    assert decide(rendered, metrics(3.0), None)["approved"] is False


@pytest.mark.parametrize(
    "checks, templates, words",
    [
        ([TEMPLATED], None, ["'value'", "params.max_eval_loss"]),
        ([{**TEMPLATED, "value": "4"}], "allow", ["'value'", "'4'"]),
        ([{**TEMPLATED, "value": "lots"}], "rendered", ["'value'", "'lots'", "not a number"]),
        ([TEMPLATED], "rendered", ["'value'", "params.max_eval_loss"]),
    ],
)
def test_template_errors_name_the_field_and_value(checks, templates, words):
    with pytest.raises(GateConfigError) as err:
        validate_checks(checks, templates=templates)
    for word in words:
        assert word in str(err.value)


def test_a_teams_own_metric_is_gated_in_the_direction_its_check_declares():
    from trainops.gate.checks import check_evaluation

    checks = validate_checks(
        [
            {
                "kind": "threshold",
                "metric": "worst_label_recall",
                "direction": "higher_is_better",
                "op": ">=",
                "value": 0.6,
            },
            {"kind": "no_regression", "metric": "refusals", "direction": "lower_is_better", "tolerance": 0.1},
        ]
    )
    assert checks[0]["direction"] == "higher_is_better" and checks[1]["direction"] == "lower_is_better"
    candidate = {
        "worst_label_recall": 0.7,
        "refusals": 12.0,
        "user_metrics": {"worst_label_recall": "t:w", "refusals": "t:r"},
    }
    production = {
        "worst_label_recall": 0.9,
        "refusals": 10.0,
        "user_metrics": {"worst_label_recall": "t:w", "refusals": "t:r"},
    }
    decision = decide(checks, candidate, production, 4)
    # refusals: lower is better, 12 > 10 * 1.1: a regression the declared direction catches
    assert [(c["metric"], c["passed"], c["expected"]) for c in decision["checks"]] == [
        ("worst_label_recall", True, ">= 0.6"),
        ("refusals", False, "<= 11"),
    ]
    # a check on a team's metric the evaluation lacks says where such metrics come from
    with pytest.raises(
        Exception, match=r"no scorer of this evaluation returned it \(EvaluateModelOperator's metrics"
    ):
        check_evaluation(
            {"run_uri": "file:///r", "model_name": "m", "candidate": {"accuracy": 0.9}, "production": None},
            checks[:1],
        )


def test_a_metric_that_is_neither_built_in_nor_declared_is_refused_listing_the_known_ones():
    with pytest.raises(GateConfigError) as raised:
        validate_checks([{"kind": "threshold", "metric": "worst_label_recall", "op": ">=", "value": 0.6}])
    message = str(raised.value)
    assert message.startswith(
        "check #0 has unknown metric 'worst_label_recall'; the known metrics are accuracy "
    )
    assert message.endswith(
        "a team's own metric (EvaluateModelOperator's metrics) needs 'direction': "
        "one of ['lower_is_better', 'higher_is_better']"
    )
    with pytest.raises(
        GateConfigError,
        match=r"unknown metric 'tokens'.*\('tokens' is a name the evaluation or the gate uses itself\)",
    ):
        validate_checks(
            [
                {
                    "kind": "threshold",
                    "metric": "tokens",
                    "direction": "higher_is_better",
                    "op": ">=",
                    "value": 1,
                }
            ]
        )
    with pytest.raises(
        GateConfigError, match=r"says accuracy is lower_is_better, but accuracy is higher_is_better"
    ):
        validate_checks(
            [
                {
                    "kind": "threshold",
                    "metric": "accuracy",
                    "direction": "lower_is_better",
                    "op": ">=",
                    "value": 1,
                }
            ]
        )


def test_a_tolerance_is_a_share_of_productions_size_for_a_metric_below_zero_too():
    check = {"kind": "no_regression", "metric": "loglik", "direction": "higher_is_better", "tolerance": 0.05}
    same = decide([check], {"loglik": -2.3}, {"loglik": -2.3}, 1)["checks"][0]
    assert same["passed"] is True and same["expected"] == ">= -2.415"
    worse = decide([check], {"loglik": -2.5}, {"loglik": -2.3}, 1)["checks"][0]
    assert worse["passed"] is False
    lower = {"kind": "no_regression", "metric": "refusals", "direction": "lower_is_better", "tolerance": 0.1}
    assert decide([lower], {"refusals": 0.0}, {"refusals": 0.0}, 1)["checks"][0]["passed"] is True
