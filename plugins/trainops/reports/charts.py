"""Charts as inline SVG: pure functions from typed series to markup; no I/O, no script.

A chart is drawn from :class:`Series` (a line, or dots for sparse points such as evaluations)
and :class:`Marker` (a vertical line, such as where an attempt resumed). :func:`log_toggle`
puts a linear and a log-scale drawing of one chart behind a "log scale" checkbox that works
with CSS alone (:data:`CHART_CSS`): the report app's Content-Security-Policy allows no script.
Every label is escaped; the series come from stored records and may be hostile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainops.reports.html import escape

__all__ = [
    "CHART_COLOURS",
    "CHART_CSS",
    "MAX_CHART_POINTS",
    "Marker",
    "Series",
    "log_toggle",
    "svg_line_chart",
]

CHART_COLOURS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#6e7781")
MAX_CHART_POINTS = 1000  # per series; longer series are thinned evenly (first and last kept)
_DASHES = ("", "6 3", "2 3", "9 3 2 3")
_LEGEND_ENTRY_W, _LEGEND_ROW_H = 190, 18
_MARKER_COLOUR = "#8c959f"
_GRID_LINES = 3  # between the y axis' minimum and maximum, evenly spaced on the drawn scale

# The log-scale switch: a checkbox followed by the linear and the log drawing.
CHART_CSS = (
    ".chart-toggle .log-view{display:none}"
    ".chart-toggle .log-switch:checked~.log-view{display:block}"
    ".chart-toggle .log-switch:checked~.linear-view{display:none}"
    ".chart-toggle label{font-size:12px;color:#57606a}"
    "svg.chart .marker{font-size:10px;fill:#6e7781}"
    ".chart-grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(30rem,1fr));gap:0 2rem}"
)


@dataclass(frozen=True)
class Series:
    """One series of ``(x, y)`` points: a line, or ``dots`` (each point a circle, for a few
    points such as evaluations, which a line between would misrepresent); ``ring`` dots are
    larger and hollow, so a dot at the same place stays visible inside them."""

    label: str
    points: Sequence[tuple[float, float]]
    dots: bool = False
    ring: bool = False


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``x`` with a short ``label`` (an attempt's start)."""

    x: float
    label: str


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tick(value: float) -> str:
    """An axis label: integers as such (thousands separated from 10,000 on), other numbers
    with 4 significant digits."""
    if 1e4 <= abs(value) < 1e15:
        return f"{value:,.0f}"
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
    box: tuple[float, float, float, float],
    x_dom: tuple,
    y_ticks: tuple[str, str],
    x_label: str,
    y_label: str,
) -> str:
    """The frame, the min/max labels of both axes and the axis titles."""
    left, top, width, height = box
    bottom, right = top + height, left + width
    return "".join(
        [
            _svg_frame(box),
            _svg_text(left - 6, top + 4, y_ticks[1], "end", ' class="tick y-max"'),
            _svg_text(left - 6, bottom, y_ticks[0], "end", ' class="tick y-min"'),
            _svg_text(left, bottom + 14, _tick(x_dom[0]), "start", ' class="tick x-min"'),
            _svg_text(right, bottom + 14, _tick(x_dom[1]), "end", ' class="tick x-max"'),
            _svg_text(left + width / 2, bottom + 28, x_label, "middle"),
            _svg_text(
                12, top + height / 2, y_label, "middle", f' transform="rotate(-90 12 {top + height / 2:.1f})"'
            ),
        ]
    )


def _svg_grid(box: tuple[float, float, float, float], y_dom: tuple[float, float], log_y: bool) -> str:
    """Light horizontal lines between the y axis' ends, each labelled with its value."""
    left, top, width, height = box
    out = []
    for i in range(1, _GRID_LINES + 1):
        share = i / (_GRID_LINES + 1)
        value = y_dom[0] + share * (y_dom[1] - y_dom[0])
        y = top + height - share * height
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + width}" y2="{y:.1f}" stroke="#eaeef2"/>'
            + _svg_text(
                left - 6,
                y + 4,
                f"{_tick(float(f'{10**value if log_y else value:.3g}'))}",
                "end",
                ' class="grid-label"',
            )
        )
    return "".join(out)


def _dash(i: int) -> str:
    dash = _DASHES[i % len(_DASHES)]
    return f' stroke-dasharray="{dash}"' if dash else ""


def _colour(i: int) -> str:
    return CHART_COLOURS[i % len(CHART_COLOURS)]


def _dot_paint(s: Series, i: int) -> str:
    if s.ring:
        return f'fill="none" stroke="{_colour(i)}" stroke-width="2.5"'
    return f'fill="{_colour(i)}" stroke="#1f2328"'


