from trainer.contract import latest_of_attempt, max_step_of_attempt, metrics_by_step, metrics_records

TEXT = (
    '{"step": 1, "loss": 5.0, "attempt": 1}\n{"step": 2, "loss": 4.0, "attempt": 1}\n'
    '{"step": 2, "loss": 3.9, "attempt": 2}\nnot json\n{"step": 3, "loss": 3.5, "attempt": 2}\n'
    '["a list"]\n{"step": "5"}\n{"step": 4, "lo'
)  # a torn last line, as a reader may see mid-rewrite


def test_attempts_are_kept_apart_and_garbage_is_skipped():
    records = metrics_records(TEXT)
    assert [(r["step"], r["attempt"]) for r in records] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    assert max_step_of_attempt(records, 1) == 2
    assert max_step_of_attempt(records, 2) == 3
    assert max_step_of_attempt(records, 3) == 0
    assert latest_of_attempt(records, 2)["loss"] == 3.5
    assert latest_of_attempt(records, 9) is None


def test_later_attempt_wins_a_replayed_step():
    by_step = metrics_by_step(metrics_records(TEXT))
    assert sorted(by_step) == [1, 2, 3]
    assert by_step[2]["loss"] == 3.9


def test_the_highest_attempt_wins_even_when_an_older_record_comes_later():
    # an older attempt's record after a newer one's (a late write from a fenced gang) loses
    text = '{"step": 2, "loss": 3.9, "attempt": 2}\n{"step": 2, "loss": 4.0, "attempt": 1}\n'
    assert metrics_by_step(metrics_records(text))[2]["loss"] == 3.9
