"""The optimizer's parameter groups and the warmup + cosine LR schedule."""

import pytest

from trainer.optim import lr_multiplier


def test_lr_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    kw = {"warmup_steps": 4, "max_steps": 14, "min_lr_ratio": 0.1}
    assert [lr_multiplier(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_multiplier(4, **kw) == 1.0
    assert lr_multiplier(9, **kw) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_multiplier(14, **kw) == pytest.approx(0.1)
    assert lr_multiplier(20, **kw) == pytest.approx(0.1)
    assert lr_multiplier(0, warmup_steps=0, max_steps=10, min_lr_ratio=0.0) == 1.0


def test_weight_decay_applies_to_matrices_only_and_the_schedule_scales_the_peak_lr():
    from trainer.models.llama import Transformer
    from trainer.optim import build_optimizer, build_scheduler
    from trainer.presets import PRESETS

    model = Transformer(PRESETS["tiny"].with_vocab(97))
    optimizer = build_optimizer(model, lr=0.01, weight_decay=0.1)
    decay, no_decay = optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    # One fused kernel per step on CPU too: foreach AdamW took 2.7x its time (bench/profile_step.py).
    assert optimizer.defaults["fused"]

    kw = {"warmup_steps": 4, "max_steps": 14, "min_lr_ratio": 0.1}
    scheduler = build_scheduler(optimizer, **kw)
    lrs = []
    for _ in range(6):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.01 * lr_multiplier(s, **kw) for s in range(6)])
