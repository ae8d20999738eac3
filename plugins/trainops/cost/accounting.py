"""What a run's attempts cost, phase by phase: pure, over ``job.json`` and the run's metrics.

Each attempt is billed for its accelerators (nodes x GPUs; a CPU node counts as one) over the
cluster's view of it: pod start to end on Kubernetes, the node processes' start to end on the
local backend (``JobState`` ``start_time`` / ``end_time``), and never longer: which clock gives
a bound the cluster did not record, and where the trainer's times sit on the cluster's clock,
is :func:`trainops.cost.clocks.reconcile` (an attempt whose end no clock that agrees with the
cluster's recorded is billed nothing, and ``notes`` says so). That billed time is cut into
phases, so that they add up to it exactly:

- ``queued``: launch to the pod's start (unschedulable, held by Kueue); shown, not billed;
- ``startup``: pod start to the attempt's first step (image pull, rendezvous, model setup,
  resume), and the warm-up of a first step slower than the attempt's median step (the first
  collective, compile); the trainer records when its first step began (``first_step_time``);
- ``productive``: the steps kept, each from the end of the step before it (and of that step's
  checkpoint stall) to its own end, as the metrics' ``time`` stamps say;
- ``replayed``: the steps after the attempt's last committed checkpoint (``steps_lost``):
  lost, and trained again by the next attempt; lost steps that have no metrics record (the
  trainer writes them every ``train.log_every`` steps, so an attempt killed between two reads
  leaves its last steps unrecorded; its attempt record's ``last_step`` counts them) last the
  attempt's median step time each, from its last recorded step on;
- ``restart``: an in-place restart (torchrun's, ``restarts_in_place``; the attempt record's
  ``restarts`` list the earlier incarnations): from the failed incarnation's last progress
  (after its lost steps, which are ``replayed``) to the next incarnation's first step: the
  failure's detection, the workers' restart, the gang's re-forming and the restore. The
  attempt's startup ends at its first incarnation's first step;
- ``checkpoint_stall``: the loop blocked by a save (the records' ``checkpoint_blocked_s``);
- ``shutdown``: the end of the loop to the attempt's end: the emergency checkpoint after
  SIGTERM, the final checkpoint and export of a finished run, or the time a failed or hung
  attempt spent before it was ended. A step trained after the signal is kept by the emergency
  checkpoint, so it counts as productive. An attempt still running has no shutdown yet: the time
  since its last logged step (up to ``now``) is steps trained and not yet logged, productive.

Goodput is productive over billed accelerator-seconds. Recovery time is, per interruption, the
signal (the cluster's time of it where it has one, else the trainer's ``signal_time``; for a
failure or hang, the attempt's last step) to the first step of the next attempt that stepped;
per in-place restart, the failed incarnation's end to the next incarnation's first step.
A field that an older ``job.json`` or attempt record lacks is estimated from what is there, and
the estimate says so in ``notes``; a trainer clock that disagrees with the cluster's is in
``warnings`` (and ``notes``).
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, TypedDict

from trainer.contract import MetricsRecord
from trainops.cost import restarts
from trainops.cost.clocks import attempt_clocks, epoch, reconcile
from trainops.cost.money import money
from trainops.cost.prices import CAPACITY_KINDS, Priced, PriceTable, price_of
from trainops.cost.restarts import Incarnation, incarnation_of
from trainops.cost.rollbacks import RolledBack, rolled_back, rolled_back_before, thrown_away
from trainops.recovery.record import AttemptEntry, JobRecord

COST_FORMAT = "trainops.cost/v1"
PHASES = (
    "queued",
    "startup",
    "productive",
    "replayed",
    "restart",
    "rollback",
    "checkpoint_stall",
    "shutdown",
)
BILLED_PHASES = PHASES[1:]
# The phases of an interrupted attempt (not completed) that the interruption cost, with replayed,
# restart and rollback (lost whatever became of the attempt).
LOST_PHASES = ("startup", "shutdown")
ALWAYS_LOST_PHASES = ("replayed", "restart", "rollback")
# Phases a bill from before them lacks (its readers count them 0), shown only where they happened.
OPTIONAL_PHASES = ("restart", "rollback")


class Span(TypedDict):
    """One stretch of an attempt's timeline: ``phase`` from ``start`` to ``end`` (epoch s)."""

    phase: str
    start: float
    end: float


