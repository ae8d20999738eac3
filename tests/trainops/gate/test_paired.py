"""``no_regression`` with ``confidence``: a paired bootstrap over the same eval records rejects a
real regression and lets noise pass, the same way every time (trainops.gate.paired)."""

from __future__ import annotations

import numpy as np
import pytest

from trainops.gate.checks import decide, validate_checks
from trainops.gate.paired import paired_interval

RECORDS, LABELS = 200, 3
CHECK = {"kind": "no_regression", "metric": "accuracy", "tolerance": 0.02, "confidence": 0.95}


def _labelled(seed: int):
    """Noisy references, and production's predictions: right on about 85% of the clean labels."""
    rng = np.random.default_rng(seed)
    clean = rng.integers(0, LABELS, RECORDS)
    noisy = np.where(rng.random(RECORDS) < 0.1, rng.integers(0, LABELS, RECORDS), clean)  # label noise
    production = np.where(rng.random(RECORDS) < 0.85, clean, rng.integers(0, LABELS, RECORDS))
    return rng, clean, noisy, production


def _retrained(rng, clean, production):
    """A model as good as production that differs from it on a random 15% of the records,
    where it is right as often as production is overall."""
    churn = rng.random(RECORDS) < 0.15
    fresh = np.where(rng.random(RECORDS) < 0.85, clean, rng.integers(0, LABELS, RECORDS))
    return np.where(churn, fresh, production)


def _worse(rng, clean, equal, points: int):
    """``equal``, wrong on ``points`` percent more of the records (ones it had right)."""
    right = np.flatnonzero(equal == clean)
    lost = rng.choice(right, size=RECORDS * points // 100, replace=False)
    out = equal.copy()
    out[lost] = (clean[lost] + 1) % LABELS
    return out


def _evaluation(predicted: np.ndarray, truth: np.ndarray) -> tuple[dict, dict]:
    """A model's report figures and its per-record table, as the trainer writes them."""
    report = {"accuracy": float(np.mean(predicted == truth)), "confusion": {"labels": ["a", "b", "c"]}}
    table = {"predicted": predicted.astype(float).tolist(), "truth": truth.astype(float).tolist()}
    return report, table


def _gate(candidate_predictions, production_predictions, truth, checks=(CHECK,)):
    candidate, ours = _evaluation(candidate_predictions, truth)
    production, theirs = _evaluation(production_predictions, truth)
    return decide(list(checks), candidate, production, 3, paired={"candidate": ours, "baseline": theirs})


def test_an_equal_candidate_passes_and_one_10_points_worse_is_rejected_in_every_seed():
    raw = {**CHECK, "name": "raw"}
    raw.pop("confidence")
    equal_rejected, raw_flaps, worse_passed = [], [], []
    for seed in range(20):
        rng, clean, noisy, production = _labelled(seed)
        equal = _retrained(rng, clean, production)
        decision = _gate(equal, production, noisy, (CHECK, raw))
        bootstrap, totals = decision["checks"]
        if not bootstrap["passed"]:
            equal_rejected.append(seed)
        if not totals["passed"]:
            raw_flaps.append(seed)
        worse = _gate(_worse(rng, clean, equal, 10), production, noisy)["checks"][0]
        if worse["passed"]:
            worse_passed.append(seed)
    assert equal_rejected == [] and worse_passed == []
    assert raw_flaps  # the same candidates, compared as totals: noise rejects some of them


def test_the_same_inputs_give_the_same_interval_and_decision():
    rng, clean, noisy, production = _labelled(7)
    equal = _retrained(rng, clean, production)
    first, second = _gate(equal, production, noisy), _gate(equal, production, noisy)
    assert first == second
    check = first["checks"][0]
    assert check["confidence"] == 0.95 and check["interval"][0] < 0 < check["interval"][1]
    assert "paired bootstrap over 200 records: candidate - production" in check["note"]
    assert "95% interval [" in check["note"] and check["expected"].endswith(
        "unless the 95% interval reaches it"
    )


def test_each_metric_is_resampled_from_the_figures_it_is_computed_from():
    rng = np.random.default_rng(1)
    ours = {
        "loss_sum": (rng.random(50) * 10).tolist(),
        "loss_tokens": rng.integers(1, 9, 50).astype(float).tolist(),
    }
    theirs = {"loss_sum": [v + 1.0 for v in ours["loss_sum"]], "loss_tokens": ours["loss_tokens"]}
    interval = paired_interval("eval_loss", ours, theirs, 0.9)
    tokens = sum(ours["loss_tokens"])
    assert interval.difference == pytest.approx(-50 / tokens) and interval.records == 50
    assert interval.low <= interval.difference <= interval.high < 0
    # macro F1 over the label set, as the evaluation computes it (a label never seen counts 0)
    truth = np.array([0, 0, 1, 1, 2, 2], dtype=float)
    mine = {"predicted": [0, 0, 1, 1, 2, 2], "truth": truth.tolist()}
    other = {"predicted": [0, 0, 1, 1, 1, 1], "truth": truth.tolist()}
    f1 = paired_interval("f1_macro", mine, other, 0.9, labels=4)
    assert f1.difference == pytest.approx(3 / 4 - (1 + 2 / 3 + 0) / 4)
    # a record one model did not score is left out of both
    exact = paired_interval("exact_match", {"exact": [1, 0, None, 1]}, {"exact": [1, None, 0, 0]}, 0.9)
    assert exact.records == 2 and exact.difference == pytest.approx(0.5)


def test_without_per_record_figures_the_totals_decide_and_the_note_says_so():
    check = decide([CHECK], {"accuracy": 0.80}, {"accuracy": 0.85}, 2)["checks"][0]
    assert check["passed"] is False and "interval" not in check
    assert (
        "compared the totals, without the 95% interval: the evaluation kept no per-record figures"
        in check["note"]
    )


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ({**CHECK, "metric": "auroc"}, r"asks for confidence on auroc, which has no per-record figures"),
        ({**CHECK, "confidence": 1.5}, r"needs field 'confidence' in \(0.5, 1\), e.g. 0.95, got 1.5"),
        ({**CHECK, "confidence": "high"}, r"confidence"),
    ],
)
def test_a_confidence_the_gate_cannot_resample_is_refused_when_the_dag_is_parsed(check, message):
    from trainops.gate.errors import GateConfigError

    with pytest.raises(GateConfigError, match=message):
        validate_checks([check])
