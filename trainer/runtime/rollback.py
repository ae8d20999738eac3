"""The loop's bad-loss path, on every rank: read the losses of the steps done since the last
read and find the first bad one (:func:`read_step_losses`), then restore the newest committed
checkpoint and skip the steps since (:func:`roll_back`). ``trainer.runtime.bad_loss`` decides
which loss is bad and whether a rollback may go on; this module acts."""

from __future__ import annotations

import logging
import time

import torch

from trainer import parallel
from trainer.runtime.attempts import NON_FINITE_HINT, NonFiniteLoss
from trainer.runtime.bad_loss import BadLoss, BudgetSpent, Rollback, plan_rollback
from trainer.runtime.step_log import log_steps
from trainer.runtime.training import StepResult, Training
from trainer.step import read_losses

log = logging.getLogger("trainer.train")  # the loop's logger: these are its lines


def read_step_losses(tr: Training, steps: list[StepResult]) -> list[float] | BadLoss:
    """Every rank: the mean loss over the ranks of each of ``steps`` (one collective), or the
    first bad one (non-finite, or a spike: ``tr.loss_watch``), on every rank alike, after rank
    0 logged the steps before it."""
    losses = read_losses([r.loss for r in steps], parallel.sum_over_ranks, tr.env.world_size)
    norms = [r.grad_norm for r in steps if r.grad_norm is not None]
    # the same on every rank already (clip_grad_norm_ reduced them): no collective, one read
    grad_norms = torch.stack(norms).tolist() if norms and len(norms) == len(steps) else None
    bad = tr.loss_watch.check([r.step for r in steps], losses, grad_norms)
    if bad is None:
        return losses
    good = [r.step for r in steps].index(bad.step)
    if tr.metrics is not None and good:
        log_steps(tr, tr.metrics, steps[:good], losses[:good], time.monotonic(), tr.state.step, False)
    return bad


def roll_back(tr: Training, bad: BadLoss) -> None:
    """Every rank: restore the newest committed checkpoint (its steps' losses were read finite
    before it was saved) and go on from the current step, skipping the steps trained since
    (``trainer.runtime.bad_loss``): the step counter, the schedule and the data cursor stay
    where they are, the weights and optimizer state go back. Recorded in the attempt record's
    ``rollbacks``. Raises :class:`NonFiniteLoss` naming every rollback when the budget
    (``train.rollback_budget``) is spent or nothing was committed yet."""
    state, budget = tr.state, tr.config.train.rollback_budget
    tr.checkpointer.wait()  # a save in flight is of steps read good: let it commit first
    try:
        plan_rollback(
            bad,
            committed=tr.checkpointer.last_committed,
            current=state.step,
            done=tr.rollbacks,
            budget=budget,
            hint=NON_FINITE_HINT,
        )
    except BudgetSpent as exc:
        raise NonFiniteLoss(bad.step, bad.loss, str(exc)) from None
    step, cursor, loading = state.step, state.cursor, time.monotonic()
    restored = tr.checkpointer.load_latest()
    if restored is None:  # committed, yet nothing to load: the load would have raised
        raise NonFiniteLoss(
            bad.step, bad.loss, f"{bad.why} at step {bad.step}: no checkpoint could be loaded"
        )
    for _ in range(step - state.step):  # the schedule as it was at the current step
        tr.scheduler.step()
    state.step, state.cursor = step, cursor
    took = round(time.monotonic() - loading, 3)
    rollback = Rollback(bad, restored, restored + 1, step, took, tr.checkpointer.restore_files)
    tr.rollbacks.append(rollback)
    tr.attempt.rollbacks = [r.record() for r in tr.rollbacks]
    if tr.env.is_main:
        log.warning(
            "bad loss: %s (rollback %d of at most %d)", rollback.describe(), len(tr.rollbacks), budget
        )
