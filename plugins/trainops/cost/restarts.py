"""An attempt's in-place restarts as the cost accounting reads them: pure, over its attempt record.

torchrun restarts a node's failed workers in the same pods (``restarts_in_place``); the gang
re-forms and resumes from the newest checkpoint. The attempt record then describes its newest
incarnation in its own fields and lists the earlier ones, oldest first, in ``restarts``, each
with when it started, when its first step began (``first_step_time``), when it ended, its last
step, the steps it lost (``steps_lost``: trained after its newest checkpoint, replayed by the
next incarnation) and its restore. The attempt's steps and times span every incarnation: its
startup ends at the first incarnation's first step, and between two incarnations lie the lost
steps of the one that failed and the restart (its end, the workers' restart, the gang's
re-forming and the restore, up to the next one's first step).

A field a damaged or partial entry lacks counts as unknown (None, or 0 steps).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from trainer.contract import earlier_incarnations
from trainops.cost.clocks import epoch


@dataclass(frozen=True)
class Incarnation:
    """One earlier incarnation of an attempt (an entry of its record's ``restarts``).

    :param first_step: epoch seconds when its first step began (None: it trained none, or
        unknown).
    :param ended: epoch seconds when it ended (None: unknown).
    :param last_step: the steps completed when it ended.
    :param kept_up_to: its last step less the steps it lost: the newest checkpoint the next
        incarnation resumed from.
    :param restore_s: seconds its own resume's checkpoint load took (0: none, or unknown).
    """

    first_step: float | None
    ended: float | None
    last_step: int
    kept_up_to: int
    restore_s: float


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _seconds(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return max(0.0, float(value))
    return 0.0


def earlier(record: Mapping[str, Any] | None) -> list[Incarnation]:
    """The incarnations before the newest, oldest first, on the trainer's clock; [] for an
    attempt that never restarted in place (or a record from before ``restarts``).

    One that left no record (killed before any rank wrote one: ``unknown``) kept what the next
    incarnation resumed from (its ``resumed_from_step``, the record's own for the newest), and
    its steps after that were lost; from a trainer that did not say where incarnations resumed,
    all its steps count as lost."""
    entries = earlier_incarnations(record)
    newest = record.get("resumed_from_step") if isinstance(record, Mapping) else None
    resumed = [*(e.get("resumed_from_step") for e in entries[1:]), newest]
    out = []
    for entry, next_resumed in zip(entries, resumed, strict=False):  # one more: none restarted
        if "last_step" in entry:
            last = _int(entry.get("last_step"))
            kept = max(0, last - _int(entry.get("steps_lost")))
        else:  # no record: it kept where the next one began, and its steps are not known
            last = kept = _int(next_resumed)
        out.append(
            Incarnation(
                first_step=epoch(entry.get("first_step_time")),
                ended=epoch(entry.get("ended_at")),
                last_step=last,
                kept_up_to=kept,
                restore_s=_seconds(entry.get("restore_s")),
            )
        )
    return out


def placed(incarnations: Sequence[Incarnation], offset: float | None) -> list[Incarnation]:
    """``incarnations`` with their times moved by ``offset`` seconds onto the cluster's clock
    (:attr:`trainops.cost.clocks.Window.trainer_offset`); with None, their times are unknown."""
    if offset == 0.0:
        return list(incarnations)
    out = []
    for inc in incarnations:
        first = None if offset is None or inc.first_step is None else inc.first_step + offset
        ended = None if offset is None or inc.ended is None else inc.ended + offset
        out.append(replace(inc, first_step=first, ended=ended))
    return out


def first_steps(incarnations: Sequence[Incarnation], newest: float | None) -> list[float | None]:
    """When each incarnation's first step began, the newest's (``newest``, the record's own
    ``first_step_time``) last."""
    return [inc.first_step for inc in incarnations] + [newest]


def bounds(incarnations: Sequence[Incarnation], newest: float | None) -> list[float]:
    """Where each incarnation's steps end and the next one's begin, one per earlier
    incarnation: the next first step that is known (an incarnation that trained no step has
    no steps); infinity when no later one stepped. A step record of the attempt belongs to
    incarnation :func:`incarnation_of` by its time."""
    firsts = first_steps(incarnations, newest)
    out = []
    for k in range(len(incarnations)):
        later = [t for t in firsts[k + 1 :] if t is not None]
        out.append(min(later) if later else math.inf)
    # a clock step could make a later first step look earlier: keep them in order
    for k in range(len(out) - 2, -1, -1):
        out[k] = min(out[k], out[k + 1])
    return out


def incarnation_of(limits: Sequence[float], time: float) -> int:
    """The incarnation (0 the first) a step that ended at ``time`` belongs to, given the
    :func:`bounds` ``limits``."""
    return bisect_right(limits, time)


def first_step_time(record: Mapping[str, Any] | None) -> float | None:
    """When the attempt's first step began: the first incarnation's that stepped (the record's
    own ``first_step_time`` without restarts); None when none did."""
    newest = epoch(record.get("first_step_time")) if isinstance(record, Mapping) else None
    return next((t for t in first_steps(earlier(record), newest) if t is not None), None)


def restores(record: Mapping[str, Any]) -> tuple[float, float]:
    """``(at startup, in restarts)``: the seconds the attempt's first incarnation's resume took
    to load its checkpoint, and those of every later incarnation's together (the record's own
    ``restore_s`` is the newest's)."""
    own = _seconds(record.get("restore_s"))
    incarnations = earlier(record)
    if not incarnations:
        return own, 0.0
    return incarnations[0].restore_s, sum(inc.restore_s for inc in incarnations[1:]) + own


def recoveries(incarnations: Sequence[Incarnation], newest: float | None) -> list[float]:
    """Each in-place restart's recovery time: from the failed incarnation's end to the next
    first step (the next incarnation's, or a later one's when it trained none, whose restart is
    then part of this one). Unknown ends, and a restart no first step followed, give none."""
    firsts = first_steps(incarnations, newest)
    out = []
    for k, inc in enumerate(incarnations):
        if k > 0 and inc.first_step is None:
            continue  # it never stepped: its restart is part of the one before it
        later = next((t for t in firsts[k + 1 :] if t is not None), None)
        if inc.ended is not None and later is not None:
            out.append(max(0.0, later - inc.ended))
    return out
