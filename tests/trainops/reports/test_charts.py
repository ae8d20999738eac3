"""The inline SVG charts: lines, dots, attempt markers, the log scale and its switch."""

from __future__ import annotations

import re

from tests.trainops.reports.helpers import Svg
from trainops.reports.charts import CHART_CSS, MAX_CHART_POINTS, Marker, Series, log_toggle, svg_line_chart

ATTACK = "<script>alert(1)</script>"


def test_eval_points_are_dots_with_their_value_not_a_line():
    chart = svg_line_chart(
        [Series("attempt 1", [(1, 4.0), (10, 2.0)]), Series("eval loss", [(5, 3.0), (10, 2.2)], dots=True)]
    )
    shapes = Svg(chart)
    assert [name for name, _ in shapes.lines] == ["attempt 1"]  # the eval series draws no line
    assert "<title>eval loss at 5: 3</title>" in chart and "<title>eval loss at 10: 2.2</title>" in chart
    assert len(re.findall(r'<circle data-series="eval loss"', chart)) == 2
    assert shapes.legend == ["attempt 1", "eval loss"]


def test_markers_are_vertical_lines_at_their_step_with_their_label():
    chart = svg_line_chart(
        [("attempt 1", [(0, 4.0), (6, 3.0)]), ("attempt 2", [(5, 3.1), (10, 2.0)])],
        markers=[Marker(5, "attempt 2"), Marker(99, "outside the data")],
    )
    lines = re.findall(
        r'<line class="attempt-marker" data-x="(\d+)" x1="([\d.]+)" y1="[\d.]+" x2="([\d.]+)"', chart
    )
    assert [(x, x1 == x2) for x, x1, x2 in lines] == [("5", True)]  # vertical; one outside is not drawn
    # half-way along the plot (78 px in, 626 px wide)
    assert float(lines[0][1]) == 78 + 626 * 5 / 10
    assert ">attempt 2</text>" in chart and "outside the data" not in chart


def test_log_scale_labels_the_axis_and_leaves_out_values_it_cannot_draw():
    points = [(1, 1e-5), (2, 1e-4), (3, 1e-3), (4, 0.0), (5, -1.0)]
    chart = svg_line_chart([("lr", points)], log_y=True, y_label="lr")
    shapes = Svg(chart)
    assert len(shapes.lines[0][1]) == 3  # 0 and -1 have no logarithm
    assert (shapes.ticks["y-min"], shapes.ticks["y-max"]) == ("1e-05", "0.001")
    assert ">lr (log)</text>" in chart
    low, middle, high = (y for _, y in shapes.lines[0][1])
    assert abs(middle - (low + high) / 2) < 0.1  # one decade of two: half-way up
    linear = [y for _, y in Svg(svg_line_chart([("lr", points[:3])])).lines[0][1]]
    assert abs(linear[1] - linear[0]) < abs(linear[2] - linear[1]) / 5  # squashed at the bottom
    only_zero = svg_line_chart([("lr", [(1, 0.0)])], log_y=True)
    assert "no data" in only_zero and "<polyline" not in only_zero


def test_log_toggle_is_a_checkbox_and_two_drawings_switched_by_css():
    html = log_toggle(f"loss{ATTACK}", "<svg>A</svg>", "<svg>B</svg>")
    assert re.search(
        r'<input type="checkbox" class="log-switch" id="([^"]+)"><label for="\1">log scale</label>', html
    )
    assert html.index('class="linear-view"><svg>A') < html.index('class="log-view"><svg>B')
    assert ATTACK not in html
    # the log drawing is hidden until the box is ticked, then it replaces the linear one
    assert (
        ".log-view{display:none}" in CHART_CSS and ".log-switch:checked~.log-view{display:block}" in CHART_CSS
    )
    assert ".log-switch:checked~.linear-view{display:none}" in CHART_CSS


def test_labels_are_escaped_and_long_series_thinned():
    chart = svg_line_chart(
        [Series(ATTACK, [(i, 1.0 + i) for i in range(5000)])], markers=[Marker(10, ATTACK)], title=ATTACK
    )
    assert ATTACK not in chart and "&lt;script&gt;" in chart
    assert len(Svg(chart).lines[0][1]) <= MAX_CHART_POINTS + 1


def test_no_points_at_all_says_no_data():
    chart = svg_line_chart([Series("eval", [(1, float("nan"))], dots=True)], markers=[Marker(1, "attempt 2")])
    assert "no data" in chart and "attempt-marker" not in chart and "<circle" not in chart
