"""A run's cost and goodput on its report page: the timeline picture and the cost table.

Drawn from the run's ``RunCost`` (``trainops.cost/v1``, the ``cost`` of its ``job.json``; see
:mod:`trainops.cost.accounting`): one bar per attempt over wall time, coloured by phase, a mark
where a preemption ended an attempt, and beside it what each attempt cost at spot and at
on-demand prices, and the lost time by cause (:mod:`trainops.cost.causes`). A run older than the accounting has no ``cost``: :func:`cost_section` then
accounts for it from its ``job.json`` and metrics, or says in one sentence why it cannot.

Pure functions, no I/O. ``job.json`` is data and may be hostile or from another version, so
every value is checked before it is drawn and escaped before it is shown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from trainer.contract import MetricsRecord
from trainops.cost.accounting import OPTIONAL_PHASES, account
from trainops.cost.causes import CAUSE_LABELS, lost_by_cause
from trainops.cost.money import money
from trainops.cost.prices import load_prices
from trainops.reports.html import dicts, escape, folded, list_of, table

if TYPE_CHECKING:
    from trainops.recovery.record import JobRecord

__all__ = [
    "COST_FORMAT",
    "PHASE_COLOURS",
    "PHASE_LABELS",
    "TIMELINE_BOX",
    "cause_table",
    "cost_section",
    "cost_table",
    "duration",
    "gpu_hours",
    "is_live",
    "percent",
    "run_cost",
    "svg_timeline",
]

COST_FORMAT = "trainops.cost/v1"
# Okabe and Ito's palette, which stays distinct under the common colour-vision deficiencies;
# queued is grey because it is not billed.
PHASE_COLOURS = {
    "queued": "#bbbbbb",
    "startup": "#e69f00",
    "productive": "#009e73",
    "replayed": "#d55e00",
    "restart": "#0072b2",
    "rollback": "#f0e442",
    "checkpoint_stall": "#56b4e9",
    "shutdown": "#cc79a7",
}
PHASE_LABELS = {
    "queued": "queued (not billed)",
    "startup": "startup",
    "productive": "productive",
    "replayed": "replayed",
    "restart": "restart in place",
    "rollback": "rolled back (bad loss)",
    "checkpoint_stall": "checkpoint stall",
    "shutdown": "shutdown",
}
# The plot area of the timeline: left, top, width (pixels); each attempt is one row below top.
TIMELINE_BOX = (140.0, 28.0, 824.0)
_ROW_H, _BAR_H, _WIDTH = 30.0, 20.0, 980
# Tick spacings the time axis may use, in seconds: readable steps of a clock.
_TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_MAX_TICKS = 8


def _num(value: object) -> float | None:
    """``value`` as a finite float, None for anything else (a bool, a string, NaN)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _dict(value: object) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}


def gpu_hours(value: object) -> str:
    """GPU-hours with three decimals, or ``-``."""
    hours = _num(value)
    return "-" if hours is None else f"{hours:,.3f}"


def percent(value: object) -> str:
    """A fraction as a percentage with one decimal, or ``-``."""
    fraction = _num(value)
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def duration(seconds: object) -> str:
    """Seconds as ``77.5 s`` (under 10 minutes), ``14 min 05 s`` or ``2 h 03 min``; ``-`` for a
    missing value."""
    s = _num(seconds)
    if s is None:
        return "-"
    if abs(s) < 600:
        return f"{s:.1f} s"
    whole = round(s)
    if abs(whole) < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _clock(seconds: float) -> str:
    """An axis label: elapsed time as ``m:ss`` or ``h:mm:ss``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _tick_step(span: float) -> float:
    """The smallest readable spacing that puts at most :data:`_MAX_TICKS` intervals on ``span``."""
    for step in _TICK_STEPS:
        if span / step <= _MAX_TICKS:
            return float(step)
    return float(math.ceil(span / _MAX_TICKS / 86400) * 86400)


# ----------------------------------------------------------------------------- timeline


def _spans(attempt: dict[str, Any]) -> list[tuple[str, float, float]]:
    """The attempt's spans that can be drawn: a known phase, finite times, end not before start."""
    out = []
    for span in dicts(attempt.get("spans")):
        phase, start, end = span.get("phase"), _num(span.get("start")), _num(span.get("end"))
        if (
            isinstance(phase, str)
            and phase in PHASE_COLOURS
            and start is not None
            and end is not None
            and end >= start
        ):
            out.append((str(phase), start, end))
    return out


