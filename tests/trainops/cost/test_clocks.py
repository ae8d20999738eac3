"""Which clock bills an attempt: the cluster's, the trainer's only where it agrees with it.

Times are seconds after T0 (2026-01-01T00:00:00Z); the attempt's pods ran 30..160 on the
cluster's clock, its trainer program 35..158 on its own.
"""

import pytest

from tests.trainops.cost.fixtures import T0
from trainops.cost.clocks import (
    TOLERANCE_S,
    AttemptClocks,
    ClusterTimes,
    OperatorTimes,
    TrainerTimes,
    duration,
    reconcile,
    stamp,
)

HOURS = 3600.0


def clocks(*, skew=0.0, cluster=None, trainer=None, operator=None, ended=True):
    """Attempt 1: the cluster's times as given (default: pods 30..160, seen at 165), the
    trainer's on a clock ``skew`` seconds ahead of the cluster's, the operator's (0, 166)."""
    c = {"launched": T0, "start": T0 + 30, "gang_start": T0 + 34, "end": T0 + 160, "observed": T0 + 165}
    t = {"start": T0 + 35, "end": T0 + 158, "stamps": (T0 + 90, T0 + 150), "stepped": True}
    o = {"launched": T0, "end": T0 + 166}
    t = {**t, **(trainer or {})}
    t = {
        **t,
        "start": None if t["start"] is None else t["start"] + skew,
        "end": None if t["end"] is None else t["end"] + skew,
        "stamps": tuple(x + skew for x in t["stamps"]),
    }
    return AttemptClocks(
        attempt=1,
        cluster=ClusterTimes(**{**c, "final": True, **(cluster or {})}),
        trainer=TrainerTimes(**t),
        operator=OperatorTimes(**{**o, **(operator or {})}),
        ended=ended,
    )


def test_clocks_that_agree_bill_the_pods_window_and_leave_the_trainers_times_as_they_are():
    window = reconcile(clocks(skew=TOLERANCE_S - 1))  # a minute or two of drift: agree
    assert (window.start, window.end) == (T0 + 30, T0 + 160)
    assert window.trainer_offset == 0.0 and window.warnings == () and window.notes == ()


@pytest.mark.parametrize("skew", [3 * HOURS, -5 * HOURS])
def test_a_trainer_clock_hours_off_is_warned_about_by_name_and_the_cluster_bills(skew):
    window = reconcile(clocks(skew=skew))
    assert (window.start, window.end) == (T0 + 30, T0 + 160)  # the pods' window, whatever it says
    assert window.trainer_offset == pytest.approx(-(skew + 1))  # measured on its start
    (warning,) = window.warnings
    ahead = "ahead by 3h00m01s" if skew > 0 else "behind by 4h59m59s"
    assert warning == (
        f"attempt 1: the trainer's clock disagrees with the cluster's ({ahead}): the trainer says it "
        f"started at {stamp(T0 + 35 + skew)}, its containers started by {stamp(T0 + 34)}; "
        "billed on the cluster's times, its steps are placed by that offset"
    )


def test_a_trainer_clock_ahead_cannot_stretch_an_attempt_whose_pods_left_no_end():
    """The pod on a vanished node never gets a finishedAt: the bill ends when the cluster was
    seen to lose the attempt, not at the trainer's (hours later) end."""
    window = reconcile(clocks(skew=3 * HOURS, cluster={"end": None}))
    assert (window.start, window.end) == (T0 + 30, T0 + 165)
    assert "billed up to when the cluster was seen to end it (2026-01-01T00:02:45Z)" in window.notes[0]
    assert window.warnings


def test_a_missing_pod_end_is_taken_from_an_agreeing_trainer_and_never_from_one_that_disagrees():
    old_state = {"end": None, "observed": None, "final": False}  # a job.json from before these times
    agreeing = reconcile(clocks(cluster=old_state))
    assert agreeing.end == T0 + 158
    assert agreeing.notes == ("attempt 1: no pod end time recorded; billed up to the trainer's end",)
    ahead = reconcile(clocks(skew=2 * HOURS, cluster=old_state))
    assert ahead.end == T0 + 166  # the operator's sighting: its clock agrees with the cluster's
    assert "billed up to when the operator saw it end" in ahead.notes[-1]


def test_an_end_no_agreeing_clock_recorded_is_unknown_and_not_invented():
    """The bug of #25: a pod start from the cluster and an end from the operator's clock, 11
    months apart, billed 16,000 GPU-hours. Clocks never compared are never paired."""
    window = reconcile(
        clocks(
            cluster={"end": None, "observed": None, "final": False, "launched": None},
            trainer={"end": None},
            operator={"launched": T0 + 8000 * HOURS, "end": T0 + 8000 * HOURS},
        )
    )
    assert (window.start, window.end) == (T0 + 30, None)
    assert window.notes[-1] == (
        "attempt 1: its end is unknown (no clock that agrees with the cluster's recorded it): not "
        "billed, so the run's cost leaves it out"
    )
    assert "the operator's times disagree with the cluster's (the operator launched it at" in window.notes[0]


def test_with_no_cluster_times_one_clock_gives_both_bounds():
    nothing = {"launched": None, "start": None, "gang_start": None, "end": None, "observed": None}
    trainer = reconcile(clocks(cluster=nothing))
    assert (trainer.start, trainer.end) == (T0 + 35, T0 + 158)
    assert trainer.notes == (
        "attempt 1: no pod start time recorded; billed from the trainer's start",
        "attempt 1: no pod end time recorded; billed up to the trainer's end",
    )
    operator = reconcile(clocks(cluster=nothing, trainer={"start": None, "end": None}))
    assert (operator.start, operator.end) == (T0, T0 + 166)  # launch to the operator's sighting
    skewed = reconcile(clocks(skew=-3 * HOURS, cluster=nothing))  # before its own launch: not used
    assert (skewed.start, skewed.end) == (T0, T0 + 166) and "with the operator's" in skewed.warnings[0]
    assert skewed.trainer_offset is None  # nothing measures it: its steps cannot be placed


def test_a_window_is_never_negative_and_a_queued_attempt_starts_nothing():
    backwards = reconcile(clocks(cluster={"end": T0 + 10}))  # a corrupt end before the start
    assert backwards.end == backwards.start == T0 + 30
    queued = reconcile(
        clocks(
            cluster={"start": None, "gang_start": None, "end": None},
            trainer={"start": None, "end": None, "stamps": (), "stepped": False},
        )
    )
    assert (queued.launched, queued.start, queued.end) == (T0, None, T0 + 165)


def test_an_attempt_that_has_not_ended_is_billed_up_to_now():
    running = {"end": None, "observed": T0 + 100, "final": False}
    window = reconcile(
        clocks(cluster=running, trainer={"end": None}, operator={"end": None}, ended=False), now=T0 + 120
    )
    assert window.end == T0 + 120 and window.notes == ("attempt 1 has not ended: billed up to now",)


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (12.5, 245, 3 * HOURS + 5, -2 * HOURS)] == [
        "12.5s",
        "4m05s",
        "3h00m05s",
        "2h00m00s",
    ]
