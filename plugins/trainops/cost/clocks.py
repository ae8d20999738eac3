"""Which clock an attempt's bill is read from: pure, over typed records.

Three clocks stamp an attempt's times, and they need not agree:

- the **cluster's**: the API server's timestamps (the pods' ``status.startTime``, the trainer
  containers' ``startedAt`` and ``finishedAt``, the Job's ``creationTimestamp``) and when the
  backend saw the attempt end (a pod whose node vanished never gets a ``finishedAt``); on the
  local backend, the supervisor's clock;
- the **trainer's** (rank 0's host): its attempt record's ``started_at``, ``ended_at``,
  ``first_step_time`` and ``signal_time``, and the metrics records' ``time``;
- the **operator's** (the Airflow worker's): ``launched_at`` and ``ended_at`` in ``job.json``.

The billed window (:func:`reconcile`) comes from the cluster's times. Another clock fills a
bound the cluster did not record only when it agrees with the cluster's within
:data:`TOLERANCE_S` on the times both have; two bounds from clocks that were never compared are
never paired (a start on one clock and an end on another, hours apart, was how a few simulated
minutes came to be billed as 16,000 GPU-hours). A bound no agreeing clock gives is unknown, and
said so. A trainer whose clock disagrees is warned about, naming both times and the attempt;
its steps are still placed on the timeline (the phases) by the offset measured between its own
start and its containers' start, since the difference of two of its own times is sound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainer.contract import earlier_incarnations
from trainops.cluster.base import FINAL_PHASES
from trainops.recovery.record import AttemptEntry

# Seconds two clocks may differ on one event and still agree: the trainer's program starts a
# little after its container (torchrun's rendezvous, imports) and writes its record a little
# before its container exits. Far below the hours a wrong clock makes, far above NTP's drift.
TOLERANCE_S = 120.0


@dataclass(frozen=True)
class ClusterTimes:
    """The cluster's times of an attempt (epoch seconds; None: not recorded).

    :param launched: the job object's ``creationTimestamp``.
    :param start: the first pod's ``status.startTime`` (local: the first node process's start).
    :param gang_start: the last trainer container's ``startedAt``: the gang could assemble, so
        the trainer's program could start, only then.
    :param end: the last trainer container's ``finishedAt``, once every pod has one (local: the
        last node process's exit).
    :param observed: when the backend read the state the attempt ended with.
    :param final: that state was final (succeeded, failed or lost): the attempt was seen over.
    """

    launched: float | None = None
    start: float | None = None
    gang_start: float | None = None
    end: float | None = None
    observed: float | None = None
    final: bool = False


@dataclass(frozen=True)
class TrainerTimes:
    """The trainer's times of an attempt, on its own clock (epoch seconds; None: not recorded).

    :param stamps: every other time it wrote: its first step, the signal, each step's end.
    :param stepped: it logged at least one step.
    """

    start: float | None = None
    end: float | None = None
    stamps: tuple[float, ...] = ()
    stepped: bool = False


@dataclass(frozen=True)
class OperatorTimes:
    """The operator's times of an attempt: its launch and when it saw the attempt end."""

    launched: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class AttemptClocks:
    """Everything :func:`reconcile` weighs for attempt ``attempt``; ``ended``: the operator
    recorded its end (``job.json`` ``ended_at``)."""

    attempt: int
    cluster: ClusterTimes
    trainer: TrainerTimes
    operator: OperatorTimes
    ended: bool = True