def _svg_legend(series: list[Series], left: float, top: float, width: float) -> str:
    per_row = max(1, int(width // _LEGEND_ENTRY_W))
    out = []
    for i, s in enumerate(series):
        x = left + (i % per_row) * _LEGEND_ENTRY_W
        y = top + (i // per_row) * _LEGEND_ROW_H
        if s.dots:
            key = f'<circle cx="{x + 11}" cy="{y - 4}" r="4" {_dot_paint(s, i)}/>'
        else:
            key = (
                f'<line x1="{x}" y1="{y - 4}" x2="{x + 22}" y2="{y - 4}" '
                f'stroke="{_colour(i)}" stroke-width="2"{_dash(i)}/>'
            )
        out.append(key + _svg_text(x + 28, y, s.label, extra=' class="legend"'))
    return "".join(out)


def _as_series(item: Series | tuple[str, Sequence[tuple[float, float]]], log_y: bool) -> Series:
    """A :class:`Series` (or ``(label, points)``) with only the points that can be drawn."""
    s = item if isinstance(item, Series) else Series(str(item[0]), item[1])
    kept = [(float(x), float(y)) for x, y in s.points if _finite(x) and _finite(y) and (not log_y or y > 0)]
    return Series(str(s.label), kept, s.dots, s.ring)


def svg_line_chart(
    series: Sequence[Series | tuple[str, Sequence[tuple[float, float]]]],
    *,
    markers: Sequence[Marker] = (),
    log_y: bool = False,
    width: int = 720,
    height: int = 260,
    x_label: str = "step",
    y_label: str = "loss",
    title: str = "",
    y_from_zero: bool = False,
) -> str:
    """An inline SVG chart: a polyline per line series, circles per dots series, and a dashed
    vertical line per marker.

    Each series has its own colour (and a line its dash pattern), and a line a dot at its first
    point (where an attempt starts, or resumes); a legend follows the plot. The axes span the
    data, labelled with its minimum and maximum; with ``y_from_zero`` the y axis starts at 0
    (amounts and shares, where a cut axis would make a small change look large); with ``log_y``
    the y axis is logarithmic and points at or below 0 are left out. Points with a non-finite
    coordinate are left out; with no point at all the chart says "no data".
    """
    drawn = [_as_series(s, log_y) for s in series]
    y_label = f"{y_label} (log)" if log_y else y_label
    left, right, top, bottom = 78, 16, 12, 40
    box = (left, top, width - left - right, height - top - bottom)
    rows = math.ceil(len(drawn) / max(1, int(box[2] // _LEGEND_ENTRY_W))) if drawn else 0
    total = height + rows * _LEGEND_ROW_H
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{total}" viewBox="0 0 {width} {total}" role="img" '
        f'aria-label="{escape(title or y_label + " by " + x_label)}">'
    ]
    if title:
        out.append(f"<title>{escape(title)}</title>")
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    if not xs:
        out.append(_svg_frame(box))
        out.append(_svg_text(left + box[2] / 2, top + box[3] / 2, "no data", "middle"))
        return "".join(out) + "</svg>"
    shown_markers = [m for m in markers if _finite(m.x) and min(xs) <= m.x <= max(xs)]
    x_dom = _domain(xs)
    if log_y:
        y_dom = _domain([math.log10(y) for y in ys])
        y_ticks = (_tick(10 ** y_dom[0]), _tick(10 ** y_dom[1]))
    else:
        y_dom = _domain([0.0, *ys] if y_from_zero and min(ys) >= 0 else ys)
        y_ticks = (_tick(y_dom[0]), _tick(y_dom[1]))
    out.append(_svg_axes(box, x_dom, y_ticks, x_label, y_label))
    out.append(_svg_grid(box, y_dom, log_y))

    def at(x: float, y: float) -> tuple[float, float]:
        v = math.log10(y) if log_y else y
        return (
            left + (x - x_dom[0]) / (x_dom[1] - x_dom[0]) * box[2],
            top + box[3] - (v - y_dom[0]) / (y_dom[1] - y_dom[0]) * box[3],
        )

    for m in shown_markers:
        mx = at(m.x, 10 ** y_dom[0] if log_y else y_dom[0])[0]
        out.append(
            f'<line class="attempt-marker" data-x="{_tick(m.x)}" x1="{mx:.1f}" y1="{top}" '
            f'x2="{mx:.1f}" y2="{top + box[3]}" stroke="{_MARKER_COLOUR}" stroke-dasharray="4 3"/>'
            + _svg_text(mx + 3, top + 10, m.label, extra=' class="marker"')
        )
    for i, s in enumerate(drawn):
        if not s.points:
            continue
        scaled = [at(x, y) for x, y in _thin(sorted(s.points))]
        if s.dots:
            for (x, y), (px, py) in zip(_thin(sorted(s.points)), scaled, strict=True):
                out.append(
                    f'<circle data-series="{escape(s.label)}" cx="{px:.1f}" cy="{py:.1f}" '
                    f'r="{8 if s.ring else 5}" {_dot_paint(s, i)}><title>{escape(s.label)} at '
                    f"{escape(_tick(x))}: {escape(f'{y:.4g}')}</title></circle>"
                )
            continue
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in scaled)
        out.append(
            f'<polyline data-series="{escape(s.label)}" points="{coords}" fill="none" '
            f'stroke="{_colour(i)}" stroke-width="1.5" stroke-linejoin="round"{_dash(i)}/>'
        )
        out.append(f'<circle cx="{scaled[0][0]:.1f}" cy="{scaled[0][1]:.1f}" r="3" fill="{_colour(i)}"/>')
    out.append(_svg_legend(drawn, left, height + 4, box[2]))
    return "".join(out) + "</svg>"


def log_toggle(name: str, linear: str, log: str) -> str:
    """``linear`` shown, and ``log`` instead while the "log scale" checkbox is ticked (CSS only,
    see :data:`CHART_CSS`). ``name`` makes the checkbox's id; it is escaped, and each chart on a
    page needs its own."""
    box_id = escape(f"log-{name}")
    return (
        f'<div class="chart-toggle"><input type="checkbox" class="log-switch" id="{box_id}">'
        f'<label for="{box_id}">log scale</label>'
        f'<div class="linear-view">{linear}</div><div class="log-view">{log}</div></div>'
    )