class AttemptCost(TypedDict):
    """One attempt's bill: its phases (wall seconds), its timeline, and its price."""

    attempt: int
    capacity: str
    instance_type: str | None
    accelerators: int
    outcome: str
    preempted: bool
    start: float
    end: float
    seconds: dict[str, float]
    spans: list[Span]
    billed_gpu_s: float
    cost: float
    on_demand_cost: float
    price: Priced


class RunCost(TypedDict):
    """A run's bill (``job.json`` ``"cost"``): every figure an estimate, in USD. ``warnings``:
    the clocks that disagreed with the cluster's (the operator logs them; a bill from before
    them has none)."""

    format: str
    estimate: bool
    currency: str
    attempts: list[AttemptCost]
    seconds: dict[str, float]
    billed_gpu_hours: float
    productive_gpu_hours: float
    lost_gpu_hours: float
    goodput: float | None
    recovery_s: list[float]
    preemptions: int
    cost: float
    on_demand_cost: float
    savings: float
    notes: list[str]
    warnings: list[str]


def _steps_of(
    metrics: Iterable[MetricsRecord], attempt: int, limits: Sequence[float] = ()
) -> list[MetricsRecord]:
    """The attempt's step records with a time, one per step of each incarnation (the later
    one), by incarnation and step: ``limits`` (:func:`trainops.cost.restarts.bounds`) split them
    by time when it restarted in place, since the next incarnation replays the lost steps."""
    by_step: dict[tuple[int, int], MetricsRecord] = {}
    for record in metrics:
        t = epoch(record.get("time"))
        if record.get("attempt") == attempt and t is not None:
            by_step[(incarnation_of(limits, t), int(record["step"]))] = record
    return [by_step[key] for key in sorted(by_step)]


def _blocked(record: MetricsRecord) -> float:
    value = record.get("checkpoint_blocked_s")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _machine(entry: AttemptEntry, notes: list[str]) -> tuple[str | None, str]:
    """The attempt's instance type (the most common over its nodes) and billing capacity (the
    nodes' own, when the cluster said; else what the attempt asked for)."""
    n = entry["attempt"]
    types = Counter(t["instance_type"] for t in entry.get("node_types") or [] if t.get("instance_type"))
    instance_type = types.most_common(1)[0][0] if types else None
    if len(types) > 1:
        notes.append(
            f"attempt {n}: its nodes ran on {', '.join(sorted(str(t) for t in types))}; "
            f"all priced as {instance_type}"
        )
    said = {str(t.get("capacity_type")) for t in entry.get("node_types") or []} & set(CAPACITY_KINDS)
    capacity = said.pop() if len(said) == 1 else ("on-demand" if entry["capacity"] == "on-demand" else "spot")
    return instance_type, capacity


def _outcome(entry: AttemptEntry) -> tuple[str, bool]:
    record = entry.get("record") or {}
    kind = entry.get("classification")
    outcome = str(record.get("outcome") or kind or "running")
    return outcome, outcome == "preempted" or kind == "preempted"


class _Timeline:
    """Builds an attempt's spans in order, clipped to its billing window ``[start, end]``."""

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end
        self.spans: list[Span] = []

    def add(self, phase: str, start: float, end: float) -> None:
        if phase != "queued":
            start, end = max(start, self.start), min(end, self.end)
        if self.spans:
            start = max(start, self.spans[-1]["end"])
        if end <= start:
            return
        if self.spans and self.spans[-1]["phase"] == phase and self.spans[-1]["end"] == start:
            self.spans[-1]["end"] = end
        else:
            self.spans.append({"phase": phase, "start": start, "end": end})

    def seconds(self) -> dict[str, float]:
        out = dict.fromkeys(PHASES, 0.0)
        for span in self.spans:
            out[span["phase"]] += span["end"] - span["start"]
        return out