@dataclass(frozen=True)
class Window:
    """An attempt's billed window on the cluster's clock (epoch seconds).

    :param launched: its launch (the queue's start); None: unknown.
    :param start: where billing starts; None: it never started, or it is unknown (``notes``).
    :param end: where billing ends; None: unknown (``notes``).
    :param trainer_offset: seconds to add to the trainer's times to put them on the cluster's
        clock (0 when they agree); None: they cannot be placed.
    :param notes: what was estimated or left unknown, in words.
    :param warnings: clocks that disagree, naming both times and the attempt.
    """

    launched: float | None
    start: float | None
    end: float | None
    trainer_offset: float | None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def epoch(value: object) -> float | None:
    """An ISO 8601 / RFC 3339 time (as the records write them) or epoch seconds, as epoch
    seconds; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def stamp(t: float) -> str:
    """Epoch seconds as RFC 3339 UTC, as the API server writes times."""
    text = datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return text.replace(".000Z", "Z")


def duration(seconds: float) -> str:
    """``3h00m05s``, ``4m05s``, ``12.5s``."""
    s = abs(seconds)
    if s >= 3600:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m{int(s % 60):02d}s"
    if s >= 60:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{s:.1f}s"


def attempt_clocks(entry: AttemptEntry, step_times: list[float]) -> AttemptClocks:
    """The clocks of one ``job.json`` attempt entry and its metrics' step times (the trainer's).

    :param step_times: the ``time`` of each of the attempt's metrics records.
    """
    state: dict[str, Any] = dict(entry.get("state") or {})
    record: dict[str, Any] = dict(entry.get("record") or {})
    # An attempt restarted in place: its record's own times are its newest incarnation's; the
    # trainer started with its first (``restarts``, oldest first), and stamped each one's times.
    earlier = earlier_incarnations(record)
    started = next(
        (t for t in (epoch(e.get("started_at")) for e in [*earlier, record]) if t is not None), None
    )
    stamps = [epoch(record.get("first_step_time")), epoch(record.get("signal_time")), *step_times]
    stamps += [epoch(e.get(key)) for e in earlier for key in ("first_step_time", "ended_at")]
    return AttemptClocks(
        attempt=entry["attempt"],
        cluster=ClusterTimes(
            launched=epoch(state.get("launch_time")),
            start=epoch(state.get("start_time")),
            gang_start=epoch(state.get("gang_start_time")),
            end=epoch(state.get("end_time")),
            observed=epoch(state.get("observed_time")),
            final=state.get("phase") in FINAL_PHASES,
        ),
        trainer=TrainerTimes(
            start=started,
            end=epoch(record.get("ended_at")),
            stamps=tuple(t for t in stamps if t is not None),
            stepped=bool(step_times),
        ),
        operator=OperatorTimes(launched=epoch(entry.get("launched_at")), end=epoch(entry.get("ended_at"))),
        ended="ended_at" in entry,
    )


def _trainer_disagreement(clocks: AttemptClocks, tolerance_s: float) -> tuple[str, str] | None:
    """``(whose clock, how)`` the trainer's clock disagrees with: the cluster's, or the
    operator's when the cluster recorded no pod time; ``how`` names both times. None when it
    agrees."""
    c, t, o = clocks.cluster, clocks.trainer, clocks.operator
    own = [x for x in (t.start, t.end, *t.stamps) if x is not None]
    if not own:
        return None
    if t.start is not None and c.gang_start is not None and abs(t.start - c.gang_start) > tolerance_s:
        return "the cluster's", (
            f"the trainer says it started at {stamp(t.start)}, its containers started by "
            f"{stamp(c.gang_start)}"
        )
    pods = c.start is not None or c.gang_start is not None or c.end is not None
    whose = "the cluster's" if pods else "the operator's"
    floor = (c.start, "its first pod started") if pods else (o.launched, "the operator launched it")
    if floor[0] is not None and min(own) < floor[0] - tolerance_s:
        return whose, f"the trainer stamped {stamp(min(own))}, yet {floor[1]} at {stamp(floor[0])}"
    ceiling = (c.end, "its last container finished") if pods else (o.end, "the operator saw it end")
    if ceiling[0] is not None and max(own) > ceiling[0] + tolerance_s:
        return whose, f"the trainer stamped {stamp(max(own))}, yet {ceiling[1]} at {stamp(ceiling[0])}"
    return None


def _operator_disagreement(clocks: AttemptClocks, tolerance_s: float) -> str | None:
    """How the operator's clock disagrees with the cluster's, naming both times; None when it
    agrees (or nothing compares them)."""
    c, o = clocks.cluster, clocks.operator
    if o.launched is not None and c.launched is not None and abs(o.launched - c.launched) > tolerance_s:
        return (
            f"the operator launched it at {stamp(o.launched)}, the cluster created it at {stamp(c.launched)}"
        )
    first = c.start if c.start is not None else c.gang_start
    if o.launched is not None and first is not None and o.launched > first + tolerance_s:
        return f"the operator launched it at {stamp(o.launched)}, yet its first pod started at {stamp(first)}"
    seen = [x for x in (c.start, c.gang_start, c.end, c.observed if c.final else None) if x is not None]
    if o.end is not None and seen and o.end < max(seen) - tolerance_s:
        return f"the operator saw it end at {stamp(o.end)}, yet the cluster stamped {stamp(max(seen))}"
    return None


def _trainer_offset(clocks: AttemptClocks) -> float | None:
    """The trainer's clock less the cluster's, measured on the one event both stamp: its
    start (its containers' start), else its end (its containers' end); None: not measurable."""
    c, t = clocks.cluster, clocks.trainer
    if t.start is not None and c.gang_start is not None:
        return t.start - c.gang_start
    if t.end is not None and c.end is not None:
        return t.end - c.end
    return None


def _trainer_warning(clocks: AttemptClocks, tolerance_s: float) -> tuple[str | None, float | None]:
    """``(warning, offset)``: the warning when the trainer's clock disagrees (None: it agrees),
    and the seconds to add to its times to place them on the cluster's clock (0 when it
    agrees; None when they cannot be placed)."""
    disagreement = _trainer_disagreement(clocks, tolerance_s)
    if disagreement is None:
        return None, 0.0
    whose, how = disagreement
    ahead = _trainer_offset(clocks)
    measured = "" if ahead is None else f" ({'ahead' if ahead > 0 else 'behind'} by {duration(ahead)})"
    placed = (
        "its steps are placed by that offset"
        if ahead is not None
        else "its steps cannot be placed on that clock, so its time is not split into phases"
    )
    warning = (
        f"attempt {clocks.attempt}: the trainer's clock disagrees with {whose}{measured}: {how}; "
        f"billed on {whose} times, {placed}"
    )
    return warning, None if ahead is None else -ahead


def _start(clocks: AttemptClocks, launched: float | None, trainer_ok: bool, notes: list[str]) -> float | None:
    """Where billing starts: the first pod's start, else the trainer's start when its clock
    agrees, else (it stepped) its launch; None: it never started."""
    n, c, t = clocks.attempt, clocks.cluster, clocks.trainer
    if c.start is not None:
        return c.start
    if t.start is not None and trainer_ok:
        notes.append(f"attempt {n}: no pod start time recorded; billed from the trainer's start")
        return t.start
    if t.stepped and launched is not None:
        notes.append(f"attempt {n}: no start time recorded; billed from its launch")
        return launched
    return None


def _end(
    clocks: AttemptClocks,
    agree: tuple[bool, bool],
    placed_stamps: list[float],
    fallback: float | None,
    now: float | None,
) -> tuple[float | None, str | None]:
    """``(where billing ends, a note)``: the last container's end, else when the cluster saw
    the attempt over, else the trainer's end or the operator's sighting when their clock
    agrees, else now (or its last step) for an attempt that has not ended, else when it was
    last seen; ``(None, None)``: unknown. The note words a bound that is not the pods' end."""
    n, c, t, o = clocks.attempt, clocks.cluster, clocks.trainer, clocks.operator
    trainer_ok, operator_ok = agree
    if c.end is not None:
        return c.end, None
    if c.final and c.observed is not None:
        return c.observed, (
            f"attempt {n}: no pod end time recorded (a pod gone with its node, or still stopping): "
            f"billed up to when the cluster was seen to end it ({stamp(c.observed)})"
        )
    if t.end is not None and trainer_ok:
        return t.end, f"attempt {n}: no pod end time recorded; billed up to the trainer's end"
    if o.end is not None and operator_ok:
        return o.end, f"attempt {n}: no pod end time recorded; billed up to when the operator saw it end"
    if not clocks.ended:
        if now is not None:
            return now, f"attempt {n} has not ended: billed up to now"
        last = max([*placed_stamps, fallback or 0.0])
        return last, f"attempt {n} has not ended: billed up to its last step"
    if c.observed is not None:
        return c.observed, (
            f"attempt {n}: its end is unknown: billed up to when it was last seen running "
            f"({stamp(c.observed)}), which it may have outlasted"
        )
    return None, None