def _attempt_label(attempt: dict[str, Any], index: int) -> str:
    number = attempt.get("attempt", index + 1)
    capacity = attempt.get("capacity")
    return f"attempt {number}" + (f" ({capacity})" if isinstance(capacity, str) and capacity else "")


def svg_timeline(cost: dict[str, Any]) -> str:
    """An inline SVG: one bar per attempt over wall time, a rectangle per phase span.

    Every rectangle carries ``data-attempt``, ``data-phase`` and ``data-seconds`` and a tooltip
    (``<title>``); a preempted attempt gets a black mark at its end (``class="preemption"``), and
    an attempt still running the word "running" inside its bar's end (``class="running"``).
    The time axis is elapsed wall time from the first span's start, with ticks at a readable
    spacing (seconds, minutes or hours). No script, no external references.
    """
    attempts = dicts(cost.get("attempts"))
    rows = [(a, _spans(a)) for a in attempts]
    times = [t for _, spans in rows for _, start, end in spans for t in (start, end)]
    left, top, plot_w = TIMELINE_BOX
    height = top + max(1, len(rows)) * _ROW_H + 58
    out = [
        f'<svg class="chart timeline" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" '
        f'height="{height:.0f}" viewBox="0 0 {_WIDTH} {height:.0f}" role="img" '
        'aria-label="Attempts over wall time, by phase"><title>Attempts over wall time, by phase</title>'
    ]
    if not times:
        out.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{top + 14:.1f}" text-anchor="middle">'
            "no timeline: the cost record holds no phase spans</text></svg>"
        )
        return "".join(out)
    t0, t1 = min(times), max(times)
    wall = max(t1 - t0, 1e-9)
    scale = plot_w / wall

    def x_of(t: float) -> float:
        return left + (t - t0) * scale

    bottom = top + len(rows) * _ROW_H
    step = _tick_step(wall)
    tick = 0.0
    while tick <= wall + 1e-9:
        x = x_of(t0 + tick)
        out.append(
            f'<line x1="{x:.2f}" y1="{top - 4}" x2="{x:.2f}" y2="{bottom}" stroke="#d0d7de"/>'
            f'<text class="tick" x="{x:.2f}" y="{bottom + 14:.1f}" text-anchor="middle">'
            f"{_clock(tick)}</text>"
        )
        tick += step
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{bottom + 30:.1f}" text-anchor="middle">'
        "wall time since the first launch (m:ss, h:mm:ss)</text>"
    )
    for i, (attempt, spans) in enumerate(rows):
        y = top + i * _ROW_H + (_ROW_H - _BAR_H) / 2
        number = escape(attempt.get("attempt", i + 1))
        out.append(
            f'<text class="row" x="{left - 8}" y="{y + _BAR_H - 4:.1f}" text-anchor="end">'
            f"{escape(_attempt_label(attempt, i))}</text>"
        )
        for phase, start, end in spans:
            seconds = end - start
            out.append(
                f'<rect class="phase" data-attempt="{number}" data-phase="{phase}" '
                f'data-seconds="{seconds:.3f}" x="{x_of(start):.2f}" y="{y:.1f}" '
                f'width="{seconds * scale:.2f}" height="{_BAR_H}" fill="{PHASE_COLOURS[phase]}">'
                f"<title>attempt {number}: {PHASE_LABELS[phase]}, {escape(duration(seconds))}</title></rect>"
            )
        if attempt.get("outcome") == "running" and spans:  # said inside its bar's end, when it fits
            begin, x = x_of(min(start for _, start, _ in spans)), x_of(max(end for _, _, end in spans))
            if x - begin >= 60:
                out.append(
                    f'<text class="running" data-attempt="{number}" x="{x - 4:.2f}" '
                    f'y="{y + _BAR_H - 6:.1f}" text-anchor="end">running</text>'
                )
        if attempt.get("preempted") is True and spans:
            x = x_of(max(end for _, _, end in spans))
            out.append(
                f'<path class="preemption" data-attempt="{number}" '
                f'd="M{x:.2f} {y - 1:.1f}l-5 -7h10zM{x - 0.75:.2f} {y - 1:.1f}h1.5v{_BAR_H + 2}h-1.5z" '
                f'fill="#000"><title>attempt {number} preempted</title></path>'
            )
    happened = {phase for _, spans in rows for phase, _, _ in spans}
    out.append(_legend(bottom + 48, happened))
    return "".join(out) + "</svg>"


