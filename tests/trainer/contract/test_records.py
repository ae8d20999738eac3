"""Attempt records and their copy in the log (``trainer.contract.records``)."""

import pytest

from trainer.contract import (
    ATTEMPT_FORMAT,
    AttemptRecord,
    attempt_record,
    attempt_record_in_log,
    attempt_record_line,
    parse_attempt_record,
)


def test_an_attempt_record_counts_the_steps_the_next_attempt_replays():
    record = attempt_record(
        attempt=2, outcome="preempted", last_step=23, checkpoint_step=20, world_size=4, signal="SIGTERM"
    )
    assert (record["format"], record["steps_lost"], record["signal"], record["resumed_from_step"]) == (
        ATTEMPT_FORMAT,
        3,
        "SIGTERM",
        None,
    )
    assert (
        attempt_record(attempt=1, outcome="failed", last_step=7, checkpoint_step=None, world_size=1)[
            "steps_lost"
        ]
        == 7
    )
    assert parse_attempt_record(record) == record
    with pytest.raises(ValueError, match=r"unknown attempt outcome 'crashed'"):
        attempt_record(attempt=1, outcome="crashed", last_step=0, checkpoint_step=None, world_size=1)


def test_a_failed_record_says_its_cause_and_older_records_without_one_still_parse():
    failed = attempt_record(
        attempt=2, outcome="failed", last_step=30, checkpoint_step=20, world_size=2, cause="storage"
    )
    assert failed["cause"] == "storage" and "metrics_unwritten" not in failed
    assert parse_attempt_record(failed) == failed
    completed = attempt_record(
        attempt=2, outcome="completed", last_step=30, checkpoint_step=30, world_size=2, metrics_unwritten=4
    )
    assert completed["metrics_unwritten"] == 4 and "cause" not in completed
    before = {k: v for k, v in failed.items() if k != "cause"}  # as the previous trainer wrote them
    assert parse_attempt_record(before) == before
    assert set(AttemptRecord.__optional_keys__) == {
        "cause",
        "metrics_unwritten",
        "emergency_save_s",
        "first_step_time",
        "signal_time",
        "restore_s",
        "notice",
        "rollbacks",
        "restarts",
        "restore_files",
    }
    node = attempt_record(
        attempt=1, outcome="failed", last_step=0, checkpoint_step=None, world_size=2, cause="node"
    )
    assert parse_attempt_record(node)["cause"] == "node"  # a node without the GPUs it was given
    with pytest.raises(ValueError, match=r"unknown failure cause 'disk'"):
        attempt_record(
            attempt=1, outcome="failed", last_step=0, checkpoint_step=None, world_size=1, cause="disk"
        )


def test_a_record_that_storage_refused_travels_in_the_log_and_is_found_again():
    record = attempt_record(
        attempt=3, outcome="failed", last_step=40, checkpoint_step=20, world_size=2, cause="storage"
    )
    line = attempt_record_line(record)
    assert line.startswith("trainops-attempt-record: {") and "\n" not in line
    other = attempt_record_line({**record, "attempt": 2, "cause": "network"})
    tail = "\n".join(
        [
            "[node-0] trainer: failed at step 40: storage refused ...",
            f"[node-0] {other}",
            f"[node-0] {line}",
            "[node-0] trainops-attempt-record: {torn",
            "[node-1] torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        ]
    )
    assert attempt_record_in_log(tail, 3) == record  # the last valid one of that attempt
    assert attempt_record_in_log(tail, 2)["cause"] == "network"
    assert attempt_record_in_log(tail, 4) is None and attempt_record_in_log("", 3) is None


def test_rank_0s_final_record_wins_over_an_early_line_printed_after_it():
    # A slower rank's early line (printed at once on an infrastructure failure, before the
    # clean-up) can come after rank 0's complete record: the final one still counts.
    final = attempt_record(
        attempt=1,
        outcome="failed",
        last_step=40,
        checkpoint_step=20,
        world_size=2,
        cause="storage",
        metrics_unwritten=16,
    )
    early = {k: v for k, v in final.items() if k != "metrics_unwritten"}
    early_line = attempt_record_line(early, early=True)
    assert early_line.startswith("trainops-attempt-record-early: {")
    tail = f"[node-0] {attempt_record_line(final)}\n[node-0] {early_line}"
    assert attempt_record_in_log(tail, 1) == final
    # rank 0 stopped before its final line: the early one is all there is, and it is used
    assert attempt_record_in_log(f"[node-0] {early_line}", 1) == early


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": "other/v1"}, "not a trainops.attempt/v1 record"),
        ({"outcome": "gone"}, "unknown outcome 'gone'"),
        ({"last_step": "7"}, "field 'last_step' must be an integer, got '7'"),
        (
            {"cause": "disk"},
            r"unknown cause 'disk'; expected one of \('storage', 'network', 'node', 'program'\)",
        ),
        ({"metrics_unwritten": -1}, "field 'metrics_unwritten' must be an integer >= 0, got -1"),
    ],
)
def test_a_malformed_attempt_record_is_refused_with_what_is_wrong(change, message):
    record = attempt_record(attempt=1, outcome="completed", last_step=7, checkpoint_step=7, world_size=1)
    with pytest.raises(ValueError, match=message):
        parse_attempt_record({**record, **change})


