"""hang_verdict: no new step for the hang timeout is hung. The timeout is the setting, or derived
from the attempt's pace after warm-up (an older trainer's heartbeat: from its median, as before);
the first steps and busy operations get a startup allowance."""

import pytest

from trainer.contract import HEARTBEAT_WARMUP_STEPS
from trainops.recovery.hang import (
    HANG_FLOOR_S,
    HANG_STEP_FACTOR,
    LEGACY_FLOOR_S,
    STARTUP_ALLOWANCE_S,
    hang_limit,
    hang_timeout_s,
    hang_verdict,
    limit_in_verdict,
)


def beat(step=10, at=1000.0, steps=5, median=None, **new):
    """A heartbeat; without ``new`` fields, one an older trainer wrote (no pace, no interval)."""
    fields = {"p99_step_s", "max_gap_s", "every_s", "busy", "busy_since", "busy_ended"}
    assert set(new) <= fields, new
    return {
        "attempt": 1,
        "step": step,
        "time": at,
        "steps": steps,
        "median_step_s": median,
        **dict.fromkeys(fields),
        **new,
    }


def paced(step=40, at=1000.0, steps=40, p99=0.31, gap=0.4, every=10.0, **more):
    return beat(step, at, steps, median=0.2, p99_step_s=p99, max_gap_s=gap, every_s=every, **more)


def test_the_timeout_is_the_setting_or_derived_from_the_pace():
    assert hang_timeout_s(45, paced(p99=100.0)) == 45  # the setting wins
    assert HANG_FLOOR_S == 30 and HANG_STEP_FACTOR == 10
    assert hang_timeout_s(None, paced(p99=0.31, gap=0.4)) == 30  # sub-second steps: the floor
    assert hang_timeout_s(None, paced(p99=6.0, gap=2.0)) == 60  # 10 x the p99 step
    assert hang_timeout_s(None, paced(p99=0.5, gap=9.0)) == 90  # 10 x the longest gap
    assert hang_timeout_s(None, paced(every=60.0)) == 180  # a slow heartbeat: 3 of its intervals
    assert hang_timeout_s(None, paced(p99=None, gap=None)) == 30  # this writer, before its pace


def test_an_older_trainers_heartbeat_keeps_the_former_rule():
    assert hang_timeout_s(None, None) == LEGACY_FLOOR_S == 600
    assert hang_timeout_s(None, beat(median=1.0)) == 600  # 20 x 1 s is under the floor
    assert hang_timeout_s(None, beat(median=60.0)) == 1200  # 20 x a minute
    hb = beat(step=3, at=0.0, steps=4, median=40.0)
    assert hang_verdict(heartbeat=hb, watched_since=0.0, now=799.0, setting=None) is None
    why = hang_verdict(heartbeat=hb, watched_since=0.0, now=801.0, setting=None)
    assert why == (
        "no new step for 801s: step 4 never finished "
        "(limit 800s: hang_timeout 800s, derived: max(600s, 20 x median step time 40.00s))"
    )


def test_no_new_step_for_the_timeout_is_hung_and_not_before():
    hb = beat(step=40, at=1000.0, steps=12, median=0.5)
    assert hang_verdict(heartbeat=hb, watched_since=900.0, now=1045.0, setting=45) is None
    why = hang_verdict(heartbeat=hb, watched_since=900.0, now=1046.0, setting=45)
    assert why == "no new step for 46s: step 41 never finished (limit 45s: hang_timeout 45s)"


def test_a_derived_timeout_says_which_rule_gave_it_with_the_numbers():
    hb = paced(step=40, at=1000.0, p99=0.31, gap=0.4)
    assert hang_verdict(heartbeat=hb, watched_since=900.0, now=1030.0, setting=None) is None
    why = hang_verdict(heartbeat=hb, watched_since=900.0, now=1031.0, setting=None)
    assert why == (
        "no new step for 31s: step 41 never finished (limit 30s: hang_timeout 30s, derived: "
        "max(30s, 3 x heartbeat interval 10s, 10 x longest gap between steps 0.40s))"
    )
    slow = hang_verdict(heartbeat=paced(p99=7.5, gap=3.0), watched_since=0.0, now=1076.0, setting=None)
    assert slow is not None and "limit 75s: hang_timeout 75s, derived: max(30s, 3 x heartbeat" in slow
    assert slow.endswith("10 x p99 step time 7.50s))")


def test_the_first_steps_get_the_startup_allowance():
    started = beat(step=0, at=1000.0, steps=0)
    limit = 45 + STARTUP_ALLOWANCE_S
    assert hang_verdict(heartbeat=started, watched_since=990.0, now=1000.0 + limit, setting=45) is None
    why = hang_verdict(heartbeat=started, watched_since=990.0, now=1001.0 + limit, setting=45)
    assert why is not None and "its first step (after step 0) never finished" in why
    assert f"+ {STARTUP_ALLOWANCE_S:.0f}s startup allowance (the first steps)" in why
    # still warming up: this writer's heartbeat has no pace yet, and the allowance holds
    warming = paced(step=HEARTBEAT_WARMUP_STEPS, steps=HEARTBEAT_WARMUP_STEPS, p99=None, gap=None)
    assert hang_limit(warming, None).total_s == 30 + STARTUP_ALLOWANCE_S
    assert hang_limit(warming, None).describe() == (
        "limit 1830s: hang_timeout 30s, derived: max(30s, 3 x heartbeat interval 10s), no pace yet "
        "+ 1800s startup allowance (the first steps)"
    )
    warm = paced(steps=HEARTBEAT_WARMUP_STEPS + 1)
    assert hang_limit(warm, None).total_s == 30  # the first step after warm-up: none


