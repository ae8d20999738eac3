"""When to checkpoint: every ``checkpoint.every_steps`` steps, or ``auto``.

``auto`` picks the interval from what the run measures, and re-picks it at every save:

- **Young/Daly.** With a checkpoint costing the loop ``delta`` seconds and a failure every
  ``M`` seconds on average, the interval that loses the least time is about
  ``sqrt(2 x delta x M)`` (Young 1974; Daly 2006). Saves are asynchronous here, so ``delta`` is
  what the loop is blocked per save (the copy to CPU memory, and any wait for the previous save).
- **Keep up.** A save runs in the background until its commit; the next one must not be due
  before (:data:`KEEP_UP` times the slowest of the last :data:`COMMITS_KEPT` saves' times to
  commit: one upload slower than the one before must not make the next save wait), or the
  loop would wait for it. This also bounds the work a
  preemption without notice loses: the steps since the newest commit, at most one interval plus
  one upload, so under two intervals.
- ``M`` is 3600 / the preemption rate: ``checkpoint.preemptions_per_hour``, or the rate this
  run's own attempts show (:func:`observed_rate`) when that is higher.

An attempt's first save comes :data:`FIRST_SAVE_STEPS` after it starts (nothing is measured
before), the next as many steps later (the first upload is measured then), and from there on
the rule decides, from figures every rank agreed on (the trainer sums them over the ranks).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

FIRST_SAVE_STEPS = 10  # an attempt's first saves, before any cost is measured
KEEP_UP = 1.25  # the interval is at least this many times a recent save's time to commit
COMMITS_KEPT = 3  # ... the slowest of the last three
MAX_INTERVAL_S = 3600.0  # never more than an hour of work between checkpoints
MIN_OBSERVED_S = 1800.0  # a rate observed over less time than this says little


def young_daly_s(cost_s: float, mtbf_s: float) -> float:
    """The interval, in seconds, that loses the least time to checkpoints and failures."""
    return math.sqrt(2.0 * max(cost_s, 0.0) * mtbf_s)


@dataclass(frozen=True)
class Interval:
    """An ``auto`` interval: ``steps`` (``seconds`` of training), and why, in words."""

    steps: int
    seconds: float
    why: str


def auto_interval(*, step_s: float, blocked_s: float, commit_s: float, mtbf_s: float) -> Interval:
    """The next interval, from the mean step time (the loop's, saves left out), the last save's
    blocking of the loop, the last save's time from its start to its commit, and the MTBF."""
    step_s = max(step_s, 1e-6)
    optimum = young_daly_s(blocked_s, mtbf_s)
    keep_up = KEEP_UP * commit_s
    seconds = min(max(optimum, keep_up, step_s), max(MAX_INTERVAL_S, keep_up))
    steps = max(1, math.ceil(seconds / step_s))
    which = "Young/Daly" if optimum >= keep_up else "keep-up"
    why = (
        f"{which}: max(sqrt(2 x blocked {blocked_s:.2f}s x MTBF {mtbf_s / 3600:.3g}h) = {optimum:.0f}s, "
        f"{KEEP_UP:g} x commit {commit_s:.1f}s = {keep_up:.0f}s) at {step_s:.3g}s per step"
    )
    return Interval(steps, round(steps * step_s, 1), why)


def _epoch(text: object) -> float | None:
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text else None
    except ValueError:
        return None


def observed_rate(records: Iterable[Mapping[str, Any]]) -> float | None:
    """Preemptions per hour over the run's earlier attempt records (``started_at`` to
    ``ended_at``); None while they cover less than :data:`MIN_OBSERVED_S`."""
    seconds, preempted = 0.0, 0
    for record in records:
        start, end = _epoch(record.get("started_at")), _epoch(record.get("ended_at"))
        if start is None or end is None or end < start:
            continue
        seconds += end - start
        preempted += record.get("outcome") == "preempted"
    return preempted * 3600.0 / seconds if seconds >= MIN_OBSERVED_S else None


def mtbf_s(configured_per_hour: float, observed_per_hour: float | None) -> float:
    """Seconds between preemptions: from the higher of the configured and observed rates."""
    return 3600.0 / max(configured_per_hour, observed_per_hour or 0.0)


class Cadence:
    """Which steps save: every ``every_steps`` (fixed), or ``auto`` from the measured figures.

    :param every_steps: ``checkpoint.every_steps``; 0 is ``auto``.
    :param start: the step the attempt starts at.
    """

    def __init__(self, every_steps: int, start: int, mtbf: float):
        self.fixed = every_steps if every_steps > 0 else None
        self.mtbf_s = mtbf
        self.next_step = start + FIRST_SAVE_STEPS
        self.interval: Interval | None = None
        self.saves = 0
        # (monotonic seconds, step) of the last save's start, or of the loop's: the caller's
        # clock, from which the pace until the next save is timed
        self.mark: tuple[float, int] = (0.0, start)
        self.commits: deque[float] = deque(maxlen=COMMITS_KEPT)  # recent saves' times to commit

    @property
    def auto(self) -> bool:
        return self.fixed is None

    def due(self, step: int) -> bool:
        """Whether a regular save is due after ``step``."""
        if self.fixed is not None:
            return step % self.fixed == 0
        return step >= self.next_step

    def saved(self, step: int, *, step_s: float, blocked_s: float, commit_s: float | None) -> Interval | None:
        """``auto``: a save of ``step`` started; the next is set from the agreed figures (the
        new interval, None while still measuring or when fixed). ``commit_s`` is the previous
        save's time to commit (None: no previous save committed in this attempt); the slowest of
        the last :data:`COMMITS_KEPT` is what the interval keeps up with."""
        if self.fixed is not None:
            return None
        self.saves += 1
        if commit_s is None:  # the first save: its upload is measured at the next one
            self.next_step = step + FIRST_SAVE_STEPS
            return None
        self.commits.append(commit_s)
        self.interval = auto_interval(
            step_s=step_s, blocked_s=blocked_s, commit_s=max(self.commits), mtbf_s=self.mtbf_s
        )
        self.next_step = step + self.interval.steps
        return self.interval
