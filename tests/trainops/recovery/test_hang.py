"""hang_verdict: no new step for the hang timeout is hung; the first step gets a startup allowance."""

from trainops.recovery.hang import HANG_FLOOR_S, STARTUP_ALLOWANCE_S, hang_timeout_s, hang_verdict


def beat(step=10, at=1000.0, steps=5, median=None):
    return {"attempt": 1, "step": step, "time": at, "steps": steps, "median_step_s": median}


def test_the_timeout_is_the_setting_or_derived_from_the_pace():
    assert hang_timeout_s(45, 100.0) == 45
    assert hang_timeout_s(None, None) == HANG_FLOOR_S == 600
    assert hang_timeout_s(None, 1.0) == 600  # 20 x 1 s is under the floor
    assert hang_timeout_s(None, 60.0) == 1200  # 20 x a minute


def test_no_new_step_for_the_timeout_is_hung_and_not_before():
    hb = beat(step=40, at=1000.0, steps=12, median=0.5)
    assert hang_verdict(heartbeat=hb, watched_since=900.0, now=1045.0, setting=45) is None
    why = hang_verdict(heartbeat=hb, watched_since=900.0, now=1046.0, setting=45)
    assert why == "no new step for 46s: step 41 never finished (limit 45s: hang_timeout 45s)"


def test_a_derived_timeout_says_how_it_was_derived():
    hb = beat(step=3, at=0.0, steps=4, median=40.0)
    assert hang_verdict(heartbeat=hb, watched_since=0.0, now=799.0, setting=None) is None
    why = hang_verdict(heartbeat=hb, watched_since=0.0, now=801.0, setting=None)
    assert (
        why is not None
        and "limit 800s: hang_timeout 800s, derived: max(600s, 20 x median step time 40.00s)" in why
    )


def test_the_first_step_gets_the_startup_allowance():
    started = beat(step=0, at=1000.0, steps=0)
    limit = 45 + STARTUP_ALLOWANCE_S
    assert hang_verdict(heartbeat=started, watched_since=990.0, now=1000.0 + limit, setting=45) is None
    why = hang_verdict(heartbeat=started, watched_since=990.0, now=1001.0 + limit, setting=45)
    assert why is not None and "its first step (after step 0) never finished" in why
    assert f"+ {STARTUP_ALLOWANCE_S:.0f}s startup allowance" in why


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
    assert (
        why
        == "no step and no heartbeat 56s after the attempt started running (limit 55s: hang_timeout 45s + 10s startup allowance)"
    )
