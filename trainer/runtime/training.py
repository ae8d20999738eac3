"""The training loop's state records: :class:`Training`, everything the loop needs, as
``trainer.train.setup`` built it, and :class:`StepResult`, what one step did.

They live apart from the loop (``trainer.train``) so that the modules it calls (the bad-loss
rollback, the step records, the ending) take a :class:`Training` without importing the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainer import data, parallel
from trainer.checkpoint.cadence import Cadence
from trainer.checkpoint.save import Checkpointer
from trainer.config import Config
from trainer.models.builder import BuiltModel
from trainer.records import RecordBatches
from trainer.runtime import heartbeat
from trainer.runtime.attempts import Attempt
from trainer.runtime.bad_loss import LossWatch, Rollback
from trainer.runtime.metrics import MetricsLog
from trainer.state import TrainState

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.optim.lr_scheduler import LRScheduler


@dataclass
class Training:
    """Everything the loop needs, as ``trainer.train.setup`` built it."""

    config: Config
    env: parallel.DistEnv
    attempt: Attempt
    built: BuiltModel
    model: nn.Module  # ``built.model``, parallelized
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    scaler: ShardedGradScaler | None  # fp16 only
    batches: data.TrainBatches | RecordBatches
    feed: data.DeviceFeed  # ``batches`` on the device, one micro-batch ahead
    host_group: dist.ProcessGroup  # gloo, for the stop flag (``parallel.host_group``)
    accum: int  # micro-steps per optimizer step on this world size
    global_batch: int  # samples per optimizer step, all ranks together
    state: TrainState
    checkpointer: Checkpointer
    metrics: MetricsLog | None  # rank 0's; the other ranks neither log nor write the record
    flops_per_token: float
    device_peak: float | None  # peak FLOP/s of one device; None where unknown (no MFU)
    loss_watch: LossWatch = field(default_factory=LossWatch)  # which loss is bad (bad-loss recovery)
    cadence: Cadence = field(default_factory=lambda: Cadence(25, 0, 3600.0))  # which steps save
    # rank 0's heartbeat writer (the loop's; the other ranks' does nothing): marks long operations
    pulse: heartbeat.HeartbeatWriter | heartbeat.NoHeartbeat = field(default_factory=heartbeat.NoHeartbeat)
    rollbacks: list[Rollback] = field(default_factory=list)  # this attempt's, oldest first


@dataclass(frozen=True)
class StepResult:
    step: int  # the step done (1-based)
    loss: torch.Tensor  # this rank's mean loss of the step: 0-d, on the device, not read yet
    lr: float  # the learning rate the step used
    stop_votes: float  # how many ranks were signalled before the step began (the same on every rank)
    save_votes: float  # how many ranks had an advisory notice ask for a checkpoint (ditto)
    started: float  # monotonic seconds when the step began
    time: float  # wall-clock seconds when the host had issued the whole step
    extra: dict[str, float] = field(default_factory=dict)  # more figures for the step's metrics record
    # the gradients' total norm (0-d, on the device, the same on every rank; None under fp16's scaler)
    grad_norm: torch.Tensor | None = None
