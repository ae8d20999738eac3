"""The cost accounting against timelines computed by hand (seconds after T0 in the comments).

Every step lasts 1 s; 1 node x 8 GPUs unless said otherwise; prices are the fixture's
p4d.24xlarge figures (USD per GPU-hour: spot 11.4704 / 8, on-demand 32.7726 / 8).
"""

import copy
import itertools

import pytest

from tests.trainops.cost.fixtures import (
    FIXTURE_PRICES,
    GPUS,
    P4D_ON_DEMAND,
    P4D_SPOT,
    T0,
    attempt_entry,
    iso,
    one_preemption_cost,
    one_preemption_job,
    one_restart_job,
    one_rollback_job,
    step_records,
)
from trainops.cost.accounting import PHASES, account, epoch, stored_cost
from trainops.cost.prices import DEFAULT_GPU_HOUR, default_table

SPOT_H, ON_DEMAND_H = P4D_SPOT / GPUS, P4D_ON_DEMAND / GPUS


def seconds(**given):
    return {phase: float(given.get(phase, 0)) for phase in PHASES}


def record(n, outcome, last_step, checkpoint_step, **extra):
    return {
        "format": "trainops.attempt/v1",
        "attempt": n,
        "outcome": outcome,
        "last_step": last_step,
        "checkpoint_step": checkpoint_step,
        "steps_lost": last_step - (checkpoint_step or 0),
        "resumed_from_step": None,
        "world_size": GPUS,
        "signal": "SIGTERM" if outcome == "preempted" else None,
        "hint": None,
        "error": None,
        "started_at": None,
        "ended_at": None,
        **extra,
    }


def attempt(n, *, launched, start, end, classification, rec=None, capacity="spot", steps_lost=0, **state):
    """A job.json entry whose pods ran ``start``..``end`` (None: never started)."""
    times = {} if start is None else {"start_time": T0 + start, "end_time": T0 + end}
    entry = attempt_entry(
        n,
        launched,
        end + 1,
        capacity=capacity,
        state={"phase": "failed", "reason": None, "nodes": [], "disruptions": [], **times, **state},
        record=rec,
        steps_lost=steps_lost,
        classification=classification,
    )
    for node in entry["node_types"]:
        node["capacity_type"] = capacity
    return entry


def job_of(*entries):
    job, _ = one_preemption_job()
    return {**job, "attempts": list(entries)}


def test_one_preemption_gives_the_hand_computed_bill():
    job, metrics = one_preemption_job()
    cost = account(job, metrics, FIXTURE_PRICES)
    want = one_preemption_cost()
    assert _same(cost, want)
    assert [a["seconds"] for a in cost["attempts"]] == [
        seconds(queued=30, startup=60, productive=50, replayed=10, checkpoint_stall=4, shutdown=6),
        seconds(queued=20, startup=40, productive=70, checkpoint_stall=4, shutdown=10),
    ]
    assert cost["goodput"] == pytest.approx(120 / 254)
    assert cost["recovery_s"] == pytest.approx([77.5])
    assert cost["cost"] == pytest.approx(254 * 8 / 3600 * SPOT_H)  # $0.81
    assert cost["savings"] == pytest.approx(254 * 8 / 3600 * (ON_DEMAND_H - SPOT_H))  # $1.50
    assert cost["notes"] == [] and cost["estimate"] is True


