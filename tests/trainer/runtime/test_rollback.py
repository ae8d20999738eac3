"""The loop's bad-loss path: the read that finds the first bad step among those read together,
and the rollback that refuses when nothing was committed (``trainer.runtime.rollback``)."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
import torch

from tests.trainer.helpers import metrics_of
from tests.trainer.test_train import start
from trainer.contract import RunLayout
from trainer.runtime.attempts import NonFiniteLoss
from trainer.runtime.bad_loss import BadLoss, LossWatch
from trainer.runtime.heartbeat import NoHeartbeat
from trainer.runtime.metrics import MetricsLog
from trainer.runtime.preemption import StopFlag
from trainer.runtime.rollback import read_step_losses
from trainer.runtime.training import StepResult
from trainer.storage import open_storage
from trainer.train import train_loop


def steps_of(env, losses: list[float], grad_norms: list[float] | None = None) -> list[StepResult]:
    """Steps 1, 2, ... with these losses (and gradient norms) on the device, as ``train_step``
    returns them."""
    now = time.monotonic()
    return [
        StepResult(
            i + 1,
            torch.tensor(loss, device=env.device),
            1e-3,
            0.0,
            0.0,
            now,
            time.time(),
            grad_norm=None if grad_norms is None else torch.tensor(grad_norms[i], device=env.device),
        )
        for i, loss in enumerate(losses)
    ]


def reading(env, run_dir, metrics: bool = True) -> SimpleNamespace:
    """What :func:`read_step_losses` reads of a ``Training`` (and ``log_steps`` of the good steps)."""
    run_uri = run_dir.as_uri()
    return SimpleNamespace(
        env=env,
        loss_watch=LossWatch(),
        metrics=MetricsLog(open_storage(run_uri), RunLayout(run_uri).metrics, 1, 1) if metrics else None,
        state=SimpleNamespace(step=3),
        config=SimpleNamespace(train=SimpleNamespace(seq_len=16, max_steps=10)),
        global_batch=4,
        device_peak=None,
        flops_per_token=1.0,
        pulse=NoHeartbeat(),
    )


def test_good_losses_are_read_as_the_mean_over_the_ranks(world_of_one, tmp_path):
    tr = reading(world_of_one, tmp_path / "run")
    losses = read_step_losses(tr, steps_of(world_of_one, [2.5, 2.25, 2.0], grad_norms=[1.0, 1.0, 1.0]))
    assert losses == [2.5, 2.25, 2.0]  # a world of one: each rank's own
    assert list(tr.loss_watch.recent) == [2.5, 2.25, 2.0]  # they join the history
    assert (tr.metrics.unwritten, tr.metrics.parts_written) == (0, 0)  # the loop logs them, not the read


def test_the_first_bad_step_is_named_after_the_good_ones_before_it_are_logged(world_of_one, tmp_path):
    tr = reading(world_of_one, tmp_path / "run")
    bad = read_step_losses(tr, steps_of(world_of_one, [2.5, 2.25, float("nan"), float("nan")]))
    assert isinstance(bad, BadLoss) and (bad.step, bad.why) == (3, "non-finite loss nan")
    assert sorted(metrics_of(tmp_path / "run")) == [1, 2]  # flush_every=1: written at once


def test_a_finite_loss_with_a_non_finite_gradient_norm_is_bad(world_of_one, tmp_path):
    tr = reading(world_of_one, tmp_path / "run", metrics=False)
    bad = read_step_losses(tr, steps_of(world_of_one, [2.5, 2.25], grad_norms=[1.0, math.inf]))
    assert isinstance(bad, BadLoss) and bad.step == 2 and math.isfinite(bad.loss)
    assert bad.why == "non-finite gradient norm inf (loss 2.25)"


@pytest.mark.slow
def test_a_non_finite_loss_is_caught_at_the_next_read_naming_its_first_step(
    world_of_one, tmp_path, dataset_uri
):
    training, attempt = start(
        tmp_path,
        dataset_uri,
        world_of_one,
        1,
        "train.max_steps=6",
        "train.log_every=4",
        "checkpoint.every_steps=100",
        "train.lr=1e30",
        "train.warmup_steps=0",
        "train.grad_clip=1e30",
    )
    # step 2's gradients are NaN (its loss is not yet): its update blows the weights up. Read
    # with the losses at step 4, the gradient norm names step 2, before step 3's NaN loss.
    nothing = (
        r"non-finite gradient norm nan \(loss [\d.]+\) at step 2, before any checkpoint was committed: "
        "nothing to roll back to"
    )
    with pytest.raises(NonFiniteLoss, match=f"^{nothing}") as caught:
        train_loop(training, StopFlag())
    assert (caught.value.step, training.state.step, attempt.last_step) == (2, 4, 4)
    training.metrics.flush(final=True)
    assert sorted(metrics_of(tmp_path / "run")) == [1]  # the step before it is logged
