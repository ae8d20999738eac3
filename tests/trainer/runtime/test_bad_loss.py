"""Bad-loss recovery's decisions: which loss is bad, where to roll back, and when not to."""

import math

import pytest

from trainer.runtime.bad_loss import MIN_HISTORY, BadLoss, BudgetSpent, LossWatch, Rollback, plan_rollback

HINT = "lower train.lr"


def test_the_first_non_finite_loss_is_bad_and_the_good_ones_before_it_are_kept():
    watch = LossWatch()
    assert watch.check([1, 2], [2.5, 2.4]) is None
    bad = watch.check([3, 4, 5], [2.3, math.nan, math.inf])
    assert bad == BadLoss(4, bad.loss, "non-finite loss nan") and math.isnan(bad.loss)
    assert list(watch.recent) == [2.5, 2.4, 2.3]


def test_a_finite_loss_with_a_non_finite_gradient_norm_is_bad_its_update_poisoned_the_weights():
    watch = LossWatch()
    assert watch.check([1, 2], [2.5, 2.4], [0.9, 1.1]) is None
    assert watch.check([3, 4], [2.3, 2.2], [0.8, math.inf]) == BadLoss(
        4, 2.2, "non-finite gradient norm inf (loss 2.2)"
    )
    assert list(watch.recent) == [2.5, 2.4, 2.3]
    assert LossWatch().check([5], [2.1], None) is None  # fp16: the scaler's business, not known


def test_a_spike_needs_the_factor_and_enough_history():
    watch = LossWatch(spike_factor=3.0)
    assert watch.check([1], [50.0]) is None  # the first losses are high: no history yet
    steps = list(range(2, 2 + MIN_HISTORY))
    assert watch.check(steps, [2.0] * MIN_HISTORY) is None
    assert watch.check([100], [5.9]) is None  # under 3 x the median (2.0)
    spike = watch.check([101], [6.5])
    assert spike is not None and spike.why == "loss spike 6.5 > 3 x recent median 2"
    assert (
        LossWatch().check(steps, [2.0] * MIN_HISTORY) is None and LossWatch().check([9], [1e6]) is None
    )  # off


def test_a_rollback_goes_to_the_newest_checkpoint_and_skips_the_steps_since():
    bad = BadLoss(57, math.nan, "non-finite loss nan")
    rollback = plan_rollback(bad, committed=50, current=60, done=[], budget=3, hint=HINT)
    assert (rollback.to_step, rollback.skipped_from, rollback.skipped_to) == (50, 51, 60)
    assert rollback.record() == {
        "at_step": 57,
        "loss": "nan",
        "why": "non-finite loss nan",
        "to_step": 50,
        "skipped_from": 51,
        "skipped_to": 60,
        "restore_s": 0.0,  # set once the load is done (trainer.runtime.rollback.roll_back)
    }
    assert (
        rollback.describe() == "non-finite loss nan at step 57: rolled back to step 50, skipping steps 51-60"
    )


def test_past_the_budget_the_failure_names_every_rolled_back_step():
    first = Rollback(BadLoss(57, math.nan, "non-finite loss nan"), 50, 51, 60)
    again = BadLoss(63, math.inf, "non-finite loss inf")
    with pytest.raises(BudgetSpent) as spent:
        plan_rollback(again, committed=50, current=70, done=[first], budget=1, hint=HINT)
    assert str(spent.value) == (
        "non-finite loss inf at step 63 (after 1 rollback(s): non-finite loss nan at step 57: rolled back to "
        "step 50, skipping steps 51-60): train.rollback_budget=1 is spent; lower train.lr"
    )
    with pytest.raises(BudgetSpent, match=r"train\.rollback_budget=0 is spent"):
        plan_rollback(again, committed=50, current=70, done=[], budget=0, hint=HINT)


def test_with_no_checkpoint_there_is_nothing_to_roll_back_to():
    with pytest.raises(BudgetSpent, match="before any checkpoint was committed: nothing to roll back to"):
        plan_rollback(
            BadLoss(3, math.nan, "non-finite loss nan"),
            committed=None,
            current=4,
            done=[],
            budget=3,
            hint=HINT,
        )


def test_a_checkpoint_that_is_bad_at_once_after_a_rollback_is_not_rolled_back_to_again():
    first = Rollback(BadLoss(12, math.nan, "non-finite loss nan"), 10, 11, 15)
    with pytest.raises(BudgetSpent, match="step 16, the first step after rolling back to step 10") as spent:
        plan_rollback(
            BadLoss(16, math.nan, "non-finite loss nan"),
            committed=10,
            current=20,
            done=[first],
            budget=3,
            hint=HINT,
        )
    assert "that checkpoint's weights are already bad" in str(spent.value)
    # a bad loss later on, or after a newer checkpoint, is another window: rolled back again
    assert (
        plan_rollback(
            BadLoss(19, math.nan, "x"), committed=10, current=20, done=[first], budget=3, hint=HINT
        ).to_step
        == 10
    )
    assert (
        plan_rollback(
            BadLoss(16, math.nan, "x"), committed=15, current=20, done=[first], budget=3, hint=HINT
        ).to_step
        == 15
    )
