"""What mid-run evaluation does next, from what storage shows of the run; pure.

``EvaluateCheckpointsOperator`` looks at the run each time it wakes: which checkpoints are
committed, which are scored (or skipped), and whether training is over. It then scores the
oldest due checkpoint, waits, picks, or fails. The state is all in storage, so a retried or
rescheduled task decides the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.contract import scheduled_for_eval

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"


@dataclass(frozen=True)
class RunView:
    """The training run as storage shows it.

    :param status: ``job.json``'s status (None: the run has not started).
    :param final_step: the newest committed step once the run succeeded (else None): the run's
        last checkpoint, scored whatever the schedule says.
    """

    every_steps: int
    every_checkpoints: int
    committed: frozenset[int]
    scored: frozenset[int]
    status: str | None
    final_step: int | None = None


@dataclass(frozen=True)
class Move:
    """``score`` (``step``), ``wait`` (for a commit or the run's end), ``pick`` or ``fail``."""

    kind: str
    step: int | None = None
    why: str = ""


def due_steps(view: RunView) -> list[int]:
    """The committed checkpoints to score and not yet scored, oldest first: every Nth regular
    one, and the run's last once it succeeded."""
    due = {s for s in view.committed if scheduled_for_eval(s, view.every_steps, view.every_checkpoints)}
    if view.status == SUCCEEDED and view.final_step:
        due.add(view.final_step)
    return sorted(due - view.scored)


def next_move(view: RunView) -> Move:
    """What to do now (see the module docstring)."""
    if view.status == FAILED:
        return Move("fail", why="training failed: there is no run to pick a checkpoint of")
    due = due_steps(view)
    if due:
        return Move("score", step=due[0])
    if view.status == SUCCEEDED:
        return Move("pick")
    if view.status is None:
        return Move("wait", why="training has not started")
    newest = max(view.committed, default=0)
    return Move("wait", why=f"training is running (newest checkpoint: step {newest})")
