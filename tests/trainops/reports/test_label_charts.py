"""A classifier's confusion matrix and label bars as SVG: what they draw, and what they refuse."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from trainops.reports.label_charts import svg_confusion_matrix, svg_label_bars

LABELS = ["docs", "forum", "news"]
COUNTS = [[8, 2, 0], [1, 9, 0], [0, 0, 10]]


def test_the_matrix_draws_every_count_with_its_labels_and_shades_by_the_rows_share():
    svg = svg_confusion_matrix(LABELS, COUNTS)
    ET.fromstring(svg)  # well-formed
    titles = re.findall(r"<title>([^<]+) predicted ([^<]+): (\d+)</title>", svg)
    assert [(t, p, int(n)) for t, p, n in titles][:3] == [
        ("docs", "docs", 8),
        ("docs", "forum", 2),
        ("docs", "news", 0),
    ]
    assert len(titles) == 9
    opacities = [float(o) for o in re.findall(r'fill-opacity="([0-9.]+)"', svg)]
    assert opacities[0] > opacities[1] > opacities[2]  # 80 %, 20 %, 0 % of docs' records
    assert opacities[8] == max(opacities)  # news: all right
    colours = re.findall(r'<rect [^>]*fill="(#[0-9a-f]+)"', svg)
    assert colours[0] == colours[4] == colours[8] == "#1a7f37" and colours[1] == "#cf222e"


def test_a_matrix_that_is_not_a_square_of_counts_draws_nothing():
    assert svg_confusion_matrix(LABELS, COUNTS[:2]) == ""
    assert svg_confusion_matrix(LABELS, [[1, 2], [3, 4], [5, 6]]) == ""
    assert svg_confusion_matrix(LABELS, [[1, 2, "x"], [0, 0, 0], [0, 0, 0]]) == ""
    assert svg_confusion_matrix([], []) == ""


def test_label_bars_draw_three_figures_per_label_and_escape_the_names():
    attack = "<script>x</script>"
    per_label = {
        "docs": {"precision": 0.8, "recall": 0.5, "f1": 0.6, "support": 10},
        attack: {"precision": 1.0, "recall": "n/a", "f1": 2.0},  # out-of-range figures are skipped
    }
    svg = svg_label_bars(per_label)
    ET.fromstring(svg)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    bars = re.findall(r"<title>([^<]+) (precision|recall|f1) ([0-9.]+)</title>", svg)
    assert [(n, k) for n, k, _ in bars] == [
        ("docs", "precision"),
        ("docs", "recall"),
        ("docs", "f1"),
        ("&lt;script&gt;x&lt;/script&gt;", "precision"),
    ]
    assert svg_label_bars({}) == ""