def test_a_busy_operation_gets_the_allowance_counted_from_its_start():
    save = paced(step=40, at=1000.0, busy="checkpoint save", busy_since=1002.0)
    assert hang_verdict(heartbeat=save, watched_since=0.0, now=1002.0 + 30 + 1800, setting=None) is None
    why = hang_verdict(heartbeat=save, watched_since=0.0, now=1003.0 + 30 + 1800, setting=None)
    assert why is not None and why.startswith(
        "no new step for 1831s: rank 0 was still busy (checkpoint save) after step 40 (limit 1830s:"
    )
    assert why.endswith("+ 1800s startup allowance (busy: checkpoint save))")
    # an explicit setting too: a save is not a step
    assert hang_verdict(heartbeat=save, watched_since=0.0, now=1002.0 + 60, setting=45) is None


def test_after_a_busy_operation_the_idle_time_counts_from_its_end():
    saved = paced(step=40, at=1000.0, busy_ended=1300.0)  # a save of 5 minutes after step 40
    assert hang_verdict(heartbeat=saved, watched_since=0.0, now=1330.0, setting=None) is None
    why = hang_verdict(heartbeat=saved, watched_since=0.0, now=1331.0, setting=None)
    assert why is not None and why.startswith("no new step for 31s: step 41 never finished")


def test_a_stale_heartbeat_is_counted_only_from_when_the_watch_could_read_it():
    hb = beat(step=40, at=1000.0, steps=12)  # written before a storage outage of 15 minutes
    assert hang_verdict(heartbeat=hb, watched_since=1900.0, now=1930.0, setting=45) is None
    why = hang_verdict(heartbeat=hb, watched_since=1900.0, now=1946.0, setting=45)
    assert why is not None and why.startswith("no new step for 46s")


def test_before_any_heartbeat_the_clock_runs_from_when_the_pods_ran():
    assert hang_verdict(heartbeat=None, watched_since=None, now=1e9, setting=45) is None  # pending: no hang
    assert (
        hang_verdict(heartbeat=None, watched_since=0.0, now=50.0, setting=45, startup_allowance_s=10) is None
    )
    why = hang_verdict(heartbeat=None, watched_since=0.0, now=56.0, setting=45, startup_allowance_s=10)
    assert why == (
        "no step and no heartbeat 56s after the attempt started running "
        "(limit 55s: hang_timeout 45s + 10s startup allowance (the first steps))"
    )


@pytest.mark.parametrize(
    ("heartbeat", "setting"),
    [
        (paced(), None),
        (beat(median=1.0), None),
        (paced(busy="final checkpoint and export", busy_since=1e3), 45),
    ],
)
def test_the_report_reads_the_limit_back_from_the_verdict(heartbeat, setting):
    why = hang_verdict(heartbeat=heartbeat, watched_since=0.0, now=1e6, setting=setting)
    limit = hang_limit(heartbeat, setting)
    assert why is not None
    assert limit_in_verdict(f"job train-1: {why}") == (limit.total_s, limit.describe().split(": ", 1)[1])
    assert limit_in_verdict("exit code 1") is None


def test_an_in_place_restart_is_a_short_silence_then_a_new_start_from_an_earlier_step():
    """torchrun restarts a node's workers in the same pods: the last beat of the failed
    incarnation stands while the gang re-forms, then the new one's loop starts from its
    checkpoint step (lower than the step last beaten) with no step of its own yet."""
    failed = paced(step=47, at=1000.0, steps=47)  # the old incarnation's last beat
    for silence in (2.0, 5.0, 29.0):  # a few seconds of restart: within the derived 30 s
        assert hang_verdict(heartbeat=failed, watched_since=0.0, now=1000.0 + silence, setting=None) is None
    restarted = paced(step=40, at=1012.0, steps=0, p99=None, gap=None)  # resumed from the step-40 checkpoint
    limit = hang_limit(restarted, None)
    assert (limit.allowance_s, limit.allowance_for) == (STARTUP_ALLOWANCE_S, "the first steps")
    # its setup and first steps (compile, warm-up) get the startup allowance, as an attempt's do
    assert hang_verdict(heartbeat=restarted, watched_since=0.0, now=1012.0 + 600, setting=None) is None
    why = hang_verdict(heartbeat=restarted, watched_since=0.0, now=1012.0 + limit.total_s + 1, setting=None)
    assert why is not None and "its first step (after step 40) never finished" in why
    # stepping again from step 41, past warm-up: the pace rules again, and the step number is its own
    again = paced(step=45, at=1020.0, steps=HEARTBEAT_WARMUP_STEPS + 2)
    assert hang_verdict(heartbeat=again, watched_since=0.0, now=1049.0, setting=None) is None
    why = hang_verdict(heartbeat=again, watched_since=0.0, now=1051.0, setting=None)
    assert why is not None and why.startswith("no new step for 31s: step 46 never finished")


def test_a_restarted_incarnation_that_marks_itself_busy_gets_the_allowance_before_its_loop():
    """A restart that outlasts the derived limit (a large model's setup and checkpoint load)
    must say so in the heartbeat, as a save does: a ``busy`` mark holds the watch off."""
    restarting = paced(step=47, at=1000.0, steps=0, busy="restart in place", busy_since=1004.0)
    assert hang_verdict(heartbeat=restarting, watched_since=0.0, now=1004.0 + 600, setting=None) is None
    unmarked = paced(step=47, at=1000.0, steps=47)
    why = hang_verdict(heartbeat=unmarked, watched_since=0.0, now=1031.0, setting=None)
    assert why is not None and why.startswith("no new step for 31s: step 48 never finished")
