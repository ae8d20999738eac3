"""A team's own metrics: called on what the model said, overall and per slice, and never
dropped in silence (trainer.evaluate.user; the example scorers in examples/team_metrics.py)."""

from __future__ import annotations

import pytest

from examples.team_metrics import word_f1, worst_label_recall
from trainer.evaluate.user import Predictions, UserMetric, UserMetricError, figures, load_user_metrics, score

GIVEN = Predictions(
    predictions=["news", "news", "forum", "docs", "news", "forum"],
    references=["news", "forum", "forum", "docs", "news", "docs"],
    records=[
        {"id": 0, "length": "short"},
        {"id": 1, "length": "long"},
        {"id": 2, "length": "short"},
        {"id": 3, "length": "long"},
        {"id": 4, "length": "long"},
        {},  # a record the eval index does not hold
    ],
)


def raising(predictions, references, records):
    raise KeyError("label")


def test_the_example_scorers_give_what_their_teams_report():
    # docs: 1 of 2, forum: 1 of 2, news: 2 of 2
    assert worst_label_recall(GIVEN.predictions, GIVEN.references, GIVEN.records) == {
        "worst_label_recall": 0.5
    }
    said = ["The Eiffel tower.", "in oslo", "blue"]
    truth = ["eiffel tower", "oslo, norway", "red"]
    scores = word_f1(said, truth, [{}] * 3)
    assert scores["word_exact_match"] == pytest.approx(1 / 3)
    assert scores["word_f1"] == pytest.approx((1 + 2 * 0.5 * 0.5 / 1.0 + 0) / 3)


def test_figures_are_scored_over_every_record_and_again_per_slice_value():
    metrics = load_user_metrics(["examples.team_metrics:worst_label_recall"])
    overall, per_slice, sources = figures(metrics, GIVEN, ["length"])
    assert overall == {"worst_label_recall": 0.5}
    assert sources == {"worst_label_recall": "examples.team_metrics:worst_label_recall"}
    # long: forum missed (0 of 1), docs and news right; short: both right; the record outside
    # the eval index (a docs missed) counts overall only
    assert per_slice == {
        "length": {"long": {"worst_label_recall": 0.0}, "short": {"worst_label_recall": 1.0}}
    }


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (0.5, r"returned float 0.5; it must return a non-empty mapping of names to numbers"),
        ({}, r"returned dict \{\}; it must return a non-empty mapping"),
        ({"recall": float("nan")}, r"returned 'recall' = float nan; a figure must be a finite number"),
        ({"recall": "0.5"}, r"returned 'recall' = str '0.5'; a figure must be a finite number"),
        ({"recall": True}, r"returned 'recall' = bool True"),
        (
            {"accuracy": 0.5},
            r"returned a figure named 'accuracy'; 'accuracy' is a name the evaluation or the gate",
        ),
        ({"slice": 0.5}, r"returned a figure named 'slice'; 'slice' is a name the evaluation or the gate"),
        ({"recall_ratio": 0.5}, r"returned a figure named 'recall_ratio'; 'recall_ratio' is a name"),
        ({"production_recall": 0.5}, r"returned a figure named 'production_recall'; 'production_recall' is"),
        ({"2nd place": 0.5}, r"returned a figure named '2nd place'; a metric name is a letter, then"),
        ({"recall\n": 0.5}, r"returned a figure named 'recall\\n'; a metric name is a letter"),
        ({"recall": 10**400}, r"returned 'recall' = int 1000"),
    ],
)
def test_a_figure_that_is_not_a_named_finite_number_fails_naming_the_function(returned, message):
    metric = UserMetric("team.metrics:score", lambda p, r, c: returned)
    with pytest.raises(UserMetricError, match=rf"^user metric team.metrics:score {message}"):
        score([metric], GIVEN)


def test_a_metric_that_raises_fails_with_its_name_the_exception_and_where():
    metric = UserMetric("tests.trainer.evaluate.test_user:raising", raising)
    with pytest.raises(UserMetricError) as raised:
        figures([metric], GIVEN, ["length"])
    assert str(raised.value) == (
        "user metric tests.trainer.evaluate.test_user:raising raised KeyError: 'label' (6 records); "
        "fix it or drop it from eval.metrics"
    )
    assert isinstance(raised.value.__cause__, KeyError)
    # per slice too: the slice is named
    calls = []

    def fails_on_short(predictions, references, records):
        calls.append(len(records))
        if all(r.get("length") == "short" for r in records):
            raise ZeroDivisionError("no long records")
        return {"n": len(records)}

    with pytest.raises(
        UserMetricError, match=r"raised ZeroDivisionError: no long records on slice length=short"
    ):
        figures([UserMetric("t:m", fails_on_short)], GIVEN, ["length"])


def test_two_metrics_that_return_one_name_are_refused_naming_both():
    one, two = (
        UserMetric("a:one", lambda p, r, c: {"recall": 1}),
        UserMetric("b:two", lambda p, r, c: {"recall": 0}),
    )
    with pytest.raises(UserMetricError, match=r"user metrics a:one and b:two both return 'recall'"):
        score([one, two], GIVEN)


def test_a_scorer_that_cannot_be_loaded_is_named_before_anything_is_scored():
    with pytest.raises(
        ImportError, match=r"eval.metrics 'no_such_team.metrics:score': cannot import 'no_such_team.metrics'"
    ):
        load_user_metrics(["no_such_team.metrics:score"])
    with pytest.raises(AttributeError, match=r"module 'examples.team_metrics' has no function 'recall'"):
        load_user_metrics(["examples.team_metrics:recall"])


def test_an_integer_or_a_numpy_number_is_kept_as_a_float():
    import numpy as np

    returned = {"count": len(GIVEN.predictions), "share": np.float32(0.5), "hits": np.int64(3)}
    overall, _, _ = figures([UserMetric("t:m", lambda p, r, c: returned)], GIVEN, [])
    assert overall == {"count": 6.0, "share": 0.5, "hits": 3.0}
    assert all(type(v) is float for v in overall.values())


def test_a_scorer_may_say_nothing_about_a_slice_but_must_about_the_whole_set():
    def only_when_both_lengths(predictions, references, records):
        lengths = {r.get("length") for r in records}
        return {"mixed": 1.0} if {"short", "long"} <= lengths else None

    overall, per_slice, _ = figures([UserMetric("t:m", only_when_both_lengths)], GIVEN, ["length"])
    assert overall == {"mixed": 1.0} and per_slice == {"length": {"long": {}, "short": {}}}
    with pytest.raises(UserMetricError, match=r"returned NoneType None; it must return a non-empty mapping"):
        figures([UserMetric("t:m", lambda p, r, c: None)], GIVEN, ["length"])
