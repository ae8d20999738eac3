"""Is a running attempt hung? A pure function of its heartbeat, its start and the clock.

Rank 0 writes a heartbeat (``trainer.runtime.heartbeat``) as it steps; a rank that hangs (a stuck
collective, a stopped process, a dead NIC) stops every rank at the next collective, so the
heartbeat's step stops moving. No new step for the hang timeout means hung.

The timeout is ``hang_timeout`` when set. Otherwise it is derived from the attempt's own pace:
``max(HANG_FLOOR_S, HANG_INTERVALS x the heartbeat interval, HANG_STEP_FACTOR x pace)``, where
the pace is the larger of the p99 step time and the longest gap between two steps (which holds
loss reads and metrics flushes), both over the steps after the attempt's first
:data:`~trainer.contract.HEARTBEAT_WARMUP_STEPS` (none yet: the first two terms). Why these
numbers:

- ``HANG_STEP_FACTOR`` (10) over a tail figure, not a median: a step 10 times slower than the
  slowest 1% of this attempt's steps, or than its longest pause between steps, is not
  jitter. A false hang costs a whole-gang relaunch and the work since the last checkpoint; a
  late detection costs the gang's idle time, so the factor leans to caution.
- ``HANG_FLOOR_S`` (30 s): below that, what the pace does not see dominates: a heartbeat is up
  to one interval old when read (10 s by default), a metrics flush may ride out a storage outage
  for 10 s, and the clocks of the trainer and the triggerer may differ by a second or two. A
  run of sub-second steps (the tiny demo) gets 30 s, so a SIGSTOPped rank is found about the
  timeout and a poll (5 s) after its last step. The idle time is counted from the step's own
  time, which the next write carries, so the heartbeat's interval adds nothing to that.
- ``HANG_INTERVALS`` (3): with a longer heartbeat interval (``$TRAINOPS_HEARTBEAT_EVERY_S``), the
  heartbeat's own age must stay a third of the timeout at most.

Until the first step after warm-up is done (rendezvous, data, checkpoint load, compile: no
pace yet) and while rank 0 is ``busy`` in an operation that stops stepping on purpose (a
checkpoint save, the export), the startup allowance comes on top, whatever gave the timeout, so
such a pause is not a hang, and a hang inside it is still caught, later. A heartbeat of an older trainer, without a pace, keeps the former
rule, ``max(10 min, 20 x the median step time)``, so a triggerer upgraded during a run never
finds a hang earlier than before.

An in-place restart (torchrun's ``restarts_in_place``) is the same attempt and the same
heartbeat object: the failed incarnation's last beat stands while the gang re-forms, then the new
incarnation's loop beats from its checkpoint step, lower than the step last beaten, with no step
of its own yet. Only times count here, never step numbers, so that beat is a new start and gets
the startup allowance; the silence before it must fit in the limit in force (30 s at least), or
be marked ``busy``, as a save is.

The idle time is counted from the heartbeat's step (or the start or end of a busy operation,
whichever is later), but never from before the watch could see: after an outage of the
heartbeat's storage (which the trainer's writes met too), or a triggerer restart, the clock
starts again when reads work, so a stale heartbeat is never a hang.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
import re
from dataclasses import dataclass
from typing import Final, Literal

from trainer.contract import HEARTBEAT_WARMUP_STEPS, Heartbeat

HANG_FLOOR_S: Final = 30.0  # a derived timeout is never shorter than 30 s
HANG_STEP_FACTOR: Final = 10.0  # ... nor than 10 x the pace (p99 step or longest gap)
HANG_INTERVALS: Final = 3.0  # ... nor than 3 heartbeat intervals (a heartbeat's age when read)
LEGACY_FLOOR_S: Final = 600.0  # a heartbeat without a pace (an older trainer): at least 10 min
LEGACY_STEP_FACTOR: Final = 20.0  # ... and 20 median steps
STARTUP_ALLOWANCE_S: Final = 1800.0  # extra time for the first steps and busy operations

Source = Literal["setting", "pace", "no pace yet", "former rule"]


@dataclass(frozen=True)
class HangLimit:
    """How long the watch waits for the next step, and why.

    :param timeout_s: the hang timeout (the setting, or derived).
    :param rule: how the timeout came about, with its numbers (``hang_timeout 30s, derived:
        max(...)``).
    :param source: which rule gave it: ``setting`` (``hang_timeout``), ``pace`` (derived from
        the attempt's pace), ``no pace yet`` (derived, during warm-up) or ``former rule`` (a
        heartbeat without a pace, or none yet).
    :param allowance_s: the startup allowance on top (0: none now).
    :param allowance_for: what the allowance is for (``the first steps``, ``busy: checkpoint
        save``); None without one.
    """

    timeout_s: float
    rule: str
    source: Source
    allowance_s: float = 0.0
    allowance_for: str | None = None

    @property
    def total_s(self) -> float:
        """The seconds without a step that mean hung now."""
        return self.timeout_s + self.allowance_s

    def describe(self) -> str:
        """The limit in words: ``limit 1830s: hang_timeout 30s, derived: ... + 1800s startup
        allowance (the first steps)``."""
        allowance = (
            f" + {self.allowance_s:.0f}s startup allowance ({self.allowance_for})" if self.allowance_s else ""
        )
        return f"limit {self.total_s:.0f}s: {self.rule}{allowance}"


def _pace(heartbeat: Heartbeat) -> tuple[float, str] | None:
    """The attempt's pace, the larger of its p99 step time and its longest gap between steps,
    named; None before there is one."""
    p99, gap = heartbeat["p99_step_s"], heartbeat["max_gap_s"]
    if gap is not None and (p99 is None or gap > p99):
        return gap, f"longest gap between steps {gap:.2f}s"
    if p99 is not None:
        return p99, f"p99 step time {p99:.2f}s"
    return None


def _derived(heartbeat: Heartbeat) -> tuple[float, str, Source] | None:
    """The timeout derived from a heartbeat that has a pace or says its interval (this
    writer's), and its rule; None for an older writer's heartbeat without a pace."""
    pace, every = _pace(heartbeat), heartbeat["every_s"]
    if pace is None and every is None:
        return None
    terms = [(HANG_FLOOR_S, f"{HANG_FLOOR_S:.0f}s")]
    if every is not None:
        terms.append((HANG_INTERVALS * every, f"{HANG_INTERVALS:.0f} x heartbeat interval {every:g}s"))
    if pace is not None:
        terms.append((HANG_STEP_FACTOR * pace[0], f"{HANG_STEP_FACTOR:.0f} x {pace[1]}"))
    timeout = max(value for value, _ in terms)
    texts = ", ".join(text for _, text in terms)
    rule = f"hang_timeout {timeout:.0f}s, derived: max({texts}){'' if pace else ', no pace yet'}"
    return timeout, rule, "pace" if pace else "no pace yet"


def _timeout(setting: float | None, heartbeat: Heartbeat | None) -> tuple[float, str, Source]:
    """The hang timeout, its rule and its source: the setting, the pace, or the former rule."""
    if setting is not None:
        return float(setting), f"hang_timeout {setting:.0f}s", "setting"
    derived = _derived(heartbeat) if heartbeat is not None else None
    if derived is not None:
        return derived
    median = heartbeat["median_step_s"] if heartbeat else None
    timeout = max(LEGACY_FLOOR_S, LEGACY_STEP_FACTOR * (median or 0.0))
    pace = f"{LEGACY_STEP_FACTOR:.0f} x median step time {median:.2f}s" if median else "no step time yet"
    return timeout, f"hang_timeout {timeout:.0f}s, derived: max({LEGACY_FLOOR_S:.0f}s, {pace})", "former rule"


def hang_limit(
    heartbeat: Heartbeat | None, setting: float | None, startup_allowance_s: float = STARTUP_ALLOWANCE_S
) -> HangLimit:
    """The limit the watch applies to ``heartbeat`` now (see the module docstring).

    :param heartbeat: the attempt's latest heartbeat (None: none written yet).
    :param setting: the operator's ``hang_timeout`` (None: derived).
    :param startup_allowance_s: extra time for the first steps and busy operations.
    """
    timeout, rule, source = _timeout(setting, heartbeat)
    if heartbeat is not None and heartbeat["busy"] is not None:
        return HangLimit(timeout, rule, source, startup_allowance_s, f"busy: {heartbeat['busy']}")
    if heartbeat is None or heartbeat["steps"] <= HEARTBEAT_WARMUP_STEPS:
        return HangLimit(timeout, rule, source, startup_allowance_s, "the first steps")
    return HangLimit(timeout, rule, source)


def hang_timeout_s(setting: float | None, heartbeat: Heartbeat | None) -> float:
    """The hang timeout for ``heartbeat``, without any startup allowance (see :func:`hang_limit`)."""
    return _timeout(setting, heartbeat)[0]


def _last_sign_of_life(heartbeat: Heartbeat) -> float:
    """When rank 0 was last seen alive: its step, or the start or end of a busy operation."""
    marks = (heartbeat["time"], heartbeat["busy_since"], heartbeat["busy_ended"])
    return max(mark for mark in marks if mark is not None)


def hang_verdict(
    *,
    heartbeat: Heartbeat | None,
    watched_since: float | None,
    now: float,
    setting: float | None,
    startup_allowance_s: float = STARTUP_ALLOWANCE_S,
) -> str | None:
    """Why the attempt is hung, in a sentence for the task log and job.json; None while it is not.

    :param heartbeat: the attempt's latest heartbeat (None: none written yet).
    :param watched_since: since when the watcher has seen the attempt running and its heartbeat
        readable without a break (None: not yet, so no hang can be told: a pending attempt is
        the scheduler's, not a hang).
    :param now: the watcher's clock, epoch seconds like the heartbeat's ``time``.
    :param setting: the operator's ``hang_timeout`` (None: derived).
    :param startup_allowance_s: extra time for the first steps and busy operations.
    """
    if watched_since is None:
        return None
    limit = hang_limit(heartbeat, setting, startup_allowance_s)
    if heartbeat is None:
        idle = now - watched_since
        if idle <= limit.total_s:
            return None
        return f"no step and no heartbeat {idle:.0f}s after the attempt started running ({limit.describe()})"
    idle = now - max(_last_sign_of_life(heartbeat), watched_since)
    if idle <= limit.total_s:
        return None
    step = heartbeat["step"]
    if heartbeat["busy"] is not None:
        what = f"rank 0 was still busy ({heartbeat['busy']}) after step {step}"
    elif heartbeat["steps"] == 0:
        what = f"its first step (after step {step}) never finished"
    else:
        what = f"step {step + 1} never finished"
    return f"no new step for {idle:.0f}s: {what} ({limit.describe()})"


_LIMIT = re.compile(r"\(limit (\d+)s: (.*)\)$")


def limit_in_verdict(verdict: str) -> tuple[float, str] | None:
    """The limit a :func:`hang_verdict` sentence names, as ``(seconds, how)``, for the run
    report; None for any other text (an older or foreign reason)."""
    found = _LIMIT.search(verdict.strip())
    return (float(found.group(1)), found.group(2)) if found else None
