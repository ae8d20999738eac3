"""The loop's state records (``trainer.runtime.training``): a step's result is fixed once made
but takes more figures for its metrics record, and each ``Training`` gets its own bad-loss
watch, save cadence, heartbeat and rollbacks unless setup passes them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.runtime.heartbeat import NoHeartbeat
from trainer.runtime.training import StepResult, Training


def test_a_step_result_is_fixed_but_takes_more_figures_for_its_record():
    result = StepResult(1, torch.tensor(2.5), 1e-3, 0.0, 0.0, 0.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.step = 2
    result.extra["checkpoint_blocked_s"] = 0.5  # the loop adds a save's figures after the step
    other = StepResult(2, torch.tensor(2.0), 1e-3, 0.0, 0.0, 0.0, 0.0)
    assert other.extra == {} and other.grad_norm is None  # each its own; no norm: fp16's scaler


def test_each_training_gets_its_own_loss_watch_cadence_heartbeat_and_rollbacks():
    first, second = (Training(*[None] * 16, flops_per_token=1.0, device_peak=None) for _ in range(2))
    first.rollbacks.append(None)
    assert second.rollbacks == []
    assert first.loss_watch is not second.loss_watch and first.loss_watch.spike_factor == 0.0  # no spikes
    assert first.cadence is not second.cadence
    assert [s for s in range(1, 60) if first.cadence.due(s)] == [25, 50]  # every 25 steps
    assert isinstance(first.pulse, NoHeartbeat)