def _legend(y: float, happened: set[str] | frozenset[str] = frozenset()) -> str:
    """The phases' colours (a restart in place's and a rollback's only where one ``happened``),
    then the preemption mark, on one row below the axis."""
    out, x = [], 8.0
    for phase, colour in PHASE_COLOURS.items():
        if phase in OPTIONAL_PHASES and phase not in happened:
            continue
        label = PHASE_LABELS[phase]
        out.append(
            f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="12" height="10" fill="{colour}"/>'
            f'<text class="legend" x="{x + 16:.1f}" y="{y:.1f}">{label}</text>'
        )
        x += 22 + 6.2 * len(label)
    out.append(
        f'<path d="M{x + 12:.1f} {y:.1f}l-5 -8h10z" fill="#000"/>'
        f'<text class="legend" x="{x + 22:.1f}" y="{y:.1f}">preemption</text>'
    )
    return "".join(out)


# ----------------------------------------------------------------------------- the table


def _price_cells(attempt: dict[str, Any]) -> list[str]:
    """The price per GPU-hour and where it comes from; flagged when no table knew the type."""
    price = _dict(attempt.get("price"))
    rate = _num(price.get("per_gpu_hour"))
    source = price.get("source")
    cells = [escape(f"{money(rate)}" if rate is not None else "-"), escape(source if source else "-")]
    return cells if price.get("known") is not False else [f'<span class="fail">{c}</span>' for c in cells]


_PHASE_COLUMNS = (
    "productive",
    "replayed",
    "restart",
    "rollback",
    "startup",
    "checkpoint_stall",
    "shutdown",
    "queued",
)


def _outcome(attempt: dict[str, Any]) -> str:
    outcome = attempt.get("outcome", "-")
    preempted = attempt.get("preempted") is True and outcome != "preempted"
    return escape(outcome) + (" (preempted)" if preempted else "")


