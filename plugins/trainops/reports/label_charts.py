"""A classifier's evaluation as inline SVG: the confusion matrix and each label's bars.

Pure functions from the evaluation's figures (``trainer evaluate``'s ``confusion`` and
``per_label``) to markup, no script (the report app's Content-Security-Policy allows none).
Every label is escaped: label names come from the data and may be hostile. A figure that is
not what the trainer writes (a row of another length, a count that is not a number) draws
nothing rather than a wrong picture.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainops.reports.charts import CHART_COLOURS
from trainops.reports.html import escape

__all__ = ["svg_confusion_matrix", "svg_label_bars"]

_CELL, _LABEL_W, _HEAD_H = 44, 120, 28
_BAR_W, _BAR_GAP, _GROUP_GAP, _BAR_H = 14, 2, 18, 120
BAR_FIGURES = (("precision", "Precision"), ("recall", "Recall"), ("f1", "F1"))


def _short(label: str, limit: int = 16) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def svg_confusion_matrix(labels: Sequence[str], counts: Sequence[Sequence[object]]) -> str:
    """A grid of ``counts[i][j]`` (records of label ``i``, the rows, predicted ``j``, the
    columns), each cell shaded by its share of its row (the true label's records), the
    diagonal in green and the rest in red; "" when the figures are not a square of counts."""
    n = len(labels)
    if not n or len(counts) != n or any(len(row) != n for row in counts):
        return ""
    grid = [[_count(v) for v in row] for row in counts]
    if any(v is None for row in grid for v in row):
        return ""
    width, height = _LABEL_W + n * _CELL + 8, _HEAD_H + n * _CELL + 24
    parts = [
        f'<svg class="chart confusion" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="Confusion matrix">',
        f'<text x="{_LABEL_W + n * _CELL / 2:.1f}" y="12" text-anchor="middle" font-size="11">predicted</text>',
    ]
    for j, label in enumerate(labels):
        x = _LABEL_W + j * _CELL + _CELL / 2
        parts.append(
            f'<text x="{x:.1f}" y="{_HEAD_H - 6}" text-anchor="middle" font-size="11">'
            f"{escape(_short(str(label), 6))}<title>{escape(str(label))}</title></text>"
        )
    for i, (label, row) in enumerate(zip(labels, grid, strict=True)):
        y = _HEAD_H + i * _CELL
        total = sum(v or 0 for v in row)
        parts.append(
            f'<text x="{_LABEL_W - 6}" y="{y + _CELL / 2 + 4:.1f}" text-anchor="end" font-size="11">'
            f"{escape(_short(str(label)))}<title>{escape(str(label))}</title></text>"
        )
        for j, value in enumerate(row):
            share = (value or 0) / total if total else 0.0
            colour = "#1a7f37" if i == j else "#cf222e"
            parts.append(
                f'<rect x="{_LABEL_W + j * _CELL}" y="{y}" width="{_CELL - 2}" height="{_CELL - 2}" '
                f'fill="{colour}" fill-opacity="{0.08 + 0.85 * share:.3f}" stroke="#d0d7de">'
                f"<title>{escape(str(label))} predicted {escape(str(labels[j]))}: {value}</title></rect>"
                f'<text x="{_LABEL_W + j * _CELL + _CELL / 2 - 1:.1f}" y="{y + _CELL / 2 + 4:.1f}" '
                f'text-anchor="middle" font-size="12">{value}</text>'
            )
    parts.append(
        f'<text x="{_LABEL_W + n * _CELL / 2:.1f}" y="{height - 6}" text-anchor="middle" '
        'font-size="11" fill="#57606a">rows: the true label; shade: share of its records</text></svg>'
    )
    return "".join(parts)


def _figure(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None


def svg_label_bars(per_label: Mapping[str, Mapping[str, object]]) -> str:
    """Precision, recall and F1 of each label as three bars (0 to 1), with a legend; ""
    when there is no label."""
    labels = [str(label) for label in per_label]
    if not labels:
        return ""
    group = len(BAR_FIGURES) * (_BAR_W + _BAR_GAP) + _GROUP_GAP
    width, top, height = 40 + len(labels) * group, 24, _BAR_H + 64
    parts = [
        f'<svg class="chart label-bars" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="Precision, recall and F1 by label">',
        f'<path d="M32 {top}V{top + _BAR_H}H{width}" fill="none" stroke="#57606a"/>',
        f'<text x="28" y="{top + 4}" text-anchor="end" font-size="10">1</text>',
        f'<text x="28" y="{top + _BAR_H}" text-anchor="end" font-size="10">0</text>',
    ]
    for k, (_, name) in enumerate(BAR_FIGURES):
        x = 40 + k * 80
        parts.append(
            f'<rect x="{x}" y="4" width="10" height="10" fill="{CHART_COLOURS[k]}"/>'
            f'<text x="{x + 14}" y="13" font-size="11">{name}</text>'
        )
    for g, label in enumerate(labels):
        figures = per_label[label]
        base = 40 + g * group
        for k, (key, name) in enumerate(BAR_FIGURES):
            value = _figure(figures.get(key)) if isinstance(figures, Mapping) else None
            if value is None:
                continue
            bar = value * _BAR_H
            parts.append(
                f'<rect x="{base + k * (_BAR_W + _BAR_GAP)}" y="{top + _BAR_H - bar:.1f}" '
                f'width="{_BAR_W}" height="{bar:.1f}" fill="{CHART_COLOURS[k]}">'
                f"<title>{escape(label)} {name.lower()} {value:.3f}</title></rect>"
            )
        parts.append(
            f'<text x="{base + group / 2 - _GROUP_GAP / 2:.1f}" y="{top + _BAR_H + 16}" '
            f'text-anchor="middle" font-size="11">{escape(_short(label, 8))}'
            f"<title>{escape(label)}</title></text>"
        )
    return "".join(parts) + "</svg>"
