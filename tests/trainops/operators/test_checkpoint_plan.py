"""What mid-run evaluation does next, from what storage shows of the run."""

from trainops.operators.checkpoint_plan import RunView, due_steps, next_move


def view(committed=(), scored=(), status="running", final=None, latest=None, task=None):
    latest = max(committed, default=0) if latest is None else latest
    return RunView(30, 1, frozenset(committed), frozenset(scored), status, final, latest, task)


def test_before_the_run_starts_it_waits():
    assert next_move(view(status=None)).kind == "wait"
    assert next_move(view(status=None)).why == "training has not started"


def test_the_oldest_due_checkpoint_is_scored_first_and_emergency_saves_never():
    # 50: an emergency save at a preemption; 90 not committed yet
    assert due_steps(view(committed=(30, 50, 60))) == [30, 60]
    assert next_move(view(committed=(30, 50, 60), scored=(30,))) == next_move(view(committed=(60,)))
    assert next_move(view(committed=(30, 50, 60), scored=(30,))).step == 60
    move = next_move(view(committed=(30, 60), scored=(30, 60)))
    assert (move.kind, move.why) == ("wait", "training is running (newest checkpoint: step 60)")


def test_every_nth_checkpoint_only():
    every_other = RunView(30, 2, frozenset({30, 60, 90, 120}), frozenset(), "running", latest_step=120)
    assert due_steps(every_other) == [60, 120]


def test_once_training_succeeded_its_last_checkpoint_is_due_then_the_pick():
    # 100: the run's last step, not on the schedule, scored all the same
    done = view(committed=(60, 90, 100), scored=(30, 60, 90), status="succeeded", final=100)
    assert next_move(done).step == 100
    assert (
        next_move(view(committed=(90, 100), scored=(30, 60, 90, 100), status="succeeded", final=100)).kind
        == "pick"
    )


def test_a_failed_training_fails_the_evaluator_once_its_task_gave_up():
    move = next_move(view(committed=(30,), status="failed", task="failed"))
    assert move.kind == "fail" and "training failed (its task is failed)" in move.why
    # between two tries of the training task, its retry resumes the same run: wait for it
    waiting = next_move(view(committed=(30,), status="failed", task="up_for_retry"))
    assert (waiting.kind, waiting.why) == (
        "wait",
        "training failed its try; waiting for the training task's retry",
    )
    assert next_move(view(status="failed")).kind == "wait"  # Airflow could not say


def test_a_training_task_that_ends_without_a_run_here_fails_the_evaluator_saying_why():
    gone = next_move(view(status=None, task="success"))
    assert gone.kind == "fail" and "give this task the training task's storage_root" in gone.why
    assert next_move(view(status=None, task="upstream_failed")).kind == "fail"
    assert next_move(view(status=None, task="running")).kind == "wait"


def test_a_stale_attempts_commit_above_latest_is_not_due_until_committed_again():
    # attempt 1 (a zombie) committed 90 after attempt 2 started from 60: latest.json says 60
    assert due_steps(view(committed=(30, 60, 90), scored=(30,), latest=60)) == [60]
    assert due_steps(view(committed=(30, 60, 90), scored=(30, 60), latest=90)) == [90]
