"""Heartbeats (``trainer.contract.heartbeat``)."""

from trainer.contract import (
    RunLayout,
)


def test_a_heartbeat_is_read_back_and_a_damaged_one_is_none():
    from trainer.contract import parse_heartbeat

    layout = RunLayout("s3://b/runs/d/r/t")
    assert layout.heartbeat(2) == "s3://b/runs/d/r/t/heartbeat/2.json"
    old = {"attempt": 2, "step": 7, "time": 1.5, "steps": 3, "median_step_s": None}  # an older writer's
    beat = {
        **old,
        "p99_step_s": None,
        "max_gap_s": None,
        "every_s": None,
        "busy": None,
        "busy_since": None,
        "busy_ended": None,
    }
    assert parse_heartbeat(old) == beat  # the fields it lacks read as None
    assert parse_heartbeat(beat) == beat
    assert parse_heartbeat({**beat, "median_step_s": "0.5"})["median_step_s"] == 0.5
    assert parse_heartbeat({"step": 1}) is None and parse_heartbeat([1]) is None
    assert parse_heartbeat({**beat, "step": "x"}) is None


def test_a_heartbeat_carries_the_pace_and_the_busy_mark():
    from trainer.contract import parse_heartbeat

    beat = {
        "attempt": 1,
        "step": 12,
        "time": 100.0,
        "steps": 12,
        "median_step_s": 0.2,
        "p99_step_s": 0.31,
        "max_gap_s": 1.2,
        "every_s": 10.0,
        "busy": "checkpoint save",
        "busy_since": 101.0,
        "busy_ended": 90.0,
    }
    assert parse_heartbeat(beat) == beat
    assert parse_heartbeat({**beat, "p99_step_s": "0.5"})["p99_step_s"] == 0.5
    assert parse_heartbeat({**beat, "max_gap_s": [1]}) is None  # damaged: no verdict from it
    assert parse_heartbeat({**beat, "busy_since": True}) is None
