"""Rank 0's record of the steps whose losses were read: one metrics record per step and the
progress line (``trainer.runtime.progress``), with tokens/s and MFU over the steps read together.
The loop (``trainer.train``) calls it at each read, the bad-loss read
(``trainer.runtime.rollback``) for the good steps before a bad one."""

from __future__ import annotations

import time

import torch

from trainer.flops import mfu
from trainer.runtime.metrics import MetricsLog
from trainer.runtime.progress import progress_line
from trainer.runtime.training import StepResult, Training


def log_steps(
    tr: Training,
    metrics: MetricsLog,
    steps: list[StepResult],
    losses: list[float],
    started: float,
    first_step: int,
    print_line: bool,
) -> None:
    """Rank 0: each step's metrics record, and the progress line of the last one when
    ``print_line``. Tokens/s and MFU are over the steps read together (from the first one's
    start to now, after the read waited for the device): what one step took is not known on
    the host without a wait. The time the loop was held by async checkpoints
    (``checkpoint_blocked_s`` of a step's record, the wait for a previous save included) is
    left out."""
    t, last, now = tr.config.train, steps[-1], time.monotonic()
    blocked = sum(float(r.extra.get("checkpoint_blocked_s", 0.0)) for r in steps)
    elapsed = now - steps[0].started - blocked
    tokens_per_s = len(steps) * tr.global_batch * t.seq_len / max(elapsed, 1e-9)
    all_devices_peak = tr.device_peak * tr.env.world_size if tr.device_peak else None
    step_mfu = mfu(tokens_per_s, tr.flops_per_token, all_devices_peak)
    peak_mem = torch.cuda.max_memory_allocated(tr.env.device) / 2**30 if torch.cuda.is_available() else None
    for result, loss in zip(steps, losses, strict=True):
        metrics.add(
            step=result.step,
            loss=loss,
            lr=result.lr,
            tokens_per_s=tokens_per_s,
            time=result.time,
            **({"mfu": step_mfu} if step_mfu is not None else {}),
            **({"peak_mem_gib": peak_mem} if peak_mem is not None else {}),
            flush=False,
            **result.extra,
        )
    if metrics.due:  # the steps read together make one part
        with tr.pulse.busy("metrics flush"):  # a flush riding out a storage blip is no hang
            metrics.flush_if_due()
    if print_line:
        line = progress_line(
            last.step,
            t.max_steps,
            losses[-1],
            last.lr,
            tokens_per_s,
            now - started,
            last.step - first_step,
            mfu=step_mfu,
            peak_mem_gib=peak_mem,
        )
        print(line, flush=True)
