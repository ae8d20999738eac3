"""``checkpoint.every_steps``: fixed, or auto from the measured save cost and preemption rate."""

import itertools
import math
import re
import subprocess

import pytest

from tests.trainer.helpers import committed_steps, metrics_of, run_config, torchrun_argv, trainer_env
from trainer.checkpoint.cadence import (
    FIRST_SAVE_STEPS,
    KEEP_UP,
    MAX_INTERVAL_S,
    Cadence,
    auto_interval,
    mtbf_s,
    observed_rate,
    young_daly_s,
)


def test_young_daly():
    assert young_daly_s(0.8, 3600.0) == pytest.approx(math.sqrt(2 * 0.8 * 3600))  # 75.9 s


def test_the_interval_is_young_daly_unless_the_upload_needs_longer():
    cheap = auto_interval(step_s=0.6, blocked_s=0.8, commit_s=11.5, mtbf_s=3600.0)
    assert cheap.steps == math.ceil(young_daly_s(0.8, 3600.0) / 0.6) == 127
    assert cheap.why.startswith(
        "Young/Daly: max(sqrt(2 x blocked 0.80s x MTBF 1h) = 76s, 1.25 x commit 11.5s = 14s)"
    )
    slow_upload = auto_interval(step_s=0.6, blocked_s=0.01, commit_s=40.0, mtbf_s=3600.0)
    assert slow_upload.steps == math.ceil(KEEP_UP * 40.0 / 0.6) and slow_upload.why.startswith("keep-up")
    # the save in flight commits before the next is due, so a preemption without notice loses the
    # steps since the newest commit: at most an interval plus an upload, under two intervals
    for interval, commit in ((cheap, 11.5), (slow_upload, 40.0)):
        assert interval.seconds + commit < 2 * interval.seconds


def test_an_interval_is_at_least_a_step_and_at_most_an_hour_unless_the_upload_is_longer():
    assert auto_interval(step_s=30.0, blocked_s=0.0, commit_s=0.0, mtbf_s=3600.0).steps == 1
    assert auto_interval(step_s=1.0, blocked_s=100.0, commit_s=1.0, mtbf_s=360000.0).seconds == MAX_INTERVAL_S
    huge = auto_interval(step_s=1.0, blocked_s=1.0, commit_s=4000.0, mtbf_s=3600.0)
    assert huge.steps == 5000  # keeping up wins over the cap: a save must finish before the next


def test_the_observed_rate_counts_preempted_attempts_over_their_time():
    records = [
        {
            "outcome": "preempted",
            "started_at": "2026-12-06T00:00:00+00:00",
            "ended_at": "2026-12-06T00:30:00+00:00",
        },
        {
            "outcome": "preempted",
            "started_at": "2026-12-06T00:31:00+00:00",
            "ended_at": "2026-12-06T01:01:00+00:00",
        },
        {"outcome": "failed", "started_at": None, "ended_at": "2026-12-06T02:00:00+00:00"},
    ]
    assert observed_rate(records) == pytest.approx(2.0)  # 2 in 1 h
    assert observed_rate(records[:1][:0]) is None
    assert (
        observed_rate([{**records[0], "ended_at": "2026-12-06T00:10:00+00:00"}]) is None
    )  # 10 min says little
    assert mtbf_s(1.0, 2.0) == 1800.0 and mtbf_s(1.0, 0.5) == 3600.0 and mtbf_s(0.5, None) == 7200.0


def test_a_fixed_cadence_saves_on_multiples():
    cadence = Cadence(25, start=40, mtbf=3600.0)
    assert [s for s in range(40, 101) if cadence.due(s)] == [50, 75, 100]
    assert cadence.saved(50, step_s=1.0, blocked_s=0.1, commit_s=2.0) is None and not cadence.auto


def test_auto_measures_two_saves_then_follows_the_rule():
    cadence = Cadence(0, start=40, mtbf=3600.0)
    assert cadence.auto and not cadence.due(40 + FIRST_SAVE_STEPS - 1) and cadence.due(40 + FIRST_SAVE_STEPS)
    assert cadence.saved(50, step_s=0.5, blocked_s=0.2, commit_s=None) is None  # no upload timed yet
    assert cadence.due(60) and not cadence.due(59)
    interval = cadence.saved(60, step_s=0.5, blocked_s=0.2, commit_s=3.0)
    assert interval is not None and interval.steps == math.ceil(young_daly_s(0.2, 3600.0) / 0.5) == 76
    assert cadence.due(60 + 76) and not cadence.due(60 + 75)


@pytest.mark.slow
def test_an_auto_run_saves_where_its_agreed_intervals_say_and_logs_them(tmp_path, dataset_uri):
    """Two ranks under torchrun, ``checkpoint.every_steps=auto`` planning for a preemption a
    second (so the interval is short enough to see several): saves at steps 10 and 20 measure,
    then each save is where the interval recorded at the one before put it, on both ranks alike
    (a disagreement would hang a collective), and the log says the interval and its rule."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run = tmp_path / "run"
    proc = subprocess.run(
        torchrun_argv(
            config,
            "train.max_steps=120",
            "checkpoint.every_steps=auto",
            "checkpoint.preemptions_per_hour=3600",
            "checkpoint.keep=50",
        ),
        env=trainer_env(tmp_path / "cache", 1),
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    records = metrics_of(run)
    saves = sorted(step for step, m in records.items() if "checkpoint_blocked_s" in m)
    assert saves[:2] == [FIRST_SAVE_STEPS, 2 * FIRST_SAVE_STEPS] and len(saves) >= 4
    for before, after in itertools.pairwise(saves[1:]):
        assert after - before == records[before]["checkpoint_every_steps"]
    assert committed_steps(run)[:-1] == saves  # every one committed, then the final save
    assert "planning for 3.6e+03 preemption(s) per hour" in output
    assert re.search(r"checkpoint: every \d+ steps \(\d+s\) from now on; (Young/Daly|keep-up): max\(", output)


def test_the_interval_keeps_up_with_the_slowest_of_the_recent_commits():
    """One upload slower than the last must not make the next save wait: the rule keeps up with
    the slowest of the last three times to commit, not the newest alone."""
    cadence = Cadence(0, start=0, mtbf=3600.0)
    cadence.saved(10, step_s=1.0, blocked_s=0.0, commit_s=None)
    slow = cadence.saved(20, step_s=1.0, blocked_s=0.0, commit_s=40.0)
    assert slow is not None and slow.steps == 50  # 1.25 x 40 s
    after = cadence.saved(70, step_s=1.0, blocked_s=0.0, commit_s=8.0)
    assert after is not None and after.steps == 50  # still 40 s among the last three
    for step in (120, 170):
        cadence.saved(step, step_s=1.0, blocked_s=0.0, commit_s=8.0)
    assert cadence.interval is not None and cadence.interval.steps == 10  # 40 s is no longer recent
