from trainops.metrics import final_by_step, latest_of_attempt, max_step_of_attempt

TEXT = ('{"step": 1, "loss": 5.0, "attempt": 1}\n{"step": 2, "loss": 4.0, "attempt": 1}\n'
        '{"step": 2, "loss": 3.9, "attempt": 2}\nnot json\n{"step": 3, "loss": 3.5, "attempt": 2}\n'
        '{"step": 4, "lo')  # a torn last line, as a reader may see mid-rewrite


def test_attempts_are_kept_apart_and_garbage_is_skipped():
    assert max_step_of_attempt(TEXT, 1) == 2
    assert max_step_of_attempt(TEXT, 2) == 3
    assert max_step_of_attempt(TEXT, 3) == 0
    assert latest_of_attempt(TEXT, 2)["loss"] == 3.5
    assert latest_of_attempt(TEXT, 9) is None


def test_later_attempt_wins_a_replayed_step():
    by_step = final_by_step(TEXT)
    assert sorted(by_step) == [1, 2, 3]
    assert by_step[2]["loss"] == 3.9
