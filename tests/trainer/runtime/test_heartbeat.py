"""Rank 0's heartbeat: written in the background, rate-limited, and never in training's way."""

import json
import threading
import time

import pytest

from trainer.contract import HEARTBEAT_WARMUP_STEPS, RunLayout, parse_heartbeat
from trainer.runtime.heartbeat import (
    BUSY_WRITE_AFTER_S,
    ENV_EVERY_S,
    EVERY_S,
    HeartbeatWriter,
    NoHeartbeat,
    beats,
    every_s_from,
    p99,
    restarting,
)
from trainer.storage import StorageUnavailable, open_storage


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def read(store, layout, attempt=1):
    try:
        return parse_heartbeat(json.loads(store.get(layout.heartbeat(attempt))))
    except Exception:
        return None


def test_the_newest_step_is_written_with_its_time_and_median_at_most_every_interval(tmp_path):
    root = tmp_path.as_uri()
    store, layout = open_storage(root), RunLayout(root)
    writer = HeartbeatWriter(store, layout, 3, every_s=0.3)
    writer.start(40)  # resumed at step 40: nothing stepped yet
    wait_for(lambda: read(store, layout, 3) is not None)
    first = read(store, layout, 3)
    assert first["step"] == 40 and first["steps"] == 0 and first["median_step_s"] is None
    for step, took in zip(range(41, 61), [9.0] + [0.1] * 9 + [0.3] * 10, strict=True):
        writer.beat(step, took)  # the first step (compile) is left out of the median
    finished_at = time.time()
    wait_for(lambda: (read(store, layout, 3) or {}).get("step") == 60)
    beat = read(store, layout, 3)
    assert beat["steps"] == 20 and beat["median_step_s"] == 0.3 and beat["attempt"] == 3
    assert beat["every_s"] == 0.3 and beat["busy"] is None
    assert beat["time"] <= finished_at  # when the step finished, not when it was written
    assert writer.writes <= 3  # 21 beats, one write per 0.3 s
    writer.close()


class Stuck:
    """Storage that hangs, then refuses."""

    def __init__(self):
        self.release = threading.Event()
        self.puts = 0

    def put(self, uri, data):
        self.puts += 1
        self.release.wait(5)
        raise OSError("storage refused")


def test_a_write_that_hangs_or_fails_never_blocks_training_and_is_logged_once(tmp_path, caplog):
    store = Stuck()
    caplog.set_level("INFO", logger="trainer.heartbeat")
    writer = HeartbeatWriter(store, RunLayout(tmp_path.as_uri()), 1, every_s=0.01)
    started = time.monotonic()
    for step in range(1, 1001):
        writer.beat(step, 0.001)
    assert time.monotonic() - started < 0.5  # storage hangs for 5 s: beat only records
    store.release.set()

    def keeps_stepping():
        writer.beat(2000, 0.001)
        return store.puts >= 3

    wait_for(keeps_stepping)  # every failed write is skipped; later steps try again
    writer.close()
    assert caplog.text.count("heartbeat not written (storage refused); training goes on") == 1


def test_only_rank_0_beats(tmp_path):
    root = tmp_path.as_uri()
    quiet = beats(root, 1, False, 0)
    assert isinstance(quiet, NoHeartbeat)
    quiet.beat(1, 0.1)
    with quiet.busy("checkpoint save"):
        quiet.beat(2, 0.1)
    assert not (tmp_path / "heartbeat").exists()
    beat = beats(root, 2, True, 5)
    beat.beat(6, 0.1)
    wait_for(lambda: (read(open_storage(root), RunLayout(root), 2) or {}).get("step") in (5, 6))
    beat.close()


def test_the_interval_is_ten_seconds_unless_the_environment_says_otherwise(tmp_path):
    assert every_s_from({}) == every_s_from({ENV_EVERY_S: " "}) == EVERY_S == 10.0
    assert every_s_from({ENV_EVERY_S: "0.5"}) == 0.5
    beat = beats(tmp_path.as_uri(), 1, True, 0, environ={ENV_EVERY_S: "0.5"})
    assert isinstance(beat, HeartbeatWriter) and beat.every_s == 0.5
    beat.close()


@pytest.mark.parametrize("raw", ["0", "-1", "ten", "nan", "inf"])
def test_a_bad_interval_fails_on_every_rank_naming_the_value(tmp_path, raw):
    for is_main in (True, False):
        with pytest.raises(ValueError) as caught:
            beats(tmp_path.as_uri(), 1, is_main, 0, environ={ENV_EVERY_S: raw})
        assert str(caught.value) == (
            f"TRAINOPS_HEARTBEAT_EVERY_S={raw!r} is not a number of seconds > 0; "
            "unset it for the default (10 s)"
        )