def _first_step_begins(
    entry: AttemptEntry, steps: list[MetricsRecord], start: float, notes: list[str], recorded: float | None
) -> float | None:
    """Where the attempt's productive time begins (None: it trained no step): its first
    step's end less that step's productive share, which is no more than the attempt's median
    step time. The rest of a slow first step is warm-up (the first collective, compile,
    allocator growth) and belongs to startup, as the hang watch leaves it out of the median.
    The trainer's first-step time (``recorded``: that of the incarnation that stepped first)
    bounds the step from below; a record from before that field is taken to have stepped at
    its median."""
    if not steps:
        return None
    first_end = epoch(steps[0]["time"]) or start
    typical = _median_step(steps)
    if recorded is not None:
        took = max(0.0, first_end - recorded)
        counted = took if typical is None else min(took, typical)
    else:
        counted = typical or 0.0
        notes.append(
            f"attempt {entry['attempt']}: no first-step time recorded; its first step is taken to have "
            f"lasted its median step time ({counted:.2f}s)"
        )
    return min(max(start, first_end - counted), first_end)


def _median_step(steps: list[MetricsRecord], limits: Sequence[float] = ()) -> float | None:
    """The attempt's median step time, from one step's end (after its save's stall) to the
    next one's within one incarnation (``limits``: a restart in place is no step); None with
    fewer than two steps."""
    times = [epoch(r["time"]) or 0.0 for r in steps]
    gaps = [
        b - a - _blocked(r)
        for a, b, r in zip(times, times[1:], steps, strict=False)
        if incarnation_of(limits, a) == incarnation_of(limits, b)
    ]
    return median(gaps) if gaps else None


def _interrupted_at(entry: AttemptEntry, steps: list[MetricsRecord], end: float) -> float:
    """When an interrupted attempt stopped making progress: when the cluster signalled it (the
    local backend's injected preemption, to the split second), else when the trainer got the
    signal (rank 0's own, or the ranks' agreed stop), else the cluster's time to the second,
    else its last step's end, else its end."""
    state: Mapping[str, Any] = entry.get("state") or {}
    disruptions = state.get("disruptions") or []
    found = [epoch(d.get("time")) for d in disruptions]
    found += [epoch((entry.get("record") or {}).get("signal_time"))]
    found += [epoch(d.get("at")) for d in disruptions]
    found += [epoch(steps[-1]["time"]) if steps else None, end]
    return next(t for t in found if t is not None)


def _placed(
    entry: AttemptEntry, steps: list[MetricsRecord], offset: float | None
) -> tuple[AttemptEntry, list[MetricsRecord]]:
    """``entry`` and its ``steps`` with the trainer's times on the cluster's clock: moved by
    ``offset`` seconds (:attr:`trainops.cost.clocks.Window.trainer_offset`); with None, left
    out (they cannot be placed: no step, first-step or signal time is used)."""
    if offset == 0.0:
        return entry, steps
    record = dict(entry.get("record") or {})
    for key in ("first_step_time", "signal_time"):
        value = epoch(record.get(key))
        if value is not None:
            record[key] = None if offset is None else value + offset
    placed: AttemptEntry = {**entry, "record": record if entry.get("record") is not None else None}
    if offset is None:
        return placed, []
    return placed, [{**r, "time": (epoch(r["time"]) or 0.0) + offset} for r in steps]