# --- 5. metrics.jsonl ----------------------------------------------------------------------


def test_an_emergency_save_duration_travels_in_the_record_and_is_checked():
    from trainer.contract import attempt_record, parse_attempt_record

    rec = attempt_record(
        attempt=1, outcome="preempted", last_step=5, checkpoint_step=5, world_size=2, emergency_save_s=12.5
    )
    assert parse_attempt_record(rec)["emergency_save_s"] == 12.5
    assert "emergency_save_s" not in attempt_record(
        attempt=1, outcome="completed", last_step=5, checkpoint_step=5, world_size=2
    )
    with pytest.raises(ValueError, match="'emergency_save_s' must be a number of seconds >= 0, got 'x'"):
        parse_attempt_record({**rec, "emergency_save_s": "x"})


def test_a_restore_duration_travels_in_the_record_and_is_checked():
    from trainer.contract import attempt_record, parse_attempt_record

    rec = attempt_record(
        attempt=2, outcome="completed", last_step=9, checkpoint_step=9, world_size=2, restore_s=3.25
    )
    assert parse_attempt_record(rec)["restore_s"] == 3.25
    assert "restore_s" not in attempt_record(
        attempt=1, outcome="completed", last_step=5, checkpoint_step=5, world_size=2
    )
    with pytest.raises(ValueError, match="'restore_s' must be a number of seconds >= 0, got -1"):
        parse_attempt_record({**rec, "restore_s": -1})


def test_the_first_step_and_signal_times_travel_in_the_record_and_are_checked():
    from trainer.contract import attempt_record, parse_attempt_record

    rec = attempt_record(
        attempt=1,
        outcome="preempted",
        last_step=5,
        checkpoint_step=5,
        world_size=2,
        first_step_time=1767225690.25,
        signal_time=1767225752.5,
    )
    assert (rec["first_step_time"], rec["signal_time"]) == (1767225690.25, 1767225752.5)
    assert parse_attempt_record(rec) == rec
    older = attempt_record(attempt=1, outcome="completed", last_step=5, checkpoint_step=5, world_size=2)
    assert "first_step_time" not in older and "signal_time" not in older  # and still read
    assert parse_attempt_record(older) == older
    for key in ("first_step_time", "signal_time"):
        with pytest.raises(ValueError, match=f"'{key}' must be epoch seconds"):
            parse_attempt_record({**rec, key: "noon"})


def test_an_attempts_earlier_incarnations_are_read_leniently():
    from trainer.contract import attempt_record, earlier_incarnations

    restarts = [{"restart": 0, "outcome": "failed"}, {"restart": 1, "outcome": "unknown"}]
    rec = attempt_record(
        attempt=1, outcome="completed", last_step=9, checkpoint_step=9, world_size=2, restarts=restarts
    )
    assert earlier_incarnations(rec) == restarts
    assert earlier_incarnations({"restarts": [restarts[0], "torn", None]}) == [restarts[0]]
    assert [earlier_incarnations(r) for r in (None, "text", {}, {"restarts": "x"})] == [[], [], [], []]
