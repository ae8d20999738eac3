"""One optimizer step, in two halves the loop calls in turn: accumulate gradients, apply them;
and the steps' losses, kept on the device until the loop reads them (:class:`StepLosses`).

Kept apart from the loop so that the gradient-correctness check (tests/trainer/grad_probe.py)
runs exactly the code that trains. Nothing here reads a value from the device: on a GPU the
host issues the work and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from trainer import parallel
from trainer.contract import IGNORE_INDEX

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.optim.lr_scheduler import LRScheduler


def forward_backward(
    model: nn.Module,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    accum_steps: int,
    scaler: ShardedGradScaler | None = None,
    skip_grad_sync: bool = False,
    masked: bool = False,
) -> torch.Tensor:
    """Backward every micro-batch of one step; the step's mean loss on this rank (a 0-d tensor).

    Each micro-batch's loss is divided by ``accum_steps`` and FSDP averages over ranks, so the
    gradients are those of the mean loss over the global batch. With ``skip_grad_sync`` only the
    last micro-step reduce-scatters; the earlier ones accumulate unsharded gradients locally.

    :param masked: the targets hold ``IGNORE_INDEX`` where a position carries no loss (a prompt's
        tokens, padding): a micro-batch's loss is then the mean over its other positions, and 0
        for a micro-batch that has none (no host sync to find out: the count is clamped to 1).
    """
    loss_sum: torch.Tensor | None = None
    for micro, (inputs, targets) in enumerate(micro_batches):
        if skip_grad_sync:
            parallel.set_gradient_sync(model, micro == accum_steps - 1)
        # (batch, seq, vocab) next-token logits or a classifier's (batch, labels): one row per target
        logits = model(inputs).float()
        rows, flat = logits.reshape(-1, logits.shape[-1]), targets.flatten()
        if masked:
            counted = (flat != IGNORE_INDEX).sum().clamp(min=1)
            loss = F.cross_entropy(rows, flat, reduction="sum") / counted / accum_steps
        else:
            loss = F.cross_entropy(rows, flat) / accum_steps
        (scaler.scale(loss) if scaler is not None else loss).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    if skip_grad_sync:
        parallel.set_gradient_sync(model, True)
    if loss_sum is None:
        raise ValueError(
            f"a step needs at least one micro-batch; got none for {accum_steps} accumulation steps"
        )
    return loss_sum


def unscale(optimizer: torch.optim.Optimizer, scaler: ShardedGradScaler | None) -> None:
    """fp16: divide the gradients by the loss scale (before clipping or reading them)."""
    if scaler is not None:
        scaler.unscale_(optimizer)


def apply_gradients(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    scaler: ShardedGradScaler | None,
    grad_clip: float,
) -> torch.Tensor | None:
    """Clip, step (the fp16 scaler skips steps with inf/NaN gradients), advance the LR, zero.

    Returns the gradients' total norm before clipping, a 0-d tensor on the device, the same on
    every rank, not read yet (reading it waits for the device): a non-finite one means this
    update poisoned the weights (``trainer.runtime.bad_loss``). None under the fp16 scaler, whose
    inf/NaN gradients are its own business: it skips those steps.
    """
    unscale(optimizer, scaler)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        return None
    full = getattr(norm, "full_tensor", None)  # FSDP: a DTensor, replicated (no communication)
    return (full() if full is not None else norm).detach()


def read_losses(
    losses: list[torch.Tensor], sum_over_ranks: Callable[[torch.Tensor], torch.Tensor], world_size: int
) -> list[float]:
    """The mean over the ranks of each step's loss (0-d tensors on the device, as
    :func:`forward_backward` returns them), in one collective and one wait for the device.

    Reading a value to the host waits for all the work issued before it, so the loop keeps the
    losses on the device and reads several steps' at once (every ``train.log_every`` steps).

    :param sum_over_ranks: sums a tensor over the ranks in place (``parallel.sum_over_ranks``).
    """
    if not losses:
        return []
    # float64 before the sum, as the loss always was summed: the mean's rounding stays the same
    summed = sum_over_ranks(torch.stack(losses).double())
    return (summed / world_size).tolist()