@dataclass
class _Trained:
    """What the walk over an attempt's steps needs: its placed steps and incarnations (the
    earlier ones; the newest is the record's own), where one's steps end and the next one's
    begin, and its median step time."""

    n: int
    steps: list[MetricsRecord]
    incarnations: list[Incarnation]
    firsts: list[float | None]  # each incarnation's first step, the newest's last
    limits: list[float]
    typical: float | None
    notes: list[str]
    rollbacks: list[RolledBack]  # the newest incarnation's bad-loss rollbacks

    def incarnation(self, step: MetricsRecord) -> int:
        return incarnation_of(self.limits, epoch(step["time"]) or 0.0)

    def after_rollback(self, timeline: _Timeline, begin: float, end: float) -> float:
        """A bad-loss rollback came before the step that ended at ``end``: from ``begin`` to
        that step's own time (the median step) is the rollback's (its thrown-away steps without
        a record, the wait for a save in flight, the checkpoint load). Returns where the step's
        own time begins."""
        cut = min(max(begin, end - (self.typical or 0.0)), end)
        timeline.add("rollback", begin, cut)
        return cut

    def resume(self, k: int, first_end: float, begin: float) -> float:
        """Where incarnation ``k``'s productive time begins, its first step ending at
        ``first_end``: its first-step time, but no earlier than that end less the median step
        (the rest of a slow first step is warm-up, part of the restart)."""
        at = self.firsts[k]
        floor = first_end - self.typical if self.typical is not None else None
        at = at if at is not None else floor if floor is not None else begin
        if floor is not None:
            at = max(at, floor)
        return min(max(at, begin), first_end)

    def restart(self, timeline: _Timeline, begin: float, k: int, logged: int, resume: float) -> float:
        """Incarnation ``k`` failed after logging step ``logged``: its lost steps that have no
        record (replayed at the median step time), then the restart up to ``resume``."""
        inc = self.incarnations[k]
        unlogged = max(0, min(inc.last_step - logged, inc.last_step - inc.kept_up_to))
        if unlogged and self.typical is not None:
            stop = min(
                begin + unlogged * self.typical, resume, inc.ended if inc.ended is not None else resume
            )
            timeline.add("replayed", begin, stop)
            begin = max(begin, stop)
            self.notes.append(
                f"attempt {self.n}: the last {unlogged} lost step(s) before its restart in place {k + 1}, "
                f"after step {logged}, have no metrics record: billed as replayed at its median step "
                f"time ({self.typical:.2f}s)"
            )
        timeline.add("restart", begin, resume)
        return max(begin, resume)


def _trained(
    timeline: _Timeline,
    walk: _Trained,
    *,
    start: float,
    first: float,
    kept_up_to: int,
    newest_from: int,
    until: float,
) -> tuple[float, int]:
    """The spans from the attempt's start through its last logged step: startup, then each
    step productive (kept), replayed (lost) or rolled back (thrown away by a bad-loss rollback,
    whose checkpoint load comes before the next step), its save's stall, and at each in-place restart
    the lost steps without a record and the restart (``walk``), which lasts ``until`` the
    attempt stopped when its newest incarnation never stepped. Returns where the walk ended
    and the newest incarnation's last logged step (``newest_from``, where it resumed, when it
    logged none)."""
    k = walk.incarnation(walk.steps[0])
    earlier = walk.incarnations
    lead = (
        None if k == 0 else earlier[0].first_step if earlier[0].first_step is not None else earlier[0].ended
    )
    if lead is not None:  # the first incarnation logged no step: its start, its lost steps, its restart
        timeline.add("startup", start, lead)
        walk.restart(timeline, lead, 0, 0, first)
    else:
        timeline.add("startup", start, first)
    begin, logged = first, 0
    for step in walk.steps:
        t = epoch(step["time"]) or begin
        j = walk.incarnation(step)
        if j > k:
            begin = walk.restart(timeline, begin, k, logged, walk.resume(j, t, begin))
            k = j
        kept = earlier[k].kept_up_to if k < len(earlier) else kept_up_to
        number, in_newest = int(step["step"]), k == len(earlier)
        if in_newest and rolled_back_before(walk.rollbacks, logged, number):
            begin = walk.after_rollback(timeline, begin, t)
        phase = "productive" if number <= kept else "replayed"
        timeline.add("rollback" if in_newest and thrown_away(walk.rollbacks, number) else phase, begin, t)
        begin = t + _blocked(step)
        timeline.add("checkpoint_stall", t, begin)
        logged = int(step["step"])
    if k < len(earlier):  # the incarnations after the last that logged a step logged none
        newest = walk.firsts[-1]
        begin = walk.restart(timeline, begin, k, logged, newest if newest is not None else max(begin, until))
        logged = newest_from
    return begin, logged


