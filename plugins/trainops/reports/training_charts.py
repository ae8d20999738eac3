"""The training charts of a run page: loss with the evaluation points, learning rate, tokens/s
and peak memory, by step; pure functions over the run's metrics records, no I/O.

Each chart draws one line per attempt (the same colour for an attempt in every chart), marks
where each later attempt starts (a resume after a preemption or a failure) with a dashed
vertical line, and has a "log scale" switch (:func:`trainops.reports.charts.log_toggle`). A
field the records do not hold (memory on a CPU run, a trainer older than the field) is a
sentence saying so, not an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

from trainer.contract import MetricsRecord
from trainops.reports.charts import (
    CHART_CSS,
    MAX_CHART_POINTS,
    Marker,
    Series,
    log_toggle,
    svg_line_chart,
)
from trainops.reports.html import escape

__all__ = ["CHARTS", "MetricChart", "attempt_markers", "baseline_point", "eval_points", "training_charts"]


@dataclass(frozen=True)
class MetricChart:
    """A chart of one field of the metrics records by step."""

    field: str  # the records' key
    title: str  # the section's heading; the chart's name is "<title> by step"
    y_label: str
    name: str  # for the log-scale switch's id
    from_zero: bool  # an amount: the linear y axis starts at 0
    absent: str  # what the page says when no record holds the field (HTML)


CHARTS = (
    MetricChart(
        "lr",
        "Learning rate",
        "learning rate",
        "lr",
        False,
        "No learning rate was logged: the records hold no <code>lr</code> field.",
    ),
    MetricChart(
        "tokens_per_s",
        "Tokens per second",
        "tokens/s",
        "tokens",
        True,
        "No throughput was logged: the records hold no <code>tokens_per_s</code> field.",
    ),
    MetricChart(
        "peak_mem_gib",
        "Peak GPU memory",
        "GiB",
        "memory",
        True,
        "No memory figures: the trainer records <code>peak_mem_gib</code> (rank 0's peak "
        "allocated CUDA memory) only when it trains on a GPU, and this run's records hold none.",
    ),
)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _attempt_name(attempt: object) -> str:
    return f"attempt {attempt}" if attempt is not None else "attempt ?"


def _points(recs: list[MetricsRecord], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` where ``value`` is finite; a repeated step keeps its later record."""
    points = {r["step"]: float(r[key]) for r in recs if _finite(r.get(key))}
    return sorted(points.items())


def attempt_markers(
    groups: Mapping[object, list[MetricsRecord]], outcomes: Mapping[object, str] | None = None
) -> list[Marker]:
    """A marker at the first logged step of every attempt after the first, saying what ended
    the attempt before it when ``outcomes`` knows (``attempt 2 (after preempted)``)."""
    out = []
    for (before, _), (attempt, recs) in pairwise(groups.items()):
        if recs:
            why = (outcomes or {}).get(before)
            label = _attempt_name(attempt) + (f" (after {why})" if why else "")
            out.append(Marker(min(r["step"] for r in recs), label))
    return out


def _eval_loss(evaluation: Mapping | None, model: str) -> float | None:
    """``eval/metrics.json``'s ``eval_loss`` of ``model`` (``candidate`` or ``baseline``)."""
    scored = evaluation.get(model) if isinstance(evaluation, Mapping) else None
    loss = scored.get("eval_loss") if isinstance(scored, Mapping) else None
    return float(loss) if isinstance(loss, (int, float)) and _finite(loss) else None


def eval_points(records: list[MetricsRecord], evaluation: Mapping | None) -> list[tuple[int, float]]:
    """The evaluation losses by step: records with an ``eval_loss`` (periodic evaluation),
    and the run's evaluation (``eval/metrics.json``: its candidate's ``eval_loss``) at the
    last logged step, the step its export was written from."""
    points = dict(_points(records, "eval_loss"))
    loss = _eval_loss(evaluation, "candidate")
    if loss is not None and records:
        points[max(r["step"] for r in records)] = loss
    return sorted(points.items())