def reconcile(clocks: AttemptClocks, *, now: float | None = None, tolerance_s: float = TOLERANCE_S) -> Window:
    """The attempt's billed window from its clocks: the cluster's times, a missing one filled
    only from a clock that agrees with the cluster's (see the module docstring).

    :param now: the end of an attempt that has not ended (a running run's report); None: its
        last step, as far as it can be placed.
    :param tolerance_s: how far two clocks may differ on one event and still agree.
    """
    n, c, o = clocks.attempt, clocks.cluster, clocks.operator
    notes: list[str] = []
    warning, offset = _trainer_warning(clocks, tolerance_s)
    warnings = (warning,) if warning else ()
    operator_off = _operator_disagreement(clocks, tolerance_s)
    operator_ok = operator_off is None
    launched = c.launched if c.launched is not None else o.launched if operator_ok else None
    start = _start(clocks, launched, warning is None, notes)
    placed = [x + offset for x in clocks.trainer.stamps] if offset is not None else []
    end, said = _end(clocks, (warning is None, operator_ok), placed, start or launched, now)
    if said is not None and (start is not None or not clocks.ended):  # a queued attempt bills nothing
        notes.append(said)
    if not operator_ok and (
        (c.launched is None and o.launched is not None) or (end is None and o.end is not None)
    ):
        notes.append(
            f"attempt {n}: the operator's times disagree with the cluster's ({operator_off}), "
            "so none of them is used"
        )
    if start is None:  # never started: queued from its launch to its end; billed nothing
        if end is not None and launched is not None:
            end = max(end, launched)
        return Window(launched, None, end, offset, tuple(notes), warnings)
    if end is None:
        notes.append(
            f"attempt {n}: its end is unknown (no clock that agrees with the cluster's recorded it): "
            "not billed, so the run's cost leaves it out"
        )
        return Window(launched, start, None, offset, tuple(notes), warnings)
    return Window(launched, start, max(end, start), offset, tuple(notes), warnings)