def account_attempt(
    entry: AttemptEntry,
    metrics: list[MetricsRecord],
    prices: PriceTable,
    notes: list[str],
    now: float | None = None,
    warnings: list[str] | None = None,
) -> tuple[AttemptCost, float | None, float, list[float]]:
    """One attempt's bill, when its first step began (None: it trained no step), when it
    stopped making progress (:func:`_interrupted_at`) and each of its in-place restarts'
    recovery time, all on the cluster's clock.

    :param notes: where to say what was estimated (appended to).
    :param warnings: where to say which clocks disagree (appended to; also said in ``notes``).
    """
    n = entry["attempt"]
    incarnations = restarts.earlier(entry.get("record"))
    steps = _steps_of(
        metrics, n, restarts.bounds(incarnations, epoch((entry.get("record") or {}).get("first_step_time")))
    )
    clocks = attempt_clocks(entry, [epoch(r["time"]) or 0.0 for r in steps])
    window = reconcile(clocks, now=now)
    notes.extend(window.warnings + window.notes)
    if warnings is not None:
        warnings.extend(window.warnings)
    entry, steps = _placed(entry, steps, window.trainer_offset)
    incarnations = restarts.placed(incarnations, window.trainer_offset)
    record = entry.get("record") or {}
    newest_first = epoch(record.get("first_step_time"))
    limits = restarts.bounds(incarnations, newest_first)
    launched, start = window.launched, window.start
    anchor = next((t for t in (start, window.end, launched, clocks.operator.launched) if t is not None), 0.0)
    end = window.end if window.end is not None else anchor
    outcome, preempted = _outcome(entry)
    accelerators = int(entry["nodes"]) * max(1, int(entry["gpus_per_node"]))
    instance_type, capacity = _machine(entry, notes)
    first = None
    timeline = _Timeline(start if start is not None else end, end)
    if start is None:  # never started: queued until it ended
        if launched is not None:
            timeline.add("queued", launched, end)
    elif window.end is None:  # its end is unknown: billed nothing (the notes say so)
        if launched is not None:
            timeline.add("queued", launched, start)
    else:
        if launched is not None:
            timeline.add("queued", launched, start)
        firsts = restarts.first_steps(incarnations, newest_first)
        recorded = firsts[incarnation_of(limits, epoch(steps[0]["time"]) or 0.0)] if steps else None
        first = _first_step_begins(entry, steps, start, notes, recorded)
        # the newest incarnation's own steps lost (the entry's count its restarts' too)
        own = record.get("steps_lost")
        lost = (
            own if isinstance(own, int) and not isinstance(own, bool) else int(entry.get("steps_lost") or 0)
        )
        said = record.get("last_step")
        signal = epoch(record.get("signal_time"))
        if first is None:  # no step: a signal during setup starts the shutdown
            stop = signal if signal is not None else end
            if incarnations and incarnations[0].ended is not None:
                timeline.add("startup", start, incarnations[0].ended)
                timeline.add("restart", incarnations[0].ended, stop)
            else:
                timeline.add("startup", start, stop)
        else:
            typical = _median_step(steps, limits)
            walk = _Trained(n, steps, incarnations, firsts, limits, typical, notes, rolled_back(record))
            newest = [int(r["step"]) for r in steps if walk.incarnation(r) == len(incarnations)]
            resumed = record.get("resumed_from_step")
            newest_from = resumed if isinstance(resumed, int) and incarnations else 0
            logged = newest[-1] if newest else newest_from
            # The trainer writes its step records every train.log_every steps: the steps an
            # interrupted attempt trained after its last read have its record's word, not a record.
            last = said if isinstance(said, int) and not isinstance(said, bool) and said > logged else logged
            begin, logged = _trained(
                timeline,
                walk,
                start=start,
                first=first,
                kept_up_to=last - lost,
                newest_from=newest_from,
                until=signal if signal is not None and outcome != "running" else end,
            )
            unlogged = min(last - logged, lost)
            if unlogged and walk.typical is not None:
                timeline.add("replayed", begin, begin + unlogged * walk.typical)
                notes.append(
                    f"attempt {n}: its last {unlogged} lost step(s), after step {logged}, have no metrics "
                    f"record (they are written every train.log_every steps): billed as replayed at its "
                    f"median step time ({walk.typical:.2f}s)"
                )
        # A running attempt is still training: the time since its last logged step is steps not
        # logged yet (the trainer writes every train.log_every steps), not a shutdown.
        tail = "shutdown" if outcome != "running" else "startup" if first is None else "productive"
        timeline.add(tail, timeline.spans[-1]["end"] if timeline.spans else start, end)
    seconds = timeline.seconds()
    billed_gpu_s = sum(seconds[p] for p in BILLED_PHASES) * accelerators
    priced = price_of(prices, instance_type, capacity)
    on_demand = price_of(prices, instance_type, "on-demand")
    if not priced["known"] and billed_gpu_s:
        notes.append(
            f"attempt {n}: {priced['source']}: priced at {money(priced['per_gpu_hour'])}/GPU-hour {capacity}"
        )
    cost: AttemptCost = {
        "attempt": n,
        "capacity": capacity,
        "instance_type": instance_type,
        "accelerators": accelerators,
        "outcome": outcome,
        "preempted": preempted,
        "start": start if start is not None else end,
        "end": end,
        "seconds": seconds,
        "spans": timeline.spans,
        "billed_gpu_s": billed_gpu_s,
        "cost": billed_gpu_s / 3600 * priced["per_gpu_hour"],
        "on_demand_cost": billed_gpu_s / 3600 * on_demand["per_gpu_hour"],
        "price": priced,
    }
    recovered = (
        restarts.recoveries(incarnations, newest_first)
        if window.end is not None and start is not None
        else []
    )
    return cost, first, _interrupted_at(entry, steps, end), recovered