def baseline_point(records: list[MetricsRecord], evaluation: Mapping | None) -> list[tuple[int, float]]:
    """The model the run was compared with (``eval/metrics.json``'s ``baseline``, production),
    scored on the same split, at the last logged step; [] when there was none."""
    loss = _eval_loss(evaluation, "baseline")
    return [(max(r["step"] for r in records), loss)] if loss is not None and records else []


def _chart(name: str, series: list[Series], markers: list[Marker], **kw) -> str:
    linear = svg_line_chart(series, markers=markers, **kw)
    log = svg_line_chart(series, markers=markers, log_y=True, **kw)
    return log_toggle(name, linear, log)


def _loss(groups: Mapping, outcomes: Mapping, evaluation: Mapping | None, markers: list[Marker]) -> str:
    head = '<h2 id="loss">Loss</h2>'  # the anchor: a link (or a screenshot) can open the charts
    series = [
        Series(_attempt_name(a) + (f" ({outcomes[a]})" if a in outcomes else ""), _points(recs, "loss"))
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
    if not any(s.points for s in series):
        return f'{head}{note}<p class="muted">No loss values have been logged yet.</p>'
    records = [r for recs in groups.values() for r in recs]
    evals = eval_points(records, evaluation)
    if evals:
        series.append(Series("eval loss (held-out split)", evals, dots=True))
        said = "Dots are the held-out evaluation loss"
        if isinstance(evaluation, Mapping):
            said += " (the last one is the evaluate task's, from eval/metrics.json)"
        said += "."
        baseline = baseline_point(records, evaluation)
        if baseline:
            series.append(Series("production's eval loss", baseline, dots=True, ring=True))
            said += " The ring is the model it was compared with, on the same split."
    else:
        said = "No evaluation yet: the evaluate task writes eval/metrics.json after training."
    many = any(len(s.points) > MAX_CHART_POINTS for s in series)
    caption = (
        '<p class="muted">Training loss by step, one line per attempt; a dot marks where an '
        "attempt starts, a dashed line where a later attempt resumed (at the last committed "
        f"checkpoint). {said}"
        + (f" Long attempts are drawn with {MAX_CHART_POINTS} evenly spaced points." if many else "")
        + "</p>"
    )
    chart = _chart("loss", series, markers, title="Training loss by step", width=1000, height=300)
    return head + note + chart + caption


def training_charts(
    groups: Mapping[object, list[MetricsRecord]],
    *,
    outcomes: Mapping[object, str] | None = None,
    evaluation: Mapping | None = None,
    metrics_read: bool = True,
    metrics_problem: str | None = None,
) -> str:
    """The Loss, Learning rate, Tokens per second and Peak GPU memory sections (HTML).

    :param groups: the run's metrics records by attempt, in attempt order.
    :param outcomes: each attempt's classification (``preempted``, ...), for the loss legend.
    :param evaluation: the run's ``eval/metrics.json``, parsed, when it has one.
    :param metrics_read: False when the metrics could not be read; then only the Loss section
        is shown, saying why (``metrics_problem``).
    """
    if not metrics_read:
        why = metrics_problem or "no metrics were found next to job.json"
        return f'<h2 id="loss">Loss</h2><p class="muted">No loss curve: {escape(why)}.</p>'
    markers = attempt_markers(groups, outcomes)
    out = [f"<style>{CHART_CSS}</style>", _loss(groups, outcomes or {}, evaluation, markers)]
    if not groups:
        return "".join(out)
    small = []  # side by side where the page is wide enough
    for spec in CHARTS:
        series = [Series(_attempt_name(a), _points(recs, spec.field)) for a, recs in groups.items()]
        if not any(s.points for s in series):
            small.append(f'<div><h2>{escape(spec.title)}</h2><p class="muted">{spec.absent}</p></div>')
            continue
        chart = _chart(
            spec.name,
            series,
            markers,
            y_label=spec.y_label,
            title=f"{spec.title} by step",
            y_from_zero=spec.from_zero,
            width=600,
            height=220,
        )
        small.append(f"<div><h2>{escape(spec.title)}</h2>{chart}</div>")
    out.append(f'<div class="chart-grid">{"".join(small)}</div>')
    return "".join(out)
