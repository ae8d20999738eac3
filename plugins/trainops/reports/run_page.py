"""The training run page: a run's ``job.json`` and its metrics as one HTML page.

Status, cost and goodput (the timeline of attempts by phase and the cost table, from
:mod:`trainops.reports.cost_page`), the loss curve as an inline SVG (one line per attempt, so a
resume after a preemption shows), throughput per attempt and the attempts table; pure
functions, no I/O. It is built from the page primitives of :mod:`trainops.reports.html`, so
every report page looks and is escaped the same way.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence

from trainer.contract import METRICS_DIR, MetricsRecord, metrics_records
from trainops.reports.cost_page import cost_section
from trainops.reports.html import (
    dicts,
    escape,
    json_value,
    not_json_page,
    object_name,
    page,
    raw_json,
    redact,
    report_link,
    scalar,
    table,
)
from trainops.reports.pages import TEXT_SUFFIXES, render_report

__all__ = ["CHART_COLOURS", "MAX_CHART_POINTS", "render_run_report", "run_report", "svg_line_chart"]


CHART_COLOURS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#6e7781")
_DASHES = ("", "6 3", "2 3", "9 3 2 3")
MAX_CHART_POINTS = 1000  # per series; longer series are thinned evenly (first and last kept)
_LEGEND_ENTRY_W, _LEGEND_ROW_H = 190, 18


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tick(value: float) -> str:
    """An axis label: integers as such, other numbers with 4 significant digits."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _domain(values: list[float]) -> tuple[float, float]:
    """``(min, max)`` of ``values``, widened around a single value so it can be scaled
    (by at least 1 around a whole number, such as a step)."""
    lo, hi = min(values), max(values)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        if float(lo).is_integer():
            pad = max(1.0, float(round(pad)))
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _thin(points: list, limit: int = MAX_CHART_POINTS) -> list:
    """At most ``limit`` evenly spaced points, keeping the first and the last."""
    if len(points) <= limit:
        return points
    stride = math.ceil((len(points) - 1) / (limit - 1))
    kept = points[::stride]
    return kept if kept[-1] is points[-1] else [*kept, points[-1]]


def _svg_text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(text)}</text>'


def _svg_frame(box: tuple[float, float, float, float]) -> str:
    left, top, width, height = box
    return (
        f'<line x1="{left}" y1="{top}" x2="{left + width}" y2="{top}" stroke="#d0d7de" '
        f'stroke-dasharray="3 3"/><path d="M{left} {top}V{top + height}H{left + width}" '
        'fill="none" stroke="#57606a"/>'
    )


def _svg_axes(
    box: tuple[float, float, float, float], x_dom: tuple, y_dom: tuple, x_label: str, y_label: str
) -> str:
    """The frame, the min/max labels of both axes and the axis titles."""
    left, top, width, height = box
    bottom, right = top + height, left + width
    return "".join(
        [
            _svg_frame(box),
            _svg_text(left - 6, top + 4, _tick(y_dom[1]), "end", ' class="tick y-max"'),
            _svg_text(left - 6, bottom, _tick(y_dom[0]), "end", ' class="tick y-min"'),
            _svg_text(left, bottom + 14, _tick(x_dom[0]), "start", ' class="tick x-min"'),
            _svg_text(right, bottom + 14, _tick(x_dom[1]), "end", ' class="tick x-max"'),
            _svg_text(left + width / 2, bottom + 28, x_label, "middle"),
            _svg_text(
                14, top + height / 2, y_label, "middle", f' transform="rotate(-90 14 {top + height / 2:.1f})"'
            ),
        ]
    )


