"""What mid-run evaluation does next, from what storage shows of the run."""

from trainops.operators.checkpoint_plan import RunView, due_steps, next_move


def view(committed=(), scored=(), status="running", final=None):
    return RunView(30, 1, frozenset(committed), frozenset(scored), status, final)


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
    every_other = RunView(30, 2, frozenset({30, 60, 90, 120}), frozenset(), "running")
    assert due_steps(every_other) == [60, 120]


def test_once_training_succeeded_its_last_checkpoint_is_due_then_the_pick():
    # 100: the run's last step, not on the schedule, scored all the same
    done = view(committed=(60, 90, 100), scored=(30, 60, 90), status="succeeded", final=100)
    assert next_move(done).step == 100
    assert (
        next_move(view(committed=(90, 100), scored=(30, 60, 90, 100), status="succeeded", final=100)).kind
        == "pick"
    )


def test_a_failed_training_fails_the_evaluator():
    move = next_move(view(committed=(30,), status="failed"))
    assert move.kind == "fail" and "training failed" in move.why
