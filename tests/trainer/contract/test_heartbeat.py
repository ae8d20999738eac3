"""Heartbeats (``trainer.contract.heartbeat``)."""

from trainer.contract import (
    RunLayout,
)


def test_a_heartbeat_is_read_back_and_a_damaged_one_is_none():
    from trainer.contract import parse_heartbeat

    layout = RunLayout("s3://b/runs/d/r/t")
    assert layout.heartbeat(2) == "s3://b/runs/d/r/t/heartbeat/2.json"
    beat = {"attempt": 2, "step": 7, "time": 1.5, "steps": 3, "median_step_s": None}
    assert parse_heartbeat(beat) == beat
    assert parse_heartbeat({**beat, "median_step_s": "0.5"})["median_step_s"] == 0.5
    assert parse_heartbeat({"step": 1}) is None and parse_heartbeat([1]) is None
    assert parse_heartbeat({**beat, "step": "x"}) is None