def account(
    job: JobRecord, metrics: list[MetricsRecord], prices: PriceTable, now: float | None = None
) -> RunCost:
    """The run's bill from its ``job.json`` and metrics records (every attempt's).

    :param prices: from :func:`trainops.cost.prices.load_prices`.
    :param now: epoch seconds, the end of an attempt that has not ended (a running run's
        report); None: its last step.
    """
    notes: list[str] = []
    warnings: list[str] = []
    attempts: list[AttemptCost] = []
    firsts: list[float | None] = []
    stops: list[float] = []
    in_place: list[list[float]] = []
    for entry in job["attempts"]:
        cost, first, stopped, restarted = account_attempt(entry, metrics, prices, notes, now, warnings)
        attempts.append(cost)
        firsts.append(first)
        stops.append(stopped)
        in_place.append(restarted)
    recovery: list[float] = []
    for i, cost in enumerate(attempts):
        recovery += in_place[i]  # its restarts in place came before its own end
        if cost["outcome"] in ("completed", "running") or i + 1 == len(attempts):
            continue
        if i > 0 and firsts[i] is None and attempts[i - 1]["outcome"] not in ("completed", "running"):
            continue  # interrupted before its first step: part of the earlier interruption's recovery
        later = next((f for f in firsts[i + 1 :] if f is not None), None)
        if later is not None:
            recovery.append(max(0.0, later - stops[i]))
    seconds = {p: sum(a["seconds"][p] for a in attempts) for p in PHASES}
    billed = sum(a["billed_gpu_s"] for a in attempts)
    productive = sum(a["seconds"]["productive"] * a["accelerators"] for a in attempts)
    lost = sum(
        (
            _sum(a, ALWAYS_LOST_PHASES)
            + (0.0 if a["outcome"] in ("completed", "running") else _sum(a, LOST_PHASES))
        )
        * a["accelerators"]
        for a in attempts
    )
    total, on_demand = sum(a["cost"] for a in attempts), sum(a["on_demand_cost"] for a in attempts)
    return {
        "format": COST_FORMAT,
        "estimate": True,
        "currency": "USD",
        "attempts": attempts,
        "seconds": seconds,
        "billed_gpu_hours": billed / 3600,
        "productive_gpu_hours": productive / 3600,
        "lost_gpu_hours": lost / 3600,
        "goodput": productive / billed if billed else None,
        "recovery_s": recovery,
        "preemptions": sum(1 for a in attempts if a["preempted"]),
        "cost": total,
        "on_demand_cost": on_demand,
        "savings": on_demand - total,
        "notes": list(dict.fromkeys(notes)),
        "warnings": list(dict.fromkeys(warnings)),
    }


def _sum(attempt: AttemptCost, phases: Iterable[str]) -> float:
    return sum(attempt["seconds"][p] for p in phases)


def stored_cost(job: Mapping[str, Any]) -> RunCost | None:
    """The RunCost that ``job.json`` holds (``"cost"``, written when the run ended), or None
    for a run older than it (then call :func:`account`)."""
    cost = job.get("cost")
    if isinstance(cost, dict) and cost.get("format") == COST_FORMAT:
        return cost  # type: ignore[return-value]
    return None
