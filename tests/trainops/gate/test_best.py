"""Picking a run's best scored checkpoint by a named metric, in its direction."""

import pytest

from trainops.gate.best import CheckpointScore, pick_best
from trainops.gate.errors import GateConfigError
from trainops.gate.metrics import HIGHER, LOWER


def scored(step, **figures):
    return CheckpointScore(step, figures, f"file:///run/eval/checkpoints/step_{step:08d}/export")


def test_the_best_by_a_lower_is_better_metric_may_be_an_earlier_checkpoint():
    pick = pick_best(
        [scored(30, eval_loss=2.4), scored(60, eval_loss=2.1), scored(90, eval_loss=2.3)], "eval_loss", LOWER
    )
    assert (pick.step, pick.value, pick.last_step) == (60, 2.1, 90)
    assert pick.export_uri.endswith("step_00000060/export")
    assert pick.why == (
        "step 60 has the best eval_loss (2.1; lower is better) of 3 scored checkpoints "
        "(step 30 2.4, step 60 2.1, step 90 2.3): not the last (step 90)"
    )


def test_a_higher_is_better_team_metric_picks_the_highest_and_a_tie_goes_to_the_later_step():
    scores = [
        CheckpointScore(30, {"user_metrics": {"recall": "team:recall"}, "recall": 0.7}, "u30"),
        CheckpointScore(60, {"recall": 0.8}, "u60"),
        CheckpointScore(90, {"recall": 0.8}, "u90"),
    ]
    assert pick_best(scores, "recall", HIGHER).step == 90


def test_skipped_checkpoints_are_listed_but_never_picked():
    pick = pick_best(
        [
            CheckpointScore(30, None, None, skipped="deleted before it could be scored"),
            scored(60, accuracy=0.5),
        ],
        "accuracy",
        HIGHER,
    )
    assert pick.step == 60
    assert pick.document()["checkpoints"] == [
        {"step": 30, "value": None, "skipped": "deleted before it could be scored"},
        {"step": 60, "value": 0.5},
    ]


def test_nothing_to_pick_from_or_a_missing_metric_is_said_plainly():
    with pytest.raises(GateConfigError, match=r"no checkpoint of the run was scored \(step 30: gone\)"):
        pick_best([CheckpointScore(30, None, None, skipped="gone")], "eval_loss", LOWER)
    with pytest.raises(
        GateConfigError,
        match=r"checkpoint step 30 has no finite accuracy \(None\): accuracy is reported for classification only",
    ):
        pick_best([scored(30, eval_loss=2.0)], "accuracy", HIGHER)
    with pytest.raises(GateConfigError, match=r"checkpoint step 30 has no finite eval_loss \(nan\)"):
        pick_best([scored(30, eval_loss=float("nan"))], "eval_loss", LOWER)
