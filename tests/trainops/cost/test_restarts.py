"""An attempt's in-place restarts as the cost accounting reads them from its record (seconds
after T0)."""

import math

import pytest

from tests.trainops.cost.fixtures import T0, iso
from trainops.cost.restarts import (
    Incarnation,
    bounds,
    earlier,
    first_step_time,
    incarnation_of,
    placed,
    recoveries,
    restores,
)


def entry(first=None, ended=None, last=25, lost=5, restore_s=None, **extra):
    return {
        "restart": 0,
        "outcome": "failed",
        "cause": "network",
        "last_step": last,
        "checkpoint_step": last - lost,
        "steps_lost": lost,
        "started_at": iso(0),
        "ended_at": None if ended is None else iso(ended),
        "first_step_time": None if first is None else T0 + first,
        "restore_s": restore_s,
        **extra,
    }


def test_each_earlier_incarnation_with_its_times_and_the_steps_it_kept():
    record = {"restarts": [entry(first=40, ended=70), entry(ended=90, last=20, lost=0, restore_s=4.5)]}
    assert earlier(record) == [
        Incarnation(first_step=T0 + 40, ended=T0 + 70, last_step=25, kept_up_to=20, restore_s=0.0),
        Incarnation(first_step=None, ended=T0 + 90, last_step=20, kept_up_to=20, restore_s=4.5),
    ]
    assert earlier(None) == earlier({}) == earlier({"restarts": "x"}) == []  # an older record: none
    damaged = earlier({"restarts": ["x", {"restart": 0, "last_step": "25", "steps_lost": -3}]})
    assert damaged == [Incarnation(first_step=None, ended=None, last_step=0, kept_up_to=0, restore_s=0.0)]


def test_an_incarnation_that_left_no_record_kept_what_the_next_one_resumed_from():
    unknown = {"restart": 0, "outcome": "unknown", "error": "no attempt record"}
    chain = [unknown, entry(ended=90, last=40, lost=5, resumed_from_step=20), {**unknown, "restart": 2}]
    kept = [inc.kept_up_to for inc in earlier({"restarts": chain, "resumed_from_step": 35})]
    assert kept == [20, 35, 35]  # 0 from 1's resume, 1 from its own record, 2 from the newest's resume
    # from a trainer that did not say where incarnations resumed: nothing known kept
    assert earlier({"restarts": [unknown]})[0].kept_up_to == 0


def test_steps_belong_to_the_incarnation_whose_first_step_came_before_them():
    # the second incarnation never stepped: the first one's steps end where the third's begin
    incarnations = earlier({"restarts": [entry(first=40, ended=70), entry(ended=90)]})
    limits = bounds(incarnations, T0 + 100)
    assert limits == [T0 + 100, T0 + 100]
    assert [incarnation_of(limits, T0 + t) for t in (41, 69, 101)] == [0, 0, 2]
    assert bounds(incarnations, None) == [math.inf, math.inf]  # no later step: all the first's
    assert bounds([], T0 + 5) == [] and incarnation_of([], T0 + 5) == 0  # no restart: one incarnation


def test_the_attempts_first_step_is_the_first_incarnations_that_stepped():
    assert first_step_time({"first_step_time": T0 + 80}) == T0 + 80  # no restart
    assert first_step_time({"first_step_time": T0 + 80, "restarts": [entry(first=40)]}) == T0 + 40
    assert first_step_time({"first_step_time": T0 + 80, "restarts": [entry()]}) == T0 + 80
    assert first_step_time({"restarts": [entry()]}) is None and first_step_time(None) is None


def test_restores_at_startup_and_in_the_restarts():
    assert restores({"restore_s": 6.0}) == (6.0, 0.0)  # no restart: the attempt's own resume
    record = {"restore_s": 4.0, "restarts": [entry(restore_s=3.0), entry(restore_s=2.0)]}
    assert restores(record) == (3.0, 6.0)  # the first's is at startup; the later ones' in restarts
    assert restores({"restore_s": "x", "restarts": [entry(restore_s=float("nan"))]}) == (0.0, 0.0)


def test_each_restart_recovers_from_its_end_to_the_next_first_step():
    incarnations = earlier({"restarts": [entry(first=40, ended=70), entry(first=85, ended=95)]})
    assert recoveries(incarnations, T0 + 110) == pytest.approx([15.0, 15.0])
    # a restarted incarnation that never stepped is part of the restart before it
    never = earlier({"restarts": [entry(first=40, ended=70), entry(ended=90)]})
    assert recoveries(never, T0 + 100) == pytest.approx([30.0])
    assert recoveries(never, None) == []  # no first step followed: no recovery to tell
    assert recoveries(earlier({"restarts": [entry(first=40)]}), T0 + 80) == []  # its end unknown


def test_placed_on_the_clusters_clock():
    incarnations = earlier({"restarts": [entry(first=40, ended=70)]})
    assert placed(incarnations, 0.0) == incarnations
    (moved,) = placed(incarnations, -5.0)
    assert (moved.first_step, moved.ended) == (T0 + 35, T0 + 65)
    (unknown,) = placed(incarnations, None)
    assert (unknown.first_step, unknown.ended, unknown.kept_up_to) == (None, None, 20)
