"""Rank 0's heartbeat: written in the background, rate-limited, and never in training's way."""

import json
import threading
import time

import pytest

from trainer.contract import RunLayout, parse_heartbeat
from trainer.runtime.heartbeat import ENV_EVERY_S, EVERY_S, HeartbeatWriter, beats, every_s_from
from trainer.storage import open_storage


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
    beats(root, 1, False, 0)(1, 0.1)
    assert not (tmp_path / "heartbeat").exists()
    beat = beats(root, 2, True, 5)
    beat(6, 0.1)
    wait_for(lambda: (read(open_storage(root), RunLayout(root), 2) or {}).get("step") in (5, 6))


def test_the_interval_is_ten_seconds_unless_the_environment_says_otherwise(tmp_path):
    assert every_s_from({}) == every_s_from({ENV_EVERY_S: " "}) == EVERY_S == 10.0
    assert every_s_from({ENV_EVERY_S: "0.5"}) == 0.5
    beat = beats(tmp_path.as_uri(), 1, True, 0, environ={ENV_EVERY_S: "0.5"})
    assert beat.__self__.every_s == 0.5  # type: ignore[attr-defined]
    beat.__self__.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("raw", ["0", "-1", "ten", "nan", "inf"])
def test_a_bad_interval_fails_on_every_rank_naming_the_value(tmp_path, raw):
    for is_main in (True, False):
        with pytest.raises(ValueError) as caught:
            beats(tmp_path.as_uri(), 1, is_main, 0, environ={ENV_EVERY_S: raw})
        assert str(caught.value) == (
            f"TRAINOPS_HEARTBEAT_EVERY_S={raw!r} is not a number of seconds > 0; "
            "unset it for the default (10 s)"
        )