class Clock:
    """A hand-moved clock, wall and monotonic alike."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_the_pace_leaves_out_warm_up_and_the_gaps_hold_what_the_loop_does_between_steps(tmp_path):
    root = tmp_path.as_uri()
    store, layout, clock = open_storage(root), RunLayout(root), Clock()
    writer = HeartbeatWriter(store, layout, 1, every_s=3600, clock=clock, monotonic=clock)
    writer.start(0)
    wait_for(lambda: read(store, layout) is not None)
    for step in range(1, HEARTBEAT_WARMUP_STEPS + 1):  # compile and warm-up: 20 s each
        clock.now += 20.0
        writer.beat(step, 20.0)
        if step == 1:  # the first step is written at once (the interval is an hour)
            wait_for(lambda: (read(store, layout) or {}).get("steps") == 1)
    assert read(store, layout)["p99_step_s"] is None  # no pace from warm-up
    steps = [0.2] * 98 + [0.5, 0.9]  # the 100 steps after warm-up
    clock.now += steps[0]
    writer.beat(HEARTBEAT_WARMUP_STEPS + 1, steps[0])
    # the first step after warm-up is written at once: a pace exists, from one step
    wait_for(lambda: (read(store, layout) or {}).get("steps") == HEARTBEAT_WARMUP_STEPS + 1)
    beat = read(store, layout)
    assert beat["p99_step_s"] == 0.2 and beat["max_gap_s"] == pytest.approx(0.2)
    for i, took in enumerate(steps[1:], start=HEARTBEAT_WARMUP_STEPS + 2):
        clock.now += 1.5 if i == 50 else took  # a metrics flush of 1.3 s after one step
        writer.beat(i, took)
    assert read(store, layout)["steps"] == HEARTBEAT_WARMUP_STEPS + 1  # the rest waits out the hour
    with writer.busy("checkpoint save"):  # written at once, with the newest step
        wait_for(lambda: (read(store, layout) or {}).get("busy") == "checkpoint save")
        clock.now += 300.0  # a save of 5 minutes is not a gap between steps
    wait_for(lambda: (read(store, layout) or {}).get("busy_ended") == clock.now)
    beat = read(store, layout)
    assert beat["busy"] is None and beat["busy_since"] is None
    assert beat["step"] == HEARTBEAT_WARMUP_STEPS + 100 and beat["steps"] == HEARTBEAT_WARMUP_STEPS + 100
    assert beat["p99_step_s"] == 0.5  # nearest rank: the 99th of 100; warm-up's 20 s left out
    assert beat["max_gap_s"] == pytest.approx(1.5)  # the flush: not warm-up's 20 s, nor the save's 300 s
    clock.now += 0.2
    writer.beat(HEARTBEAT_WARMUP_STEPS + 101, 0.2)
    writer.close()
    assert writer.writes == 5  # start, first step, end of warm-up, busy, its end; then the hour


def test_a_lasting_busy_mark_is_written_within_a_second_though_the_interval_is_long(tmp_path):
    root = tmp_path.as_uri()
    store, layout = open_storage(root), RunLayout(root)
    writer = HeartbeatWriter(store, layout, 1, every_s=3600)
    writer.start(10)
    wait_for(lambda: read(store, layout) is not None)
    writes = writer.writes
    with writer.busy("metrics flush"):
        pass  # over at once: nothing to tell the watch, no write
    time.sleep(BUSY_WRITE_AFTER_S + 0.5)
    assert writer.writes == writes and read(store, layout)["busy"] is None
    before = time.time()
    with writer.busy("final checkpoint and export"):
        wait_for(
            lambda: (read(store, layout) or {}).get("busy") is not None, timeout=BUSY_WRITE_AFTER_S + 2.0
        )
        beat = read(store, layout)
        assert beat["busy"] == "final checkpoint and export" and beat["busy_since"] >= before
    wait_for(lambda: (read(store, layout) or {}).get("busy") is None, timeout=2.0)  # its end, at once
    assert read(store, layout)["busy_ended"] >= before
    writer.close()


class FlakyStore:
    """Refuses the first ``failures`` puts, then writes to ``inner``."""

    def __init__(self, inner, failures: int):
        self.inner, self.failures, self.refused = inner, failures, 0

    def put(self, uri, data):
        if self.refused < self.failures:
            self.refused += 1
            raise StorageUnavailable(f"put {uri}: 503 SlowDown (test)")
        return self.inner.put(uri, data)


def test_a_refused_busy_mark_is_written_again_though_no_step_comes(tmp_path):
    root = tmp_path.as_uri()
    inner, layout = open_storage(root), RunLayout(root)
    store = FlakyStore(inner, failures=0)
    writer = HeartbeatWriter(store, layout, 1, every_s=3600)
    writer.start(10)
    wait_for(lambda: read(inner, layout) is not None)
    store.failures = store.refused + 2  # throttled while the save runs
    with writer.busy("checkpoint save"):
        wait_for(
            lambda: (read(inner, layout) or {}).get("busy") is not None, timeout=BUSY_WRITE_AFTER_S + 6.0
        )
    assert store.refused == store.failures  # refused twice, then written: no step came meanwhile
    writer.close()


def test_p99_is_the_nearest_rank_and_the_slowest_of_few():
    assert p99([]) is None
    assert p99([0.3, 0.1, 0.2]) == 0.3
    assert p99([float(i) for i in range(1, 201)]) == 198.0


def test_a_restarted_incarnation_marks_itself_busy_before_its_setup(tmp_path, monkeypatch, caplog):
    # the watch then gives it the startup allowance, not the pace of the incarnation that died
    run = (tmp_path / "run").as_uri()
    assert restarting(run, 3, 20, clock=lambda: 1000.0) is True
    beat = parse_heartbeat(json.loads(open_storage(run).get(RunLayout(run).heartbeat(3))))
    assert (beat["step"], beat["steps"], beat["time"]) == (20, 0, 1000.0)
    assert (beat["busy"], beat["busy_since"], beat["busy_ended"]) == ("restart in place", 1000.0, None)

    def refused(*args, **kwargs):
        raise StorageUnavailable("storage: write kept failing (503 SlowDown)")

    monkeypatch.setattr("trainer.runtime.heartbeat.open_storage", refused)
    assert restarting(run, 3, 20) is False  # logged; the restart goes on
    assert "heartbeat of the restart not written" in caplog.text
