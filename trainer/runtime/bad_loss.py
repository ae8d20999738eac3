"""Bad-loss recovery: a non-finite loss, or a spike, rolls the run back instead of ending it.

A NaN or a loss spike is usually one bad batch window meeting the weights at a bad moment
(MegaScale; PaLM restarted ~100 steps before a spike and skipped the 200 to 500 batches around
it). Replaying the same batches from the same weights would meet it again, so the trainer
restores the newest committed checkpoint (step ``c``: every committed checkpoint is of steps
whose losses and gradient norms were read finite, because they are read before each save) and
skips the steps it trained since, ``c + 1`` to the current one, the window that led to the bad loss. The step
counter, the schedule and the data cursor go on from the current step; the run ends at
``train.max_steps`` with that many fewer optimizer updates, and the record says which steps were
skipped.

Settings (``train``): ``rollback_budget`` rollbacks per attempt (0: off, a bad loss fails the
attempt as before) and ``loss_spike_factor`` (0: off; else a loss above that factor times the
median of the last :data:`WINDOW` losses is a spike, once :data:`MIN_HISTORY` are known). Past
the budget, the attempt fails naming every rolled-back step.

The decisions here are pure; the trainer's loop does the restore (``trainer.runtime.rollback``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 100  # the spike rule's median is over this many recent losses
MIN_HISTORY = 20  # ... and needs at least this many (the first steps' losses fall fast)


@dataclass(frozen=True)
class BadLoss:
    """The first step whose loss was bad, the loss, and why it is bad, in words."""

    step: int
    loss: float
    why: str


@dataclass(frozen=True)
class Rollback:
    """One rollback: ``bad`` seen, weights restored to ``to_step``'s checkpoint, steps
    ``skipped_from`` to ``skipped_to`` (both included) skipped; the load took ``restore_s``
    seconds and read ``restore_files`` (``{"local": n, "storage": m}``: from the node-local tier
    and from storage; None: not known)."""

    bad: BadLoss
    to_step: int
    skipped_from: int
    skipped_to: int
    restore_s: float = 0.0
    restore_files: dict[str, int] | None = None

    def record(self) -> dict[str, object]:
        """The attempt record's entry (``rollbacks``; JSON: a NaN is written as its text)."""
        return {
            "at_step": self.bad.step,
            "loss": self.bad.loss if math.isfinite(self.bad.loss) else str(self.bad.loss),
            "why": self.bad.why,
            "to_step": self.to_step,
            "skipped_from": self.skipped_from,
            "skipped_to": self.skipped_to,
            "restore_s": self.restore_s,  # the cost accounting's restore
            **({"restore_files": self.restore_files} if self.restore_files is not None else {}),
        }

    def describe(self) -> str:
        return (
            f"{self.bad.why} at step {self.bad.step}: rolled back to step {self.to_step}, "
            f"skipping steps {self.skipped_from}-{self.skipped_to}"
        )


class LossWatch:
    """The recent losses, and which of new ones is bad.

    :param spike_factor: a loss above this times the recent median is a spike (0: off).
    """

    def __init__(self, spike_factor: float = 0.0):
        self.spike_factor = spike_factor
        self.recent: deque[float] = deque(maxlen=WINDOW)

    def check(
        self, steps: Sequence[int], losses: Sequence[float], grad_norms: Sequence[float] | None = None
    ) -> BadLoss | None:
        """The first bad one of ``losses`` (of ``steps``), None when all are good; the good ones
        before it join the history.

        :param grad_norms: each step's gradient norm (None: not known, fp16's scaler). A finite
            loss with a non-finite norm is bad too: that step's update made the weights NaN, and
            they must not be saved (the check comes before a save of the step).
        """
        norms = grad_norms if grad_norms is not None else [0.0] * len(steps)
        for step, loss, norm in zip(steps, losses, norms, strict=True):
            if not math.isfinite(loss):
                return BadLoss(step, loss, f"non-finite loss {loss}")
            if not math.isfinite(norm):
                return BadLoss(step, loss, f"non-finite gradient norm {norm} (loss {loss:.4g})")
            if self.spike_factor > 0 and len(self.recent) >= MIN_HISTORY:
                median = statistics.median(self.recent)
                if median > 0 and loss > self.spike_factor * median:
                    return BadLoss(
                        step,
                        loss,
                        f"loss spike {loss:.4g} > {self.spike_factor:g} x recent median {median:.4g}",
                    )
            self.recent.append(loss)
        return None


class BudgetSpent(RuntimeError):
    """A bad loss that no rollback may cure: the budget is spent, or there is nothing to roll
    back to. The message names the step, the loss and every earlier rollback."""

    def __init__(self, message: str, bad: BadLoss):
        super().__init__(message)
        self.bad = bad


def plan_rollback(
    bad: BadLoss, *, committed: int | None, current: int, done: Sequence[Rollback], budget: int, hint: str
) -> Rollback:
    """The rollback for ``bad``, seen after step ``current`` with the newest committed
    checkpoint at ``committed`` (None: none yet).

    :param done: this attempt's rollbacks so far.
    :param budget: the most rollbacks an attempt may make (``train.rollback_budget``).
    :param hint: what the user should change, for the failure's message.
    :raises BudgetSpent: the budget is spent (or 0), no checkpoint was committed yet, or the
        checkpoint the last rollback restored gave a bad loss at once (its weights diverged
        before it was saved: the loss of a step is read before the save, the update after it).
    """
    earlier = "; ".join(r.describe() for r in done)
    before = f" (after {len(done)} rollback(s): {earlier})" if done else ""
    if len(done) >= budget:
        raise BudgetSpent(
            f"{bad.why} at step {bad.step}{before}: train.rollback_budget={budget} is spent; {hint}", bad
        )
    last = done[-1] if done else None
    if last is not None and last.to_step == committed and bad.step == last.skipped_to + 1:
        raise BudgetSpent(
            f"{bad.why} at step {bad.step}, the first step after rolling back to step {committed}"
            f"{before}: that checkpoint's weights are already bad, and rolling back to it again would "
            f"meet the same; {hint}",
            bad,
        )
    if committed is None:
        raise BudgetSpent(
            f"{bad.why} at step {bad.step}, before any checkpoint was committed: nothing to roll back to; "
            f"{hint}, or checkpoint earlier (checkpoint.every_steps)",
            bad,
        )
    return Rollback(bad, committed, committed + 1, current)
