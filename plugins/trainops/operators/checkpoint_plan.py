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
# Airflow states of the training task instance after which it will not run again by itself.
TASK_GAVE_UP = frozenset({"failed", "upstream_failed", "skipped", "removed"})


@dataclass(frozen=True)
class RunView:
    """The training run as storage shows it, and its task instance as Airflow does.

    :param status: ``job.json``'s status (None: the run has not started).
    :param latest_step: ``latest.json``'s step: the newest commit of the newest attempt. A
        commit above it is a stale attempt's, refused by the fence until the newest attempt
        commits that step again, so it is not due yet.
    :param final_step: the newest committed step once the run succeeded (else None): the run's
        last checkpoint, scored whatever the schedule says.
    :param task_state: the training task instance's Airflow state (None: unknown).
    """

    every_steps: int
    every_checkpoints: int
    committed: frozenset[int]
    scored: frozenset[int]
    status: str | None
    final_step: int | None = None
    latest_step: int = 0
    task_state: str | None = None


@dataclass(frozen=True)
class Move:
    """``score`` (``step``), ``wait`` (for a commit or the run's end), ``pick`` or ``fail``."""

    kind: str
    step: int | None = None
    why: str = ""


def due_steps(view: RunView) -> list[int]:
    """The committed checkpoints to score and not yet scored, oldest first: every Nth regular
    one up to ``latest_step``, and the run's last once it succeeded."""
    top = view.final_step if view.status == SUCCEEDED and view.final_step else view.latest_step
    due = {
        s
        for s in view.committed
        if s <= top and scheduled_for_eval(s, view.every_steps, view.every_checkpoints)
    }
    if view.status == SUCCEEDED and view.final_step:
        due.add(view.final_step)
    return sorted(due - view.scored)


def next_move(view: RunView) -> Move:
    """What to do now (see the module docstring). A failed run fails this only once its task
    instance has given up: a retry of the training task resumes the same run."""
    gave_up = view.task_state in TASK_GAVE_UP
    if view.status == FAILED:
        if gave_up:
            return Move(
                "fail", why=f"training failed (its task is {view.task_state}): no run to pick a checkpoint of"
            )
        return Move("wait", why="training failed its try; waiting for the training task's retry")
    if view.status is None and view.task_state == "success":
        return Move(
            "fail",
            why="the training task succeeded but left no run here: give this task the training "
            "task's storage_root and aws_conn_id",
        )
    if view.status is None and gave_up:
        return Move("fail", why=f"the training task is {view.task_state} and started no run")
    due = due_steps(view)
    if due:
        return Move("score", step=due[0])
    if view.status == SUCCEEDED:
        return Move("pick")
    if view.status is None:
        return Move("wait", why="training has not started")
    newest = max(view.committed, default=0)
    return Move("wait", why=f"training is running (newest checkpoint: step {newest})")
