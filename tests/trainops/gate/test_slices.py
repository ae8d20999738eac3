"""Per-slice gate checks: great-expectations expectations over the per-slice metrics table."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from trainops.gate.checks import (
    GateConfigError,
    GateInputError,
    check_evaluation,
    decide,
    format_table,
    validate_checks,
)
from trainops.gate.slices import SLICE_EXPECTATIONS, TABLE_COLUMNS, build_expectations, slice_rows


def metrics(loss: float, slices: dict[str, float | None], column: str = "source") -> dict:
    def one(value):
        if value is None:
            return {"eval_loss": None, "perplexity": None, "tokens": 0}
        return {"eval_loss": value, "perplexity": math.exp(value), "tokens": 100}

    return {
        "eval_loss": loss,
        "perplexity": math.exp(loss),
        "tokens": 1000,
        "slices": {column: {name: one(v) for name, v in slices.items()}},
    }


def slices_check(etype: str = "expect_column_values_to_be_between", **kwargs) -> dict:
    kwargs = kwargs or {"column": "eval_loss", "max_value": 3.0}
    return {"kind": "slices", "expectation": {"type": etype, "kwargs": kwargs}}


EVERY_SLICE_UNDER_3 = {"name": "every slice under 3", **slices_check()}
NO_SLICE_5PCT_WORSE = {"name": "no slice 5% worse", "kind": "slice_no_regression", "tolerance": 0.05}


# ------------------------------------------------------------------------------ the table


def test_the_table_has_a_row_per_slice_with_production_figures_and_ratios():
    rows = slice_rows(
        metrics(2.9, {"wiki": 2.2, "web": 3.3, "code": None}), metrics(2.9, {"wiki": 2.0, "web": 3.3})
    )
    assert [(r["slice_column"], r["slice"]) for r in rows] == [
        ("source", "code"),
        ("source", "web"),
        ("source", "wiki"),
    ]
    assert set(rows[0]) == set(TABLE_COLUMNS)
    wiki = rows[2]
    assert wiki["eval_loss"] == 2.2 and wiki["production_eval_loss"] == 2.0
    assert wiki["regression_ratio"] == pytest.approx(1.1)
    assert wiki["perplexity_ratio"] == pytest.approx(math.exp(0.2))
    # A slice with no scored token, and one production has no figure for, stay null.
    assert rows[0]["eval_loss"] is None and rows[0]["production_eval_loss"] is None
    assert rows[0]["regression_ratio"] is None
    assert rows[1]["regression_ratio"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------ decisions


def by_name(decision):
    return {c["name"]: c for c in decision["checks"]}


def test_every_slice_below_a_bound_names_the_failing_slices():
    decision = decide([EVERY_SLICE_UNDER_3], metrics(2.5, {"wiki": 2.2, "web": 3.3, "code": 3.1}), None)
    [check] = decision["checks"]
    assert decision["approved"] is False and check["passed"] is False
    assert check["observed"] == 3.3  # the worst slice
    assert check["expected"] == "<= 3"
    assert check["note"] == "2/3 slices fail: source=code (3.1), source=web (3.3)"
    assert check["slices"] == [
        {"slice_column": "source", "slice": "code", "value": 3.1},
        {"slice_column": "source", "slice": "web", "value": 3.3},
    ]
    json.dumps(decision, allow_nan=False)


def test_no_slice_worse_than_production_by_more_than_the_tolerance():
    production = metrics(2.5, {"wiki": 2.0, "web": 3.0})
    ok = decide([NO_SLICE_5PCT_WORSE], metrics(2.5, {"wiki": 2.1, "web": 2.8}), production, 4)
    bad = decide([NO_SLICE_5PCT_WORSE], metrics(2.5, {"wiki": 2.2, "web": 2.8}), production, 4)
    assert ok["approved"] is True
    assert ok["checks"][0]["note"] == "2/2 slices checked; against production v4"
    [check] = bad["checks"]
    assert check["passed"] is False
    assert check["observed"] == pytest.approx(1.1)
    assert check["expected"] == "<= 1.05"
    assert check["note"].startswith("1/2 slices fail: source=wiki (1.1)")


def test_a_new_slice_production_never_saw_is_not_a_regression():
    decision = decide(
        [NO_SLICE_5PCT_WORSE], metrics(2.5, {"wiki": 2.0, "new": 9.0}), metrics(2.5, {"wiki": 2.0}), 1
    )
    assert decision["approved"] is True
    assert decision["checks"][0]["note"].startswith("1/2 slices checked")


def test_production_checks_pass_without_a_production_model():
    decision = decide([NO_SLICE_5PCT_WORSE, EVERY_SLICE_UNDER_3], metrics(2.5, {"wiki": 2.0}), None)
    assert decision["approved"] is True
    assert by_name(decision)["no slice 5% worse"]["note"] == "no production model yet"


def test_aggregate_expectations_and_slice_column_filter():
    candidate = {
        "eval_loss": 2.5,
        "perplexity": 12.0,
        "tokens": 1000,
        "slices": {
            "source": {
                "wiki": {"eval_loss": 2.0, "perplexity": 7.4, "tokens": 500},
                "web": {"eval_loss": 3.0, "perplexity": 20.1, "tokens": 500},
            },
            "lang": {
                "en": {"eval_loss": 2.8, "perplexity": 16.4, "tokens": 900},
                "de": {"eval_loss": 3.6, "perplexity": 36.6, "tokens": 100},
            },
        },
    }
    checks = [
        {
            "name": "mean source loss",
            "slice_column": "source",
            **slices_check("expect_column_mean_to_be_between", column="eval_loss", max_value=2.6),
        },
        {
            "name": "worst lang",
            "slice_column": "lang",
            **slices_check("expect_column_max_to_be_between", column="eval_loss", max_value=3.5),
        },
        {"name": "enough tokens per slice", **slices_check(column="tokens", min_value=200)},
        {"name": "no such column", "slice_column": "country", **slices_check()},
    ]
    results = by_name(decide(checks, candidate, None))
    assert (results["mean source loss"]["passed"], results["mean source loss"]["observed"]) == (True, 2.5)
    assert (results["worst lang"]["passed"], results["worst lang"]["observed"]) == (False, 3.6)
    assert results["enough tokens per slice"]["passed"] is False
    assert results["enough tokens per slice"]["slices"] == [
        {"slice_column": "lang", "slice": "de", "value": 100.0}
    ]
    assert results["no such column"]["passed"] is False
    assert "no slice of column 'country'" in results["no such column"]["note"]


def test_an_evaluation_without_slices_fails_slice_checks_instead_of_passing_them():
    decision = decide(
        [EVERY_SLICE_UNDER_3], {"eval_loss": 2.0, "perplexity": 7.4, "tokens": 10, "slices": {}}, None
    )
    assert decision["approved"] is False
    assert "no slices in the evaluation" in decision["checks"][0]["note"]


def test_table_shows_slice_checks_with_their_verdicts():
    decision = decide(
        [
            {"kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 4},
            EVERY_SLICE_UNDER_3,
            NO_SLICE_5PCT_WORSE,
        ],
        metrics(2.5, {"wiki": 2.2, "web": 3.3}),
        metrics(2.5, {"wiki": 2.2, "web": 3.0}),
        2,
    )
    table = format_table(decision)
    assert table.splitlines()[0] == "gate REJECTED: 1/3 checks passed, against production v2"
    assert "every slice under 3" in table and "source=web (3.3)" in table
    assert "no slice 5% worse" in table and "<= 1.05" in table


def test_malformed_slices_in_the_evaluation_are_named():
    evaluation = {
        "run_uri": "file:///r",
        "model_name": "m",
        "production": None,
        "production_version": None,
        "candidate": {"eval_loss": 2.0, "slices": {"wiki": {"eval_loss": 2.0}}},
    }
    with pytest.raises(GateInputError, match=r"candidate field 'slices'.*'every slice under 3'"):
        check_evaluation(evaluation, validate_checks([EVERY_SLICE_UNDER_3]))


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "check, words",
    [
        (
            slices_check("expect_column_to_be_awesome", column="eval_loss"),
            ["'expect_column_to_be_awesome'", "expect_column_values_to_be_between"],
        ),
        (slices_check(column="loss", max_value=3), ["'loss'", "regression_ratio"]),
        (slices_check(column="eval_loss", max_valu=3), ["'max_valu'", "max_value"]),
        (slices_check(column="eval_loss"), ["'min_value', 'max_value'"]),
        (slices_check(column="eval_loss", max_value="3"), ["'max_value'", "'3'"]),
        (slices_check(column="eval_loss", max_value=3, mostly=2), ["mostly", "2"]),
        ({"kind": "slices", "expectation": "eval_loss < 3"}, ["'expectation'", "'eval_loss < 3'"]),
        (
            {
                "kind": "slices",
                "expectation": {
                    "type": "expect_column_values_to_be_between",
                    "kwargs": {"column": "eval_loss", "max_value": 3},
                },
                "metric": "eval_loss",
            },
            ["unknown field 'metric'"],
        ),
        ({"kind": "slice_no_regression", "tolerance": -0.1}, ["'tolerance'", "-0.1"]),
        (
            {"kind": "slice_no_regression", "metric": "acuracy"},
            ["'acuracy'", "the known metrics are accuracy"],
        ),
        ({"kind": "slice_no_regression", "slice_column": ""}, ["slice_column", "''"]),
    ],
)
def test_broken_slice_checks_are_refused_at_parse_naming_the_check(check, words):
    with pytest.raises(GateConfigError) as err:
        validate_checks([{"kind": "threshold", "metric": "eval_loss", "op": "<", "value": 9}, check])
    assert "check #1" in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_validation_is_idempotent_and_names_checks_by_default():
    checks = validate_checks(
        [slices_check(), {"kind": "slice_no_regression", "tolerance": 0.05, "slice_column": "source"}]
    )
    assert validate_checks(checks) == checks
    assert [c["name"] for c in checks] == [
        "slices: expect_column_values_to_be_between(eval_loss) <= 3",
        "no slice of source regresses in eval_loss (tolerance 0.05)",
    ]


def test_gx_refusing_a_definition_is_a_config_error_naming_the_check():
    checks = validate_checks(
        [{"name": "ratio cap", **slices_check(column="regression_ratio", max_value=1.0, strict_max="maybe")}]
    )
    with pytest.raises(GateConfigError, match=r"check 'ratio cap': GX refuses.*strict_max"):
        build_expectations(checks)


def test_every_supported_expectation_exists_in_great_expectations():
    import great_expectations as gx

    for etype, (class_name, _) in SLICE_EXPECTATIONS.items():
        assert hasattr(gx.expectations, class_name), etype


def test_validating_slice_checks_does_not_import_gx_or_pandas():
    code = (
        "import sys; from trainops.gate.checks import validate_checks; "
        f"validate_checks([{EVERY_SLICE_UNDER_3!r}, {NO_SLICE_5PCT_WORSE!r}]); "
        "print(sorted(m for m in ('great_expectations', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------ any metric


def _classifier(accuracy: dict, recall: dict | None = None) -> dict:
    """A classifier's metrics with per-slice accuracy (and a team's recall) by length."""
    slices = {
        value: {
            "eval_loss": 0.3,
            "tokens": 50,
            "accuracy": a,
            **({"worst_recall": recall[value]} if recall else {}),
        }
        for value, a in accuracy.items()
    }
    return {"eval_loss": 0.3, "accuracy": 0.9, "slices": {"length": slices}}


def test_a_slice_check_works_on_any_metric_the_slices_hold_in_its_direction():
    checks = [
        {"name": "accuracy", "kind": "slice_no_regression", "metric": "accuracy", "tolerance": 0.05},
        {
            "name": "recall",
            "kind": "slice_no_regression",
            "metric": "worst_recall",
            "direction": "lower_is_better",
            "tolerance": 0.05,
        },
    ]
    candidate = _classifier({"short": 0.80, "long": 0.95}, {"short": 0.5, "long": 0.5})
    production = _classifier({"short": 0.90, "long": 0.90}, {"short": 0.5, "long": 0.4})
    rows = slice_rows(candidate, production)
    assert rows[1]["slice"] == "short" and rows[1]["accuracy_ratio"] == pytest.approx(0.8 / 0.9)
    decision = decide(checks, candidate, production, 2)
    accuracy, recall = decision["checks"]
    # higher is better: short fell 11 %, beyond 5 %; long rose, which is no regression
    assert accuracy["expected"] == ">= 0.95" and accuracy["passed"] is False
    assert [(s["slice"], round(s["value"], 3)) for s in accuracy["slices"]] == [("short", 0.889)]
    # the team's metric, lower is better as declared: long went from 0.4 to 0.5
    assert recall["expected"] == "<= 1.05" and [s["slice"] for s in recall["slices"]] == ["long"]


def test_a_slice_check_on_a_metric_the_slices_lack_fails_saying_what_they_hold():
    check = {"name": "acc", "kind": "slice_no_regression", "metric": "accuracy", "tolerance": 0.05}
    outcome = decide([check], metrics(2.9, {"wiki": 2.2}), metrics(2.9, {"wiki": 2.0}), 1)["checks"][0]
    assert outcome["passed"] is False
    assert outcome["note"] == "the slices hold no accuracy_ratio (they hold eval_loss, perplexity, tokens)"
    slices = {
        "kind": "slices",
        "expectation": {
            "type": "expect_column_min_to_be_between",
            "kwargs": {"column": "accuracy", "min_value": 0.8},
        },
    }
    assert validate_checks([slices])[0]["expectation"]["kwargs"]["column"] == "accuracy"  # known at parse


def test_a_ratio_check_on_a_slice_where_production_is_not_positive_fails_saying_why():
    check = {
        "name": "margin",
        "kind": "slice_no_regression",
        "metric": "margin",
        "direction": "higher_is_better",
        "tolerance": 0.05,
    }
    candidate = {"slices": {"length": {"short": {"eval_loss": 1.0, "margin": 0.1}}}}
    production = {"slices": {"length": {"short": {"eval_loss": 1.0, "margin": -0.2}}}}
    outcome = decide([check], candidate, production, 1)["checks"][0]
    assert outcome["passed"] is False
    assert outcome["note"].startswith("production's margin on slice length=short is -0.2: a ratio cannot say")
    # a metric the slices do not hold fails even before there is a production model
    typo = {**check, "metric": "margn"}
    assert decide([typo], candidate, None, None)["checks"][0]["note"].startswith(
        "the slices hold no margn_ratio"
    )
