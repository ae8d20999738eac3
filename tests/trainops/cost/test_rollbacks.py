"""An attempt record's bad-loss rollbacks, read for the cost accounting."""

from trainops.cost.rollbacks import RolledBack, restore_seconds, rolled_back, rolled_back_before, thrown_away

RECORD = {
    "rollbacks": [
        {"at_step": 14, "to_step": 10, "skipped_from": 11, "skipped_to": 15, "restore_s": 3.0},
        {"at_step": 31, "to_step": 30, "skipped_from": 31, "skipped_to": 32},  # before restore_s
    ]
}


def test_each_rollback_is_its_skipped_window_and_its_load():
    assert rolled_back(RECORD) == [RolledBack(11, 15, 3.0), RolledBack(31, 32, 0.0)]
    assert restore_seconds(RECORD) == 3.0


def test_a_step_in_a_skipped_window_was_thrown_away():
    windows = rolled_back(RECORD)
    assert [s for s in range(9, 34) if thrown_away(windows, s)] == [11, 12, 13, 14, 15, 31, 32]


def test_a_rollback_lies_between_the_logged_steps_around_its_window_end():
    windows = rolled_back(RECORD)
    assert rolled_back_before(windows, 13, 16)  # 14 and 15 had no record
    assert rolled_back_before(windows, 15, 16)
    assert not rolled_back_before(windows, 16, 17) and not rolled_back_before(windows, 10, 11)


def test_a_damaged_entry_says_nothing():
    damaged = {
        "rollbacks": [
            "x",
            {"skipped_from": 5},
            {"skipped_from": 9, "skipped_to": 3},
            {"skipped_from": True, "skipped_to": 2},
        ]
    }
    assert rolled_back(damaged) == [] and restore_seconds(damaged) == 0.0
    assert rolled_back(None) == rolled_back({"rollbacks": "x"}) == []
    assert rolled_back({"rollbacks": [{"skipped_from": 1, "skipped_to": 2, "restore_s": float("nan")}]}) == [
        RolledBack(1, 2, 0.0)
    ]