def _same(got, want):
    """``got`` equals ``want``, floats to 1e-9 (pytest.approx does not nest into lists of dicts)."""
    if isinstance(want, dict):
        assert set(got) == set(want)
        return all(_same(got[k], want[k]) for k in want)
    if isinstance(want, list):
        assert len(got) == len(want)
        return all(_same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
        return True
    assert got == want
    return True


def test_the_spans_tile_each_attempt_in_order_and_sum_to_its_seconds():
    cost = account(*one_preemption_job(), FIXTURE_PRICES)
    for a in cost["attempts"]:
        spans = a["spans"]
        assert all(x["end"] == y["start"] for x, y in itertools.pairwise(spans))
        assert spans[-1]["end"] == a["end"] and spans[1]["start"] == a["start"]  # after queued
        for phase in PHASES:
            assert sum(s["end"] - s["start"] for s in spans if s["phase"] == phase) == pytest.approx(
                a["seconds"][phase]
            )
        assert a["billed_gpu_s"] == pytest.approx((a["end"] - a["start"]) * a["accelerators"])


def test_a_storm_of_three_preemptions():
    # 1: pods 10..33, first step 20, steps 1-10 end 21..30, SIGTERM 29.5, emergency save kept 10
    # 2: pods 45..72, first step 60, steps 11-20 end 61..70, SIGTERM 69.5, kept 20
    # 3: pods 85..108, first step 100, steps 21-25 end 101..105, SIGKILLed: no record, 5 lost,
    #    the disruption injected at 104.5
    # 4: pods 125..165, first step 140, steps 21-40 end 141..160, completed
    entries = [
        attempt(
            1,
            launched=0,
            start=10,
            end=33,
            classification="preempted",
            rec=record(1, "preempted", 10, 10, first_step_time=T0 + 20, signal_time=T0 + 29.5),
        ),
        attempt(
            2,
            launched=40,
            start=45,
            end=72,
            classification="preempted",
            rec=record(2, "preempted", 20, 20, first_step_time=T0 + 60, signal_time=T0 + 69.5),
        ),
        attempt(
            3,
            launched=80,
            start=85,
            end=108,
            classification="preempted",
            steps_lost=5,
            disruptions=[{"node": 0, "reason": "SpotInterruption", "time": T0 + 104.5}],
        ),
        attempt(
            4,
            launched=120,
            start=125,
            end=165,
            classification="succeeded",
            rec=record(4, "completed", 40, 40, first_step_time=T0 + 140),
        ),
    ]
    metrics = (
        step_records(1, 1, 10, 20, {})
        + step_records(2, 11, 20, 60, {})
        + step_records(3, 21, 25, 100, {})
        + step_records(4, 21, 40, 140, {})
    )
    cost = account(job_of(*entries), metrics, FIXTURE_PRICES)
    assert [a["seconds"] for a in cost["attempts"]] == [
        seconds(queued=10, startup=10, productive=10, shutdown=3),
        seconds(queued=5, startup=15, productive=10, shutdown=2),
        seconds(queued=5, startup=15, replayed=5, shutdown=3),
        seconds(queued=5, startup=15, productive=20, shutdown=5),
    ]
    assert cost["seconds"] == seconds(queued=25, startup=55, productive=40, replayed=5, shutdown=13)
    assert cost["preemptions"] == 3
    assert cost["recovery_s"] == pytest.approx([30.5, 30.5, 35.5])
    assert cost["goodput"] == pytest.approx(40 / 113)
    # replayed 5, plus startup and shutdown of the three preempted attempts: 13 + 17 + 18
    assert cost["lost_gpu_hours"] == pytest.approx((5 + 48) * 8 / 3600)
    assert cost["cost"] == pytest.approx(113 * 8 / 3600 * SPOT_H)
    assert cost["notes"] == [  # the SIGKILLed attempt wrote no record
        "attempt 3: no first-step time recorded; its first step is taken to have lasted its median "
        "step time (1.00s)"
    ]


def test_an_on_demand_fallback_prices_each_attempt_at_its_own_capacity():
    job, metrics = one_preemption_job()
    second = job["attempts"][1]
    second["capacity"] = "on-demand"
    second["node_types"][0]["capacity_type"] = "on-demand"
    cost = account(job, metrics, FIXTURE_PRICES)
    first, then = cost["attempts"]
    assert (first["capacity"], then["capacity"]) == ("spot", "on-demand")
    assert first["cost"] == pytest.approx(130 * 8 / 3600 * SPOT_H)
    assert then["cost"] == pytest.approx(124 * 8 / 3600 * ON_DEMAND_H) == then["on_demand_cost"]
    assert cost["cost"] == pytest.approx((130 * SPOT_H + 124 * ON_DEMAND_H) * 8 / 3600)
    # only the spot attempt saved anything
    assert cost["savings"] == pytest.approx(130 * 8 / 3600 * (ON_DEMAND_H - SPOT_H))


def test_a_hang_relaunch_counts_the_hang_as_shutdown_and_recovers_from_the_last_step():
    # 1: pods 0..341, first step 10, steps 1-20 end 11..30, a save blocks 1 s, steps 21-30 end
    #    32..41, then nothing: the hang watch ends it at 341; no record, 10 steps lost
    # 2: pods 360..404, first step 380, steps 21-40 end 381..400, completed
    entries = [
        attempt(1, launched=0, start=0, end=341, classification="hung", steps_lost=10),
        attempt(
            2,
            launched=350,
            start=360,
            end=404,
            classification="succeeded",
            rec=record(2, "completed", 40, 40, first_step_time=T0 + 380),
        ),
    ]
    # the first step's start is not recorded: estimated from its median step time (1 s)
    metrics = step_records(1, 1, 30, 10, {20: 1.0}) + step_records(2, 21, 40, 380, {})
    cost = account(job_of(*entries), metrics, FIXTURE_PRICES)
    assert [a["seconds"] for a in cost["attempts"]] == [
        seconds(startup=10, productive=20, checkpoint_stall=1, replayed=10, shutdown=300),
        seconds(queued=10, startup=20, productive=20, shutdown=4),
    ]
    assert cost["attempts"][0]["outcome"] == "hung" and not cost["attempts"][0]["preempted"]
    assert cost["recovery_s"] == pytest.approx([380 - 41])
    assert cost["goodput"] == pytest.approx(40 / 385)
    assert cost["lost_gpu_hours"] == pytest.approx((10 + 10 + 300) * 8 / 3600)
    assert cost["notes"] == [
        "attempt 1: no first-step time recorded; its first step is taken to have lasted its median "
        "step time (1.00s)"
    ]


def test_a_queued_attempt_is_shown_and_not_billed():
    # 1: launched 0, pods never started (unschedulable until 900): queued, then infra
    # 2: on-demand, launched 910, pods 915..940, first step 925, steps 1-10 end 926..935
    entries = [
        attempt(1, launched=0, start=None, end=900, classification="infra"),
        attempt(
            2,
            launched=910,
            start=915,
            end=940,
            capacity="on-demand",
            classification="succeeded",
            rec=record(2, "completed", 10, 10, first_step_time=T0 + 925),
        ),
    ]
    entries[0]["ended_at"] = iso(900)
    cost = account(job_of(*entries), step_records(2, 1, 10, 925, {}), FIXTURE_PRICES)
    queued, ran = cost["attempts"]
    assert queued["seconds"] == seconds(queued=900) and queued["billed_gpu_s"] == queued["cost"] == 0
    assert queued["spans"] == [{"phase": "queued", "start": T0, "end": T0 + 900}]
    assert ran["seconds"] == seconds(queued=5, startup=10, productive=10, shutdown=5)
    assert cost["goodput"] == pytest.approx(10 / 25)
    assert cost["recovery_s"] == pytest.approx([25.0])  # the failure (900) to the next first step
    assert cost["cost"] == pytest.approx(25 * 8 / 3600 * ON_DEMAND_H) and cost["savings"] == pytest.approx(0)


def test_an_unknown_instance_type_is_priced_per_gpu_hour_and_says_so():
    job, metrics = one_preemption_job()
    for entry in job["attempts"]:
        entry["node_types"][0]["instance_type"] = "p9.fake"
    cost = account(job, metrics, default_table())
    assert [a["price"]["known"] for a in cost["attempts"]] == [False, False]
    assert cost["cost"] == pytest.approx(254 * 8 / 3600 * DEFAULT_GPU_HOUR["spot"])
    assert cost["on_demand_cost"] == pytest.approx(254 * 8 / 3600 * DEFAULT_GPU_HOUR["on-demand"])
    assert cost["notes"] == [
        f"attempt {n}: default per-GPU-hour (unknown instance type p9.fake): priced at $1.40/GPU-hour spot"
        for n in (1, 2)
    ]


def test_a_local_cpu_run_counts_one_accelerator_per_node_and_has_no_instance_type():
    job, metrics = one_preemption_job()
    for entry in job["attempts"]:
        entry.update(nodes=2, gpus_per_node=0, node_types=[])
    cost = account(job, metrics, default_table())
    assert [a["accelerators"] for a in cost["attempts"]] == [2, 2]
    assert cost["billed_gpu_hours"] == pytest.approx(254 * 2 / 3600)
    assert "no instance type known" in cost["notes"][0]


def test_a_job_json_from_before_this_change_is_estimated_and_says_how():
    job, metrics = one_preemption_job()
    for entry in job["attempts"]:
        del entry["state"]["start_time"], entry["state"]["end_time"]
        entry["record"].pop("first_step_time")
        entry["record"].pop("signal_time", None)
    cost = account(job, metrics, FIXTURE_PRICES)
    # billed from the trainer's start (35, 195) to its end (160, 314); the first step's start
    # estimated from the median step time: 91 - 1 and 231 - 1, as recorded in the fixture
    assert [a["seconds"] for a in cost["attempts"]] == [
        seconds(queued=35, startup=55, productive=50, replayed=10, checkpoint_stall=4, shutdown=6),
        seconds(queued=25, startup=35, productive=70, checkpoint_stall=4, shutdown=10),
    ]
    assert cost["recovery_s"] == pytest.approx([230 - 154])  # from the last step: no signal time
    assert cost["goodput"] == pytest.approx(120 / 244)
    assert "attempt 1: no pod start time recorded; billed from the trainer's start" in cost["notes"]
    assert "attempt 2: no pod end time recorded; billed up to the trainer's end" in cost["notes"]


def test_an_attempt_without_any_times_falls_back_to_the_operators_and_is_still_billed():
    job, metrics = one_preemption_job()
    entry = job["attempts"][0]
    entry.pop("state")
    entry["record"] = None  # SIGKILLed: no record either
    cost = account(job, metrics, FIXTURE_PRICES)
    first = cost["attempts"][0]
    # from its launch (0) to when the operator saw it end (165)
    assert (first["start"], first["end"]) == (T0, T0 + 165)
    assert first["seconds"]["replayed"] == 10 and first["outcome"] == "preempted"
    assert "attempt 1: no start time recorded; billed from its launch" in cost["notes"]


def test_a_running_attempt_is_billed_up_to_now():
    job, metrics = one_preemption_job()
    running = copy.deepcopy(job["attempts"][1])
    for key in ("ended_at", "state", "record", "classification", "decision"):
        running.pop(key)
    running["state"] = {
        "phase": "running",
        "reason": None,
        "nodes": [],
        "disruptions": [],
        "start_time": T0 + 190,
    }
    job = {**job, "status": "running", "attempts": [job["attempts"][0], running]}
    partial = [r for r in metrics if r["attempt"] == 1 or r["step"] <= 80]  # up to 230 + 32
    cost = account(job, partial, FIXTURE_PRICES, now=T0 + 270)
    now = cost["attempts"][1]
    assert now["outcome"] == "running" and now["end"] == T0 + 270
    # still training: the 8 s since its last logged step are steps not logged yet, no shutdown
    assert now["seconds"] == seconds(queued=20, startup=40, productive=38, checkpoint_stall=2)
    assert [s["phase"] for s in now["spans"]][-1] == "productive"
    assert "attempt 2 has not ended: billed up to now" in cost["notes"]
    assert cost["lost_gpu_hours"] == pytest.approx((10 + 60 + 6) * 8 / 3600)  # running: nothing lost


def test_the_stored_cost_is_read_back_and_an_older_record_has_none():
    job, metrics = one_preemption_job()
    assert stored_cost(job) is None
    cost = account(job, metrics, FIXTURE_PRICES)
    assert stored_cost({**job, "cost": dict(cost)}) == cost


def test_times_are_read_from_iso_text_and_epoch_seconds():
    assert epoch("2026-01-01T00:00:00+00:00") == epoch("2026-01-01T00:00:00Z") == T0
    assert epoch(T0) == T0 and epoch(None) is None and epoch("yesterday") is None and epoch(True) is None


def test_a_slow_first_step_is_warm_up_and_counts_as_startup_beyond_the_median_step():
    job, metrics = one_preemption_job()
    second = job["attempts"][1]["record"]
    second["first_step_time"] = T0 + 224  # step 51 took 7 s (compile, the first collective)
    cost = account(job, metrics, FIXTURE_PRICES)
    assert cost["attempts"][1]["seconds"] == seconds(
        queued=20, startup=40, productive=70, checkpoint_stall=4, shutdown=10
    )  # 6 of the 7 s are startup: the step counts at the attempt's median, 1 s
    second["first_step_time"] = T0 + 230.5  # a first step faster than the median counts as it ran
    cost = account(job, metrics, FIXTURE_PRICES)
    assert cost["attempts"][1]["seconds"] == seconds(
        queued=20, startup=40.5, productive=69.5, checkpoint_stall=4, shutdown=10
    )
    assert cost["recovery_s"] == pytest.approx([230.5 - 152.5])


def test_lost_steps_without_a_metrics_record_are_replayed_at_the_median_step_time():
    # The fixture's attempt 1 with its step records written every 25 steps: steps 51..60 were
    # never read before the kill, so only the attempt record (last_step 60) knows of them.
    job, metrics = one_preemption_job()
    unlogged = [r for r in metrics if not (r["attempt"] == 1 and r["step"] > 50)]
    cost = account(job, unlogged, FIXTURE_PRICES)
    expected = one_preemption_cost()
    assert cost["attempts"][0]["spans"] == expected["attempts"][0]["spans"]  # 144..154 replayed
    assert cost["seconds"] == pytest.approx(expected["seconds"])
    assert cost["goodput"] == pytest.approx(expected["goodput"])
    assert cost["notes"] == [
        "attempt 1: its last 10 lost step(s), after step 50, have no metrics record (they are written "
        "every train.log_every steps): billed as replayed at its median step time (1.00s)"
    ]
    # half of them recorded: the recorded ones are timed by their records, the rest at the median
    partly = [r for r in metrics if not (r["attempt"] == 1 and r["step"] > 55)]
    assert account(job, partly, FIXTURE_PRICES)["attempts"][0]["spans"] == expected["attempts"][0]["spans"]


def skewed(job, metrics, skew):
    """``job`` and ``metrics`` as a trainer whose clock is ``skew`` seconds off the cluster's
    writes them: every trainer time moved, the cluster's and the operator's not."""
    job = copy.deepcopy(job)
    for entry in job["attempts"]:
        rec = entry["record"]
        for key in ("started_at", "ended_at"):
            rec[key] = iso(epoch(rec[key]) - T0 + skew)
        for key in ("first_step_time", "signal_time"):
            if key in rec:
                rec[key] += skew
    return job, [{**r, "time": r["time"] + skew} for r in metrics]


@pytest.mark.parametrize("skew", [3 * 3600.0, -5 * 3600.0])
def test_a_trainer_clock_hours_off_bills_what_the_cluster_timed_and_says_so(skew):
    """The hand-computed bill, whichever way the trainer's clock is off: its step and signal
    times are placed by the offset its own start and its container's start measure (the
    fixture's trainers start at 35 and 195, their containers at 35 and 195)."""
    job, metrics = one_preemption_job()
    for entry, started in zip(job["attempts"], (35, 195), strict=True):
        entry["state"]["gang_start_time"] = T0 + started
    want = one_preemption_cost()
    cost = account(*skewed(job, metrics, skew), FIXTURE_PRICES)
    assert _same({**cost, "notes": [], "warnings": []}, want)
    ahead = f"{'ahead' if skew > 0 else 'behind'} by {3 if skew > 0 else 5}h00m00s"
    assert [w.split(":")[0] for w in cost["warnings"]] == ["attempt 1", "attempt 2"]
    assert f"the trainer's clock disagrees with the cluster's ({ahead})" in cost["warnings"][0]
    assert f"the trainer says it started at {iso(35 + skew).replace('+00:00', 'Z')}" in cost["warnings"][0]
    assert cost["notes"] == cost["warnings"]  # what the report and the CLI show


def test_a_trainer_clock_ahead_never_stretches_the_bill_past_the_pods_window():
    """Billed the pods' window exactly, whatever the trainer stamped. Its offset measured on its
    end (its container's end: 160 and 314), its steps fall where they were; with neither its
    start nor its end recorded, nothing measures it: its steps are not placed, and its time is
    not split into phases (none of it counted productive), which the warning says."""
    job, metrics = one_preemption_job()
    ahead = skewed(job, metrics, 3 * 3600.0)
    cost = account(*ahead, FIXTURE_PRICES)
    for attempt, (start, end) in zip(cost["attempts"], [(30, 160), (190, 314)], strict=True):
        assert (attempt["start"], attempt["end"]) == (T0 + start, T0 + end)
        assert attempt["billed_gpu_s"] == pytest.approx((end - start) * GPUS)
    assert cost["goodput"] == pytest.approx(120 / 254)
    for entry in ahead[0]["attempts"]:
        entry["record"]["started_at"] = entry["record"]["ended_at"] = None
    cost = account(*ahead, FIXTURE_PRICES)
    assert cost["billed_gpu_hours"] == pytest.approx(254 * GPUS / 3600) and cost["goodput"] == 0
    assert (
        "its steps cannot be placed on that clock, so its time is not split into phases"
        in cost["warnings"][0]
    )


def test_a_pod_start_and_an_operator_end_months_apart_are_never_billed_together():
    """#25: the reclaimed node's attempt had a pod start on the cluster's clock and no pod end;
    the operator's sighting, on a clock 11 months ahead, made it 16,000 GPU-hours. Now the end
    is when the cluster was seen to lose it; with no such sighting (an older job.json), unknown."""
    job, metrics = one_preemption_job()
    first = job["attempts"][0]
    del first["state"]["end_time"]
    first["state"]["phase"] = "lost"
    first["record"]["ended_at"] = None
    months = 8000 * 3600.0
    first["launched_at"], first["ended_at"] = iso(months), iso(months + 165)
    first["state"]["observed_time"] = T0 + 158
    seen = account(job, metrics, FIXTURE_PRICES)["attempts"][0]
    assert (seen["start"], seen["end"]) == (T0 + 30, T0 + 158)
    del first["state"]["observed_time"]
    cost = account(job, metrics, FIXTURE_PRICES)
    assert cost["attempts"][0]["billed_gpu_s"] == 0 and cost["attempts"][0]["seconds"] == seconds()
    assert "attempt 1: its end is unknown (no clock that agrees with the cluster's recorded it)" in " ".join(
        cost["notes"]
    )
    assert cost["billed_gpu_hours"] == pytest.approx(124 * GPUS / 3600)  # attempt 2 alone


def spans_of(attempt):
    return [(s["phase"], round(s["start"] - T0, 6), round(s["end"] - T0, 6)) for s in attempt["spans"]]


def test_an_in_place_restart_is_its_own_phase_and_its_lost_steps_are_replayed():
    job, metrics = one_restart_job()
    cost = account(job, metrics, FIXTURE_PRICES)
    (only,) = cost["attempts"]
    assert spans_of(only) == [
        ("queued", 0, 10),
        ("startup", 10, 40),  # up to the first incarnation's first step, not the newest's
        ("productive", 40, 60),
        ("checkpoint_stall", 60, 62),
        ("replayed", 62, 67),  # 21..23 as recorded, then 24 and 25 at the median step time
        ("restart", 67, 80),
        ("productive", 80, 100),
        ("checkpoint_stall", 100, 102),
        ("productive", 102, 112),
        ("shutdown", 112, 118),
    ]
    assert only["seconds"] == seconds(
        queued=10, startup=30, productive=50, replayed=5, restart=13, checkpoint_stall=4, shutdown=6
    )
    assert only["billed_gpu_s"] == pytest.approx(108 * GPUS)
    assert cost["recovery_s"] == [pytest.approx(10.0)]  # its end (70) to the next first step (80)
    # a completed attempt loses its restart and what it replayed
    assert cost["lost_gpu_hours"] == pytest.approx((5 + 13) * GPUS / 3600)
    assert cost["goodput"] == pytest.approx(50 / 108)
    assert cost["warnings"] == []  # the trainer started with its first incarnation, not at 72
    assert cost["notes"] == [
        "attempt 1: the last 2 lost step(s) before its restart in place 1, after step 23, have no "
        "metrics record: billed as replayed at its median step time (1.00s)"
    ]


def test_a_restart_ten_minutes_in_keeps_the_trainers_clock_in_agreement():
    job, metrics = one_restart_job()
    late = 600.0  # the newest incarnation started long after the pods did
    record = job["attempts"][0]["record"]
    record["started_at"] = iso(72 + late)
    assert record["restarts"][0]["started_at"] == iso(15)
    cost = account(job, metrics, FIXTURE_PRICES)
    assert cost["warnings"] == []
    assert cost["attempts"][0]["seconds"]["productive"] == 50  # its steps stay where they ran


def test_a_restart_whose_next_incarnation_never_stepped_lasts_to_the_attempts_end():
    """torchrun had one restart in place; the restarted gang failed on storage while it resumed."""
    job, metrics = one_restart_job()
    entry = job["attempts"][0]
    entry["state"].update(phase="failed", end_time=T0 + 78)
    entry["record"].update(
        outcome="failed",
        cause="storage",
        last_step=20,
        checkpoint_step=20,
        steps_lost=0,
        ended_at=iso(76),
        first_step_time=None,
    )
    entry["classification"] = "infra"
    cost = account(job, [r for r in metrics if r["time"] <= T0 + 65], FIXTURE_PRICES)
    (only,) = cost["attempts"]
    assert spans_of(only)[-2:] == [("replayed", 62, 67), ("restart", 67, 78)]  # to the pod's end
    assert only["seconds"] == seconds(
        queued=10, startup=30, productive=20, replayed=5, restart=11, checkpoint_stall=2
    )
    assert cost["recovery_s"] == []  # no first step came after it


def test_a_running_attempt_has_no_record_yet_so_a_restart_shows_only_once_it_ended():
    """The trainer writes its record, restarts included, when the attempt ends: until then a
    restart in place reads as the steps not logged yet."""
    job, metrics = one_restart_job()
    entry = job["attempts"][0]
    for key in ("ended_at", "classification", "decision", "steps_lost"):
        entry.pop(key)
    entry["record"] = None
    entry["state"] = {
        "phase": "running",
        "reason": None,
        "nodes": [],
        "disruptions": [],
        "start_time": T0 + 10,
    }
    job["status"] = "running"
    cost = account(job, [r for r in metrics if r["time"] <= T0 + 65], FIXTURE_PRICES, now=T0 + 75)
    assert cost["attempts"][0]["seconds"] == seconds(queued=10, startup=30, productive=33, checkpoint_stall=2)


def test_a_first_incarnation_that_failed_before_its_first_step_is_startup_then_restart():
    """The gang failed in its setup (a peer's NCCL init), torchrun restarted it, and the
    restarted gang trained every step: 10 startup 25 restart 40, then 50 steps and 2 saves."""
    job, _ = one_restart_job()
    entry = job["attempts"][0]
    entry["state"]["end_time"] = T0 + 100
    record = entry["record"]
    record["restarts"][0].update(
        last_step=0, checkpoint_step=None, steps_lost=0, ended_at=iso(25), first_step_time=None
    )
    record.update(started_at=iso(27), first_step_time=T0 + 40, resumed_from_step=None, restore_s=None)
    entry["steps_lost"] = 0
    cost = account(job, step_records(1, 1, 50, 40, {20: 2.0, 40: 2.0}), FIXTURE_PRICES)
    (only,) = cost["attempts"]
    assert spans_of(only)[:4] == [
        ("queued", 0, 10),
        ("startup", 10, 25),
        ("restart", 25, 40),
        ("productive", 40, 60),
    ]
    assert only["seconds"] == seconds(
        queued=10, startup=15, restart=15, productive=50, checkpoint_stall=4, shutdown=6
    )
    assert cost["recovery_s"] == [pytest.approx(15.0)] and cost["notes"] == []


def test_the_steps_a_bad_loss_rollback_threw_away_and_its_load_are_rolled_back_not_productive():
    job, metrics = one_rollback_job()
    cost = account(job, metrics, FIXTURE_PRICES)
    (only,) = cost["attempts"]
    assert spans_of(only) == [
        ("queued", 0, 10),
        ("startup", 10, 40),
        ("productive", 40, 50),
        ("checkpoint_stall", 50, 52),
        # 11-13 as logged, then steps 14-15 (no record) and the load, up to step 16's own second
        ("rollback", 52, 60),
        ("productive", 60, 65),
        ("checkpoint_stall", 65, 67),
        ("productive", 67, 77),
        ("checkpoint_stall", 77, 79),
        ("productive", 79, 89),
        ("shutdown", 89, 95),
    ]
    assert only["seconds"] == seconds(
        queued=10, startup=30, productive=35, rollback=8, checkpoint_stall=6, shutdown=6
    )
    # productive is the 35 steps kept (1-10, 16-40); the rollback is lost though the run completed
    assert cost["goodput"] == pytest.approx(35 / 85)
    assert cost["lost_gpu_hours"] == pytest.approx(8 * GPUS / 3600)


def test_a_rollback_of_a_record_from_another_version_is_read_with_care():
    job, metrics = one_rollback_job()
    record = job["attempts"][0]["record"]
    record["rollbacks"] = ["damaged", {"skipped_from": 15, "skipped_to": 11}]  # nothing usable
    (only,) = account(job, metrics, FIXTURE_PRICES)["attempts"]
    assert only["seconds"]["rollback"] == 0 and only["seconds"]["productive"] == pytest.approx(43)


def test_the_steps_an_incarnation_without_a_record_kept_are_productive():
    """Incarnation 0 was SIGKILLed before any rank wrote a record (the OOM killer, the NCCL
    watchdog): its entry is unknown, but incarnation 1 resumed from step 20, so 1-20 were kept."""
    job, metrics = one_restart_job()
    record = job["attempts"][0]["record"]
    first = record["restarts"][0]
    record["restarts"] = [
        {
            "restart": 0,
            "outcome": "unknown",
            "error": "no attempt record",
            "first_step_time": first["first_step_time"],
        }
    ]
    (only,) = account(job, metrics, FIXTURE_PRICES)["attempts"]
    assert spans_of(only)[:4] == [
        ("queued", 0, 10),
        ("startup", 10, 40),
        ("productive", 40, 60),
        ("checkpoint_stall", 60, 62),
    ]
    assert only["seconds"]["productive"] == pytest.approx(50)  # 1-20, then 21-50 again