def _svg_legend(labels: list[str], left: float, top: float, width: float) -> str:
    per_row = max(1, int(width // _LEGEND_ENTRY_W))
    out = []
    for i, label in enumerate(labels):
        x = left + (i % per_row) * _LEGEND_ENTRY_W
        y = top + (i // per_row) * _LEGEND_ROW_H
        out.append(
            f'<line x1="{x}" y1="{y - 4}" x2="{x + 22}" y2="{y - 4}" '
            f'stroke="{CHART_COLOURS[i % len(CHART_COLOURS)]}" stroke-width="2"'
            f"{_dash(i)}/>" + _svg_text(x + 28, y, label, extra=' class="legend"')
        )
    return "".join(out)


def _dash(i: int) -> str:
    dash = _DASHES[i % len(_DASHES)]
    return f' stroke-dasharray="{dash}"' if dash else ""


def svg_line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    width: int = 720,
    height: int = 260,
    x_label: str = "step",
    y_label: str = "loss",
    title: str = "",
    y_from_zero: bool = False,
) -> str:
    """An inline SVG line chart: one polyline per ``(label, [(x, y), ...])`` series.

    Each series has its own colour and dash pattern and a dot at its first point (where an
    attempt starts, or resumes); a legend follows the plot. The axes span the data, labelled
    with its minimum and maximum; with ``y_from_zero`` the y axis starts at 0 (amounts and
    shares, where a cut axis would make a small change look large). Points with a non-finite coordinate are left out; with no
    point at all the chart says "no data". No script, no external references.
    """
    series = [
        (str(label), [(float(x), float(y)) for x, y in points if _finite(x) and _finite(y)])
        for label, points in series
    ]
    left, right, top, bottom = 64, 16, 12, 40
    box = (left, top, width - left - right, height - top - bottom)
    rows = math.ceil(len(series) / max(1, int(box[2] // _LEGEND_ENTRY_W))) if series else 0
    total = height + rows * _LEGEND_ROW_H
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{total}" viewBox="0 0 {width} {total}" role="img" '
        f'aria-label="{escape(title or y_label + " by " + x_label)}">'
    ]
    if title:
        out.append(f"<title>{escape(title)}</title>")
    xs = [x for _, points in series for x, _ in points]
    ys = [y for _, points in series for _, y in points]
    if not xs:
        out.append(_svg_frame(box))
        out.append(_svg_text(left + box[2] / 2, top + box[3] / 2, "no data", "middle"))
        return "".join(out) + "</svg>"
    x_dom, y_dom = _domain(xs), _domain([0.0, *ys] if y_from_zero and min(ys) >= 0 else ys)
    out.append(_svg_axes(box, x_dom, y_dom, x_label, y_label))

    def at(x: float, y: float) -> tuple[float, float]:
        return (
            left + (x - x_dom[0]) / (x_dom[1] - x_dom[0]) * box[2],
            top + box[3] - (y - y_dom[0]) / (y_dom[1] - y_dom[0]) * box[3],
        )

    for i, (label, points) in enumerate(series):
        if not points:
            continue
        colour = CHART_COLOURS[i % len(CHART_COLOURS)]
        scaled = [at(x, y) for x, y in _thin(sorted(points))]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in scaled)
        out.append(
            f'<polyline data-series="{escape(label)}" points="{coords}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5" stroke-linejoin="round"{_dash(i)}/>'
        )
        out.append(f'<circle cx="{scaled[0][0]:.1f}" cy="{scaled[0][1]:.1f}" r="3" fill="{colour}"/>')
    out.append(_svg_legend([label for label, _ in series], left, height + 4, box[2]))
    return "".join(out) + "</svg>"


# ----------------------------------------------------------------------------- run report

_OUTCOME_CLASS = {
    "succeeded": "pass",
    "error": "fail",
    "infra": "fail",
    "failed": "fail",
    "hung": "fail",
    "timeout": "fail",
}


def _by_attempt(records: list[dict]) -> dict[object, list[dict]]:
    """Metrics records grouped by attempt, in attempt order (numbered attempts first)."""
    groups: dict[object, list[dict]] = {}
    for rec in records:
        attempt = rec.get("attempt")
        groups.setdefault(attempt if isinstance(attempt, (int, str)) else None, []).append(rec)
    order = sorted(groups, key=lambda a: (0, a, "") if isinstance(a, int) else (1, 0, str(a)))
    return {a: groups[a] for a in order}


def _attempt_name(attempt: object) -> str:
    return f"attempt {attempt}" if attempt is not None else "attempt ?"


def _last(recs: list[dict]) -> dict:
    """The record of the highest step (the later one in the file for a repeated step)."""
    return max(reversed(recs), key=lambda r: r["step"])


def _loss_points(recs: list[dict]) -> list[tuple[int, float]]:
    """``(step, loss)`` with a finite loss; a repeated step keeps its later record."""
    points = {r["step"]: float(r["loss"]) for r in recs if _finite(r.get("loss"))}
    return sorted(points.items())


def _outcome(value: object) -> str:
    css = _OUTCOME_CLASS.get(str(value))
    return f'<span class="{css}">{escape(value)}</span>' if css else scalar(value)


def _run_summary(uri: str, job: dict, final: dict | None, metrics_uri: str | None) -> str:
    attempts = dicts(job.get("attempts"))
    lost = [a["steps_lost"] for a in attempts if _finite(a.get("steps_lost"))]
    rows = [
        ("Status", _outcome(job.get("status", "unknown"))),
        ("Attempts", scalar(len(attempts))),
        ("Preemptions", scalar(job.get("preemptions"))),
        ("Infrastructure failures", scalar(job.get("infra_failures"))),
        ("Steps lost to interruptions", scalar(sum(lost)) if lost else None),
        ("Last logged step", scalar(final["step"]) if final else None),
        ("Loss at that step", scalar(final.get("loss")) if final else None),
        ("Cluster", scalar(job.get("cluster")) if "cluster" in job else None),
        ("Capacity (latest)", scalar(job.get("capacity")) if "capacity" in job else None),
    ]
    for label, key in (("Config", "config_uri"), ("Run prefix", "run_uri")):
        value = job.get(key)
        if isinstance(value, str) and value:
            rows.append(
                (
                    label,
                    report_link(value) if value.endswith(TEXT_SUFFIXES) else f"<code>{escape(value)}</code>",
                )
            )
    if metrics_uri:  # a file (an older run's metrics.jsonl) is a link; the parts are a folder
        rows.append(
            (
                "Metrics",
                report_link(metrics_uri)
                if metrics_uri.endswith(TEXT_SUFFIXES)
                else f"<code>{escape(metrics_uri)}</code>",
            )
        )
    return (
        "<table>"
        + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows if v is not None)
        + "</table>"
    )


def _loss_section(groups: dict, metrics_read: bool, metrics_problem: str | None, outcomes: dict) -> str:
    head = "<h2>Loss</h2>"
    if not metrics_read:
        why = metrics_problem or "no metrics were found next to job.json"
        return f'{head}<p class="muted">No loss curve: {escape(why)}.</p>'
    series = [
        (_attempt_name(a) + (f" ({outcomes[a]})" if a in outcomes else ""), _loss_points(recs))
        for a, recs in groups.items()
    ]
    bad = [
        (a, r["step"]) for a, recs in groups.items() for r in recs if "loss" in r and not _finite(r["loss"])
    ]
    note = ""
    if bad:
        note = (
            f'<p class="fail">The loss was not a finite number (NaN or infinite) at '
            f"{len(bad)} logged step(s), first at step {escape(bad[0][1])} of "
            f"{escape(_attempt_name(bad[0][0]))}; those steps are not drawn.</p>"
        )
    if not any(points for _, points in series):
        return f'{head}{note}<p class="muted">No loss values have been logged yet.</p>'
    many = any(len(points) > MAX_CHART_POINTS for _, points in series)
    caption = (
        '<p class="muted">Loss by step, one line per attempt; a dot marks where an '
        "attempt starts (a resume starts at the last committed checkpoint)."
        + (f" Long attempts are drawn with {MAX_CHART_POINTS} evenly spaced points." if many else "")
        + "</p>"
    )
    return head + note + svg_line_chart(series, title="Training loss by step") + caption


def _throughput(groups: dict) -> str:
    has_mfu = any(_finite(r.get("mfu")) for recs in groups.values() for r in recs)
    header = ["Attempt", "Logged steps", "Steps", "Median tokens/s", "Last tokens/s", "Last loss"] + (
        ["Median MFU"] if has_mfu else []
    )
    rows = []
    for attempt, recs in groups.items():
        last = _last(recs)
        speeds = [r["tokens_per_s"] for r in recs if _finite(r.get("tokens_per_s"))]
        mfus = [r["mfu"] for r in recs if _finite(r.get("mfu"))]
        row = [
            escape(_attempt_name(attempt)),
            scalar(len(recs)),
            escape(f"{min(r['step'] for r in recs)} to {last['step']}"),
            _rate(statistics.median(speeds)) if speeds else "-",
            _rate(last.get("tokens_per_s")),
            scalar(last.get("loss")),
        ]
        if has_mfu:
            row.append(escape(f"{100 * statistics.median(mfus):.1f}%") if mfus else "-")
        rows.append(row)
    if not rows:
        return ""
    return f"<h2>Throughput</h2>{table([escape(h) for h in header], rows)}"


def _rate(value: object) -> str:
    return escape(f"{value:,.0f}") if _finite(value) else scalar(value)


def _cell(value: object) -> str:
    return '<span class="muted">-</span>' if value is None else scalar(value)


def _node_types(value: object) -> str:
    nodes = dicts(value)
    if not nodes:
        return '<span class="muted">-</span>' if not value else json_value(value)
    parts = []
    for node in nodes:
        kind = node.get("instance_type") or "?"
        capacity = f" ({node['capacity_type']})" if node.get("capacity_type") else ""
        parts.append(f"node {node.get('index', '?')}: {kind}{capacity}")
    return "<br>".join(escape(p) for p in parts)


def _attempts_table(job: dict) -> str:
    attempts = dicts(job.get("attempts"))
    if not attempts:
        return '<h2>Attempts</h2><p class="muted">No attempt has been launched yet.</p>'
    running = job.get("status") == "running"
    rows = []
    for i, a in enumerate(attempts):
        ended = a.get("ended_at")
        if ended is None and running and i == len(attempts) - 1:
            ended_cell = '<span class="muted">running</span>'
        else:
            ended_cell = _cell(ended)
        decision = a.get("decision")
        decision = decision.get("reason") if isinstance(decision, dict) else decision
        outcome = a.get("classification")
        rows.append(
            [
                _cell(a.get("attempt", i + 1)),
                _cell(a.get("capacity")),
                _cell(a.get("launched_at")),
                ended_cell,
                _cell(outcome) if outcome is None else _outcome(outcome),
                _cell(a.get("reason")),
                _cell(a.get("steps_lost")),
                _node_types(a.get("node_types")),
                _cell(decision),
            ]
        )
    header = [
        "Attempt",
        "Capacity",
        "Launched",
        "Ended",
        "Classification",
        "Reason",
        "Steps lost",
        "Node types",
        "Decision",
    ]
    return f"<h2>Attempts</h2>{table(header, rows)}"


def run_report(
    job: dict,
    metrics: str | Sequence[MetricsRecord] | None,
    *,
    uri: str = "",
    metrics_problem: str | None = None,
    metrics_uri: str | None = None,
    now: float | None = None,
) -> str:
    """A training run's report (HTML, no page around it) from its ``job.json`` and metrics.

    :param job: the run's ``job.json``, parsed.
    :param metrics: its records as :class:`trainer.contract.MetricsReader` merged them, or the
        text of one ``metrics.jsonl`` (the previous version's file), or None when they could
        not be read (the page then says so, with ``metrics_problem`` as the reason, and draws
        no curve).
    :param uri: the job.json's storage URI, for links to the config and the metrics.
    :param metrics_uri: where the metrics were read, for the summary; by default, beside
        ``uri``: its ``metrics.jsonl`` for a text, its ``metrics/`` folder for records.
    :param now: the time a running run is accounted up to, when its ``job.json`` holds no
        ``cost`` (see :func:`trainops.reports.cost_page.cost_section`).
    """
    redacted = redact(job)
    job = redacted if isinstance(redacted, dict) else {}  # redact keeps a dict a dict
    records = metrics_records(metrics) if isinstance(metrics, str) else list(metrics or [])
    groups = _by_attempt(records)
    final = _last([r for recs in groups.values() for r in recs]) if groups else None
    outcomes = {
        a.get("attempt"): a["classification"]
        for a in dicts(job.get("attempts"))
        if isinstance(a.get("classification"), str)
    }
    if metrics_uri is None and metrics is not None and uri.endswith("/job.json"):
        folder = uri[: -len("job.json")]
        metrics_uri = folder + ("metrics.jsonl" if isinstance(metrics, str) else f"{METRICS_DIR}/")
    return (
        _run_summary(uri, job, final, metrics_uri if metrics is not None else None)
        + cost_section(job, records if metrics is not None else None, now=now)
        + _loss_section(groups, metrics is not None, metrics_problem, outcomes)
        + _throughput(groups)
        + _attempts_table(job)
    )


def _run_title(uri: str) -> str:
    parts = uri.split("/")
    if len(parts) >= 6 and parts[-5] == "runs":
        return f"Training run: {parts[-4]} / {parts[-3]} / {parts[-2]}"
    return f"Training run: {object_name(uri)}"


def render_run_report(
    uri: str,
    data: bytes,
    metrics: str | Sequence[MetricsRecord] | None,
    *,
    metrics_problem: str | None = None,
    metrics_uri: str | None = None,
    now: float | None = None,
) -> str:
    """The page for a run's ``job.json`` (bytes ``data``) with its metrics (see :func:`run_report`).

    The report (status, cost, loss curve, throughput, attempts) comes first and the raw JSON last;
    a ``job.json`` that is not a JSON object gets :func:`render_report`'s page.
    """
    text = data.decode("utf-8", errors="replace")
    try:
        job = redact(json.loads(text))
    except (ValueError, RecursionError) as exc:
        return not_json_page(uri, text, exc)
    if not isinstance(job, dict):
        return render_report(uri, data)
    body = run_report(
        job, metrics, uri=uri, metrics_problem=metrics_problem, metrics_uri=metrics_uri, now=now
    )
    return page(_run_title(uri), uri, body + raw_json(job))