def cost_table(cost: dict[str, Any]) -> str:
    """The run's goodput, losses and savings, then two tables per attempt and in total: the
    wall time of each phase, and the money (HTML). Two narrow tables rather than one wide one,
    so that both fit a laptop's window."""
    attempts = dicts(cost.get("attempts"))
    totals = _dict(cost.get("seconds"))
    # a restart in place's and a rollback's columns only where there was one
    columns = tuple(p for p in _PHASE_COLUMNS if p not in OPTIONAL_PHASES or (_num(totals.get(p)) or 0) > 0)
    time_header = [
        "Attempt (time by phase)",
        "Capacity",
        "Instance type",
        "GPUs",
        "Outcome",
        *(escape(PHASE_LABELS[p][0].upper() + PHASE_LABELS[p][1:]) for p in columns),
    ]
    money_header = [
        "Attempt (money)",
        "GPU-hours billed",
        "Price per GPU-hour (estimate)",
        "Price source",
        "Cost (estimate)",
        "On-demand equivalent (estimate)",
        "Savings (estimate)",
    ]
    time_rows, money_rows = [], []
    for i, a in enumerate(attempts):
        seconds = _dict(a.get("seconds"))
        cost_, on_demand = _num(a.get("cost")), _num(a.get("on_demand_cost"))
        billed = _num(a.get("billed_gpu_s"))
        number = escape(a.get("attempt", i + 1))
        time_rows.append(
            [
                number,
                escape(a.get("capacity", "-")),
                escape(a.get("instance_type") or "unknown"),
                escape(a.get("accelerators", "-")),
                _outcome(a),
                *(escape(duration(seconds.get(p))) for p in columns),
            ]
        )
        money_rows.append(
            [
                number,
                escape(gpu_hours(billed / 3600 if billed is not None else None)),
                *_price_cells(a),
                escape(money(cost_)),
                escape(money(on_demand)),
                escape(money(on_demand - cost_ if cost_ is not None and on_demand is not None else None)),
            ]
        )
    total = "<strong>Total</strong>"
    time_rows.append(
        [
            total,
            "",
            "",
            "",
            escape(f"{len(attempts)} attempt(s)"),
            *(escape(duration(totals.get(p))) for p in columns),
        ]
    )
    money_rows.append(
        [
            total,
            escape(gpu_hours(cost.get("billed_gpu_hours"))),
            "",
            "",
            escape(money(cost.get("cost"))),
            escape(money(cost.get("on_demand_cost"))),
            escape(money(cost.get("savings"))),
        ]
    )
    recovery = [duration(r) for r in list_of(cost.get("recovery_s")) if _num(r) is not None]
    summary = [
        ("Goodput (productive / billed GPU time)", percent(cost.get("goodput"))),
        ("Cost (estimate)", money(cost.get("cost"))),
        ("On-demand equivalent (estimate)", money(cost.get("on_demand_cost"))),
        ("Spot savings (estimate)", money(cost.get("savings"))),
        ("GPU-hours billed", gpu_hours(cost.get("billed_gpu_hours"))),
        ("GPU-hours productive", gpu_hours(cost.get("productive_gpu_hours"))),
        ("GPU-hours lost to preemptions and failures", gpu_hours(cost.get("lost_gpu_hours"))),
        ("Preemptions", str(cost.get("preemptions", "-"))),
        ("Recovery time (interruption to the next first step)", ", ".join(recovery) or "-"),
    ]
    summary_html = (
        '<table class="cost-summary">'
        + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary)
        + "</table>"
    )
    per_attempt = table(time_header, time_rows) + table(money_header, money_rows)
    return summary_html + folded(
        "Time and money per attempt",
        per_attempt,
        note=f"{len(attempts)} attempt(s): wall time by phase, GPU-hours, prices, cost and savings",
    )


def cause_table(cost: dict[str, Any], attempts: object) -> str:
    """The run's lost time by cause (HTML): wall time, billed GPU-seconds and cost of each cause,
    the GPU-seconds it waited for without paying, and the line that adds them up to the bill.

    :param attempts: ``job.json``'s attempts (their records hold the restore and emergency save
        times); anything else counts as none.
    """
    lost = lost_by_cause(cost, dicts(attempts))
    header = [
        "Lost time by cause",
        "Wall time",
        "GPU-seconds billed",
        "Cost (estimate)",
        "GPU-seconds not billed",
    ]
    rows = [
        [
            escape(CAUSE_LABELS[c["cause"]][0].upper() + CAUSE_LABELS[c["cause"]][1:]),
            escape(duration(c["seconds"] + c["unbilled_seconds"])),
            escape(f"{c['gpu_s']:,.0f}"),
            escape(money(c["cost"])),
            escape(f"{c['unbilled_gpu_s']:,.0f}"),
        ]
        for c in lost["causes"]
    ]
    rows.append(
        [
            "<strong>Productive</strong>",
            "",
            escape(f"{lost['productive_gpu_s']:,.0f}"),
            escape(money(lost["productive_cost"])),
            "",
        ]
    )
    adds_up = (
        f"Productive + causes = billed: {lost['productive_gpu_s']:,.0f} + {lost['unproductive_gpu_s']:,.0f} = "
        f"{lost['billed_gpu_s']:,.0f} GPU-seconds; {money(lost['productive_cost'])} + "
        f"{money(lost['unproductive_cost'])} = {money(lost['cost'])}. Waiting for capacity and the wait "
        "before a relaunch hold no GPU and are not billed."
    )
    notes = "".join(f"<li>{escape(n)}</li>" for n in lost["notes"])
    return (
        '<div class="causes">'
        + table(header, rows)
        + f'<p class="muted">{escape(adds_up)}</p>'
        + (f'<ul class="notes">{notes}</ul>' if notes else "")
        + "</div>"
    )


