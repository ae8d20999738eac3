"""The evaluation's arithmetic (trainer.evaluate.scores): every token predicted once, slices
by record, a classifier's figures as scikit-learn defines them, an answer's exact match and
token F1, calibration and AUROC."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.evaluate.scores import eval_windows, slice_summaries, token_owners


def test_eval_windows_predict_every_token_once():
    windows = eval_windows(10, 4)
    assert windows == [(0, 5), (4, 9), (8, 10)]
    predicted = [t for a, b in windows for t in range(a + 1, b)]
    assert predicted == list(range(1, 10))


def test_slices_follow_record_spans():
    records = [{"source": "a", "start": 0, "end": 3}, {"source": "b", "start": 3, "end": 6}]
    owners = token_owners(records, 7)
    assert owners.tolist() == [0, 0, 0, 1, 1, 1, -1]
    losses = np.array([np.nan, 1.0, 3.0, 2.0, 4.0, 6.0, 9.0])
    slices = slice_summaries(losses, owners, records, ["source"])["source"]
    assert slices["a"] == {"eval_loss": 2.0, "perplexity": pytest.approx(math.exp(2.0)), "tokens": 2}
    assert (slices["b"]["eval_loss"], slices["b"]["tokens"]) == (4.0, 3)


def test_a_classifiers_figures_are_accuracy_and_each_labels_precision_recall_and_f1():
    from trainer.evaluate.scores import label_metrics

    # truth:     a a a b b c ; predicted: a a b b c c  (label "d" is in the set, never seen nor said)
    figures = label_metrics(np.array([0, 0, 0, 1, 1, 2]), np.array([0, 0, 1, 1, 2, 2]), ["a", "b", "c", "d"])
    assert figures["accuracy"] == pytest.approx(4 / 6)
    assert figures["per_label"]["a"] == {
        "precision": 1.0,
        "recall": pytest.approx(2 / 3),
        "f1": 0.8,
        "support": 3,
    }
    assert figures["per_label"]["b"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert figures["per_label"]["c"] == {
        "precision": 0.5,
        "recall": 1.0,
        "f1": pytest.approx(2 / 3),
        "support": 1,
    }
    assert figures["per_label"]["d"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert figures["f1_macro"] == pytest.approx((0.8 + 0.5 + 2 / 3 + 0.0) / 4)
    # rows: the truth, columns: the prediction (scikit-learn's confusion_matrix)
    assert figures["confusion"] == {
        "labels": ["a", "b", "c", "d"],
        "counts": [[2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]],
    }
    assert label_metrics(np.array([]), np.array([]), ["a", "b"]) == {
        "accuracy": None,
        "f1_macro": None,
        "per_label": {},
        "confusion": {"labels": ["a", "b"], "counts": [[0, 0], [0, 0]]},
    }


# --- sft: greedy answers scored against the references ----------------------------------------


def test_an_answer_scores_exact_match_and_token_f1_as_bags_of_tokens():
    from trainer.evaluate.scores import answer_scores

    assert answer_scores([5, 6, 7], [5, 6, 7]) == (1.0, 1.0)
    assert answer_scores([7, 6, 5], [5, 6, 7]) == (0.0, 1.0)  # the same tokens, another order
    exact, f1 = answer_scores([5, 9], [5, 6, 7, 8])  # 1 in common: precision 1/2, recall 1/4
    assert exact == 0.0 and f1 == pytest.approx(2 * 0.5 * 0.25 / 0.75)
    assert answer_scores([1, 1], [1]) == (0.0, pytest.approx(2 / 3))  # a repeat counts once
    assert answer_scores([3], [4]) == (0.0, 0.0) and answer_scores([], []) == (1.0, 1.0)


def test_calibration_error_is_the_gap_between_how_sure_and_how_right_per_bin():
    from trainer.evaluate.scores import calibration_error

    sure_and_right = np.array([[0.95, 0.05], [0.05, 0.95]])
    assert calibration_error(sure_and_right, np.array([0, 1])) == pytest.approx(0.05)
    # 0.9 sure on four records, right on two: a gap of 0.4; 0.6 sure and right on two: 0.4
    probabilities = np.array([[0.9, 0.1]] * 4 + [[0.4, 0.6]] * 2)
    truth = np.array([0, 0, 1, 1, 1, 1])
    assert calibration_error(probabilities, truth) == pytest.approx((0.4 * 4 + 0.4 * 2) / 6)
    assert calibration_error(np.zeros((0, 2)), np.array([])) is None


def test_auroc_is_the_chance_a_positive_outscores_a_negative_as_mann_whitney_counts_it():
    from trainer.evaluate.scores import binary_auroc

    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 2, 200)
    score = np.round(np.clip(0.5 + 0.2 * (truth - 0.5) + rng.normal(0, 0.2, 200), 0, 1), 1)  # ties
    probabilities = np.stack([1 - score, score], axis=1)
    u = stats.mannwhitneyu(score[truth == 1], score[truth == 0]).statistic
    assert binary_auroc(probabilities, truth) == pytest.approx(u / ((truth == 1).sum() * (truth == 0).sum()))
    assert binary_auroc(np.array([[0.8, 0.2], [0.3, 0.7]]), np.array([0, 1])) == 1.0
    assert binary_auroc(np.array([[0.2, 0.8], [0.7, 0.3]]), np.array([0, 1])) == 0.0
    assert binary_auroc(np.ones((3, 3)) / 3, np.array([0, 1, 2])) is None  # three labels
    assert binary_auroc(np.array([[0.8, 0.2]]), np.array([0])) is None  # no positive record


def test_slices_group_the_scored_units_by_their_records_columns():
    from trainer.evaluate.scores import answer_summary, classifier_figures, slice_groups

    units = [{"id": 0, "length": "short"}, {"id": 1, "length": "long"}, {}, {"id": 3, "length": "short"}]
    assert slice_groups(units, ["length", "source"]) == {
        "length": {"long": [1], "short": [0, 3]},  # the unit outside the eval index: in no slice
        "source": {"None": [0, 1, 3]},  # a column a record lacks groups as 'None', as tokens do
    }
    exact, f1 = np.array([1.0, 0.0, np.nan, 1.0]), np.array([1.0, 0.5, np.nan, 1.0])
    assert answer_summary(exact[[0, 3]], f1[[0, 3]]) == {"exact_match": 1.0, "token_f1": 1.0, "answers": 2}
    assert answer_summary(exact[[2]], f1[[2]]) == {"exact_match": None, "token_f1": None, "answers": 0}
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    figures = classifier_figures(np.array([0, 1, 1]), probabilities, ["no", "yes"])
    assert figures["accuracy"] == pytest.approx(2 / 3) and figures["auroc"] == 1.0
    assert figures["f1_macro"] == pytest.approx((2 / 3 + 2 / 3) / 2)
