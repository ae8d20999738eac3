"""AdamW with decoupled weight decay on matrices only, and the warmup + cosine LR schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

# Devices with torch's fused AdamW kernel: one pass over each parameter, its gradient and both
# moments. The default elsewhere (foreach) makes about ten passes; on a CPU, bf16 ``small``,
# it took 2.7x the fused step's time, a quarter of the whole step (bench/profile_step.py).
FUSED_DEVICES = frozenset({"cuda", "cpu"})


def lr_multiplier(step: int, *, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Factor on the peak LR for optimizer step ``step`` (0-based).

    Linear warmup to 1 over ``warmup_steps`` steps, then a cosine down to ``min_lr_ratio``
    at ``max_steps``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # Norm gains (1-D) are not decayed: shrinking them towards 0 only fights the normalization.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    params = decay + no_decay
    fused = bool(params) and all(p.device.type in FUSED_DEVICES for p in params)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=fused or None)
    if fused:
        # fp16: FSDP's ShardedGradScaler would hand the fused kernel its inf flag, shaped [1]
        # against the kernel's 0-d step counters ("output with shape [] doesn't match the
        # broadcast shape [1]"). The trainer unscales before clipping anyway, so the scaler
        # takes its plain path instead: it skips a step with inf/NaN gradients itself.
        optimizer._step_supports_amp_scaling = False
    return optimizer


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, max_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule of :func:`lr_multiplier` on the optimizer's peak LR, stepped once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step, warmup_steps=warmup_steps, max_steps=max_steps, min_lr_ratio=min_lr_ratio
        ),
    )