def _notes(cost: dict[str, Any]) -> str:
    notes = [n for n in list_of(cost.get("notes")) if isinstance(n, str) and n]
    if not notes:
        return ""
    return '<p>Notes:</p><ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>"


# ----------------------------------------------------------------------------- the section


def is_live(job: Mapping[str, Any]) -> bool:
    """Whether the run is still going: the training operator writes ``status: running`` from
    its first launch until the run ends (and again when a clear or re-run restarts it)."""
    return job.get("status") == "running"


def _accounted(
    job: dict[str, Any], records: Sequence[MetricsRecord] | None, now: float | None
) -> tuple[dict[str, Any] | None, str]:
    """``(RunCost, how)`` for a run whose job.json holds none, from the accounting now, or
    ``(None, why not)`` in one sentence. A live run has no cost yet because it has not ended
    (the operator writes it then); an older finished run because it predates the accounting."""
    if is_live(job):
        lead, no = "This run is still running", "No cost yet: this run is still running"
    else:
        lead, no = (
            "This run's job.json predates cost accounting",
            "No cost: this run's job.json predates cost accounting",
        )
    if records is None:
        return None, f"{no}, and its metrics, which the accounting needs, could not be read."
    try:
        prices, source = load_prices(None, None)
        cost = account(cast("JobRecord", job), list(records), prices, now=now)
    except Exception as exc:  # any failure of an older record is a sentence, never a 500
        why = f"its job.json has no field {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else exc
        return None, f"{no}, and accounting for it failed: {why}."
    if is_live(job):
        return (
            dict(cost),
            f"{lead}: the figures below are accounted up to now (prices: {source}); its final bill is written when it ends.",
        )
    return dict(cost), f"{lead}: the figures below were computed now (prices: {source})."


def run_cost(
    job: dict[str, Any], records: Sequence[MetricsRecord] | None, *, now: float | None = None
) -> tuple[object, str]:
    """``(the run's cost record, how it was found)``: the ``cost`` its ``job.json`` holds (how:
    ""), else its accounting now (how: the sentence that says so), else ``(None, why not)``.
    The record is what ``job.json`` holds, unchecked: :func:`cost_section` checks it."""
    cost = job.get("cost")
    if cost is not None:
        return cost, ""
    return _accounted(job, records, now)


def cost_section(
    job: dict[str, Any],
    records: Sequence[MetricsRecord] | None,
    *,
    now: float | None = None,
    found: tuple[object, str] | None = None,
) -> str:
    """The "Cost and goodput" section of a run's report: the timeline and the cost table.

    :param job: the run's ``job.json``; its ``cost`` (a ``RunCost``) is drawn when present.
    :param records: the run's metrics records, None when they could not be read; used only to
        account for a run whose ``job.json`` has no ``cost``.
    :param now: the time a running attempt is accounted up to (epoch seconds).
    :param found: what :func:`run_cost` returned for this run, when the caller has it already.
    """
    head = "<h2>Cost and goodput (estimates)</h2>"
    cost, how = found if found is not None else run_cost(job, records, now=now)
    if cost is None:
        return f'{head}<p class="muted">{escape(how)}</p>'
    if not isinstance(cost, dict):
        return (
            f'{head}<p class="fail">The cost in job.json is not a record ({escape(type(cost).__name__)}).</p>'
        )
    if cost.get("format") != COST_FORMAT:
        return (
            f'{head}<p class="fail">The cost in job.json has format {escape(cost.get("format"))}, '
            f"which this version does not read (it reads {COST_FORMAT}).</p>"
        )
    currency = cost.get("currency", "USD")
    caption = (
        f'<p class="muted">Every figure is an estimate, in {escape(currency)}: billed time as the '
        "cluster saw it, priced as each attempt's Price source says; not an invoice."
        + (f" {escape(how)}" if how else "")
        + "</p>"
    )
    return (
        head
        + caption
        + svg_timeline(cost)
        + cost_table(cost)
        + cause_table(cost, job.get("attempts"))
        + _notes(cost)
    )
