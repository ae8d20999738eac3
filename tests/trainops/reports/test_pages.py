"""Report pages as a reader sees them: their text and tables, escaped and redacted."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from tests.trainops.staging.helpers import record_batches
from trainops.reports.pages import error_page, redact, render_report, report_kind
from trainops.reports.run_page import MAX_CHART_POINTS, render_run_report, svg_line_chart
from trainops.staging.expectations import normalize_expectations
from trainops.staging.validation import validate_batches

VALIDATION_URI = "s3://bucket/root/datasets/web-text/3f9a/validation.json"
ATTACK = "<script>alert(1)</script>"


class _Page(HTMLParser):
    """Visible text and tables (rows of cell texts) of a page."""

    _BLOCKS = frozenset({"table", "tr", "td", "th", "p", "li", "ol", "h1", "h2", "pre", "header", "br"})

    def __init__(self, html: str):
        super().__init__()
        self.text: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._open: list[list[list[str]]] = []
        self._cells: list[list[str]] = []
        self._skip = False
        self.feed(html)

    def _data(self, data: str) -> None:
        self.text.append(data)
        for cell in self._cells:  # a nested table's text belongs to the enclosing cells too
            cell.append(data)

    def handle_starttag(self, tag, attrs):
        if tag in ("style", "title"):
            self._skip = True
        if tag in self._BLOCKS:
            self._data(" ")
        if tag == "table":
            self._open.append([])
            self.tables.append(self._open[-1])
        elif tag == "tr" and self._open:
            self._open[-1].append([])
        elif tag in ("td", "th") and self._open:
            self._cells.append([])

    def handle_endtag(self, tag):
        if tag in ("style", "title"):
            self._skip = False
        if tag in ("td", "th") and self._cells:
            self._open[-1][-1].append(" ".join("".join(self._cells.pop()).split()))
        elif tag == "table" and self._open:
            self._open.pop()
        if tag in self._BLOCKS:
            self._data(" ")

    def handle_data(self, data):
        if not self._skip:
            self._data(data)


def page_text(html: str) -> str:
    return " ".join("".join(_Page(html).text).split())


def page_tables(html: str) -> list[list[list[str]]]:
    return _Page(html).tables


def table_with(html: str, header: str, skip: int = 0) -> list[list[str]]:
    """The first table (after ``skip`` others) whose first row starts with ``header``."""
    tables = [t for t in page_tables(html) if t and t[0] and t[0][0] == header]
    return tables[skip]


def test_failed_validation_lists_each_expectation_with_status_counts_and_ids():
    cols = {
        "id": [f"r{i}" for i in range(30)],
        "text": [f"text {i}" for i in range(30)],
        "source": ["news", "forum", "docs"] * 10,
    }
    cols["id"][4] = None
    cols["id"][25] = "r2"
    cols["text"][8] = ""
    summary = validate_batches(record_batches(cols, batch_rows=10), normalize_expectations(None))
    html = render_report(VALIDATION_URI, json.dumps(summary).encode())

    text = page_text(html)
    assert text.startswith("Dataset validation report " + VALIDATION_URI)
    assert "Validation FAILED" in text
    assert dict(page_tables(html)[0]) == {
        "Dataset": "web-text version 3f9a",
        "Rows checked": "30",
        "Expectations evaluated": "6",
        "Passed": "3",
        "Failed": "3",
    }
    row_level, dataset_level = [t for t in page_tables(html) if t[0][0] == "Expectation"]
    assert row_level[0] == [
        "Expectation",
        "Column",
        "Status",
        "Unexpected",
        "Sample offending rows",
        "Details",
    ]
    assert [r[:5] for r in row_level[1:]] == [
        ["expect_column_values_to_not_be_null", "id", "FAIL", "1", "rows 4"],
        ["expect_column_values_to_not_be_null", "text", "PASS", "0", "-"],
        ["expect_column_value_lengths_to_be_between", "text", "FAIL", "1", "ids r8"],
        ["expect_column_values_to_not_be_null", "source", "PASS", "0", "-"],
    ]
    assert "min_value 1" in row_level[3][5] and "max_value 20000" in row_level[3][5]
    assert [r[:5] for r in dataset_level[1:]] == [
        ["expect_column_values_to_be_unique", "id", "FAIL", "2", "ids r2"],
        ["expect_table_row_count_to_be_between", "null", "PASS", "null", "-"],
    ]
    assert "observed_value 30" in dataset_level[2][5]
    assert text.index("Row expectations") < text.index("Dataset-level expectations")
    assert "Raw JSON" in text and "&quot;unexpected_count&quot;: 2" in html


def test_report_listing_failures_only_says_the_rest_passed():
    report = {
        "success": False,
        "rows": 10,
        "evaluated_expectations": 6,
        "successful_expectations": 5,
        "failed": [
            {
                "expectation": "expect_column_values_to_not_be_null",
                "column": "id",
                "kwargs": {"column": "id"},
                "unexpected_count": 1,
                "sample_ids": [],
                "sample_rows": [3],
            }
        ],
    }
    html = render_report(VALIDATION_URI, json.dumps(report).encode())
    assert table_with(html, "Expectation")[1][:5] == [
        "expect_column_values_to_not_be_null",
        "id",
        "FAIL",
        "1",
        "rows 3",
    ]
    assert "The report itemises failures only; the other 5 expectations passed." in page_text(html)


def test_quarantine_numbers_reasons_and_sample_link():
    report = {
        "success": True,
        "rows": 60,
        "evaluated_expectations": 2,
        "successful_expectations": 2,
        "failed": [],
        "results": [
            {
                "expectation": "expect_column_values_to_not_be_null",
                "column": "id",
                "success": True,
                "unexpected_count": 2,
                "quarantined": 2,
                "sample_rows": [3, 20],
            },
            {
                "expectation": "expect_table_row_count_to_be_between",
                "column": None,
                "success": True,
                "observed_value": 58,
                "kwargs": {"min_value": 1, "max_value": 100},
            },
        ],
        "quarantine": {
            "by_reason": {"expect_column_values_to_not_be_null(id)": 2},
            "fraction": 0.033333,
            "max_fraction": 0.2,
            "rows": 2,
            "rows_read": 60,
            "sample": "quarantine/sample.jsonl",
            "sample_rows": 2,
        },
    }
    html = render_report(VALIDATION_URI, json.dumps(report).encode())
    text = page_text(html)
    assert "Validation PASSED" in text
    rows = {r[0]: r for t in page_tables(html) for r in t if t[0][0] == "Expectation"}
    assert rows["expect_column_values_to_not_be_null"][2:5] == ["PASS, 2 quarantined", "2", "rows 3, 20"]
    assert rows["expect_table_row_count_to_be_between"][2] == "PASS"
    assert "observed_value 58" in rows["expect_table_row_count_to_be_between"][5]
    quarantine = table_with(html, "Rows quarantined")
    assert quarantine[:5] == [
        ["Rows quarantined", "2"],
        ["Rows read", "60"],
        ["Fraction", "0.033333"],
        ["Largest fraction allowed", "0.2"],
        ["Rows in the sample", "2"],
    ]
    sample = "s3://bucket/root/datasets/web-text/3f9a/quarantine/sample.jsonl"
    assert quarantine[5] == ["Sample of quarantined rows", sample]
    assert (
        'href="report?uri=s3%3A%2F%2Fbucket%2Froot%2Fdatasets%2Fweb-text%2F3f9a%2Fquarantine%2Fsample.jsonl"'
    ) in html
    assert table_with(html, "Reason")[1] == ["expect_column_values_to_not_be_null(id)", "2"]


def test_passing_report_written_by_staging_says_all_passed():
    html = render_report(
        VALIDATION_URI,
        json.dumps(
            {
                "success": True,
                "evaluated_expectations": 6,
                "successful_expectations": 6,
                "failed": [],
                "rows": 300,
            }
        ).encode(),
    )
    assert "Validation PASSED" in page_text(html)
    assert "All 6 expectations passed." in page_text(html)


def test_hostile_values_are_escaped_everywhere():
    attack = "<script>alert(1)</script>"
    report = {
        "success": False,
        "evaluated_expectations": 1,
        "successful_expectations": 0,
        "rows": 2,
        "failed": [
            {
                "expectation": attack,
                "column": attack,
                "unexpected_count": 2,
                "sample_ids": [attack],
                "kwargs": {attack: attack},
            }
        ],
        attack: {attack: [attack]},
    }
    html = render_report(f"file:///r/datasets/{attack}/v/validation.json", json.dumps(report).encode())
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert attack in page_text(html)  # shown to the reader as text
    assert "<script>" not in render_report("file:///r/x.md", attack.encode())
    assert "<script>" not in error_page(403, attack)


def test_credentials_never_show():
    card = {
        "format": "trainops.model-card/v1",
        "model": "demo-lm",
        "version": 3,
        "aws_secret_access_key": "SECRET-1",
        "storage": {"password": "SECRET-2", "session_token": "SECRET-3"},
        "endpoint": "https://user:SECRET-4@minio.local/x",
        "train_tokens": 4096,
        "tokenizer": {"kind": "byte"},
    }
    html = render_report("file:///r/models/demo-lm/versions/3/card.json", json.dumps(card).encode())
    assert "SECRET" not in html
    text = page_text(html)
    assert text.startswith("Model card: demo-lm v3")
    assert "train_tokens 4096" in text and "kind byte" in text
    assert "https://user:***@minio.local/x" in text
    assert redact({"token": "t", "eval_tokens": 5, "password": None}) == {
        "token": "***",
        "eval_tokens": 5,
        "password": None,
    }


def test_gate_decision_shows_verdict_and_checks():
    gate = {
        "approved": False,
        "production_version": 2,
        "model_name": "demo-lm",
        "run_uri": "file:///r/runs/d/r1/train",
        "decided_at": "2026-01-01T00:00:00+00:00",
        "checks": [
            {
                "name": "loss under 4",
                "kind": "threshold",
                "metric": "eval_loss",
                "observed": 4.5,
                "expected": "<= 4",
                "passed": False,
                "note": "",
            }
        ],
    }
    html = render_report("file:///r/runs/d/r1/train/eval/gate.json", json.dumps(gate).encode())
    text = page_text(html)
    assert "Evaluation gate decision" in text and "Gate REJECTED" in text
    assert "Compared against production v2" in text
    assert table_with(html, "Check")[1] == ["loss under 4", "eval_loss", "4.5", "<= 4", "FAIL", ""]


def test_kinds_and_odd_shapes_render_without_errors():
    assert report_kind("file:///r/runs/d/r/t/job.json", {"attempts": []}) == "job"
    assert report_kind("file:///r/x/manifest.json", {"format": "trainops.dataset/v1"}) == "manifest"
    assert report_kind("file:///r/x/other.json", [1, 2]) == "json"
    odd = {"success": "yes", "failed": 5, "results": "x", "rows": [1]}
    assert "Dataset validation report" in page_text(
        render_report("file:///r/datasets/d/v/validation.json", json.dumps(odd).encode())
    )
    assert "Gate" in page_text(render_report("file:///r/gate.json", b'{"checks": "x"}'))
    broken = page_text(render_report("file:///r/datasets/d/v/validation.json", b"{not json"))
    assert "This object is not valid JSON" in broken and "{not json" in broken
    job = page_text(
        render_report(
            "file:///r/runs/d/r/t/job.json",
            json.dumps(
                {
                    "attempts": [
                        {"n": 1, "classification": "preempted"},
                        {"n": 2, "classification": "succeeded"},
                    ]
                }
            ).encode(),
        )
    )
    assert job.startswith("Training job record: job.json")
    assert "n classification 1 preempted 2 succeeded" in job


# ----------------------------------------------------------------------------- run report

JOB_URI = "s3://bucket/root/runs/retrain/manual_1/train/job.json"


class _Svg(HTMLParser):
    """The inline charts' shapes: polylines (their points), dots and labelled texts."""

    def __init__(self, html: str):
        super().__init__()
        self.svgs = 0
        self.lines: list[tuple[str, list[tuple[float, float]]]] = []
        self.dots: list[tuple[float, float]] = []
        self.ticks: dict[str, str] = {}
        self.legend: list[str] = []
        self._text_class: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.svgs += 1
        elif tag == "polyline":
            points = [tuple(map(float, p.split(","))) for p in attrs["points"].split()]
            self.lines.append((attrs.get("data-series", ""), points))
        elif tag == "circle":
            self.dots.append((float(attrs["cx"]), float(attrs["cy"])))
        elif tag == "text":
            self._text_class = attrs.get("class", "")

    def handle_endtag(self, tag):
        if tag == "text":
            self._text_class = None

    def handle_data(self, data):
        if self._text_class and self._text_class.startswith("tick "):
            self.ticks[self._text_class.split()[1]] = data
        elif self._text_class == "legend":
            self.legend.append(data)


def metrics_jsonl(*rows: tuple) -> str:
    """``(attempt, step, loss, tokens_per_s)`` rows as the trainer writes them."""
    return "".join(
        json.dumps(
            {
                "step": step,
                "loss": loss,
                "lr": 1e-3,
                "tokens_per_s": tps,
                "attempt": attempt,
                "time": 1.0e9 + step,
            }
        )
        + "\n"
        for attempt, step, loss, tps in rows
    )


def run_job(**extra) -> dict:
    """A job.json shaped like FSDPTrainingOperator's: a preempted spot attempt, then a finished one."""
    return {
        "run_uri": JOB_URI.rsplit("/", 1)[0],
        "config_uri": JOB_URI.replace("job.json", "config.yaml"),
        "cluster": "kubernetes",
        "capacity": "on-demand",
        "preemptions": 1,
        "infra_failures": 0,
        "status": "succeeded",
        "attempts": [
            {
                "attempt": 1,
                "capacity": "spot",
                "launched_at": "2026-01-01T00:00:00+00:00",
                "ended_at": "2026-01-01T00:10:00+00:00",
                "classification": "preempted",
                "reason": "spot interruption notice",
                "steps_lost": 1,
                "node_types": [
                    {"index": 0, "node_name": "n0", "instance_type": "g5.xlarge", "capacity_type": "spot"}
                ],
                "decision": {
                    "action": "relaunch",
                    "capacity": "on-demand",
                    "reason": "preemption 1 of at most 3: relaunching to resume",
                },
                "spec": {"env": {"AWS_SECRET_ACCESS_KEY": "SECRET-1"}},
            },
            {
                "attempt": 2,
                "capacity": "on-demand",
                "launched_at": "2026-01-01T00:11:00+00:00",
                "ended_at": "2026-01-01T00:20:00+00:00",
                "classification": "succeeded",
                "reason": "the trainer completed every step",
                "steps_lost": 0,
                "node_types": [],
                "decision": {"action": "finish", "capacity": "on-demand", "reason": "training completed"},
            },
        ],
        **extra,
    }


# Attempt 1 logs steps 1-6 and is preempted after the checkpoint at step 5; attempt 2 resumes
# and logs steps 6-10 (step 6 again, with another loss).
RUN_METRICS = metrics_jsonl(
    (1, 1, 4.0, 1000.0),
    (1, 2, 3.8, 3000.0),
    (1, 3, 3.5, 3100.0),
    (1, 4, 3.3, 3200.0),
    (1, 5, 3.1, 2900.0),
    (1, 6, 3.05, 3000.0),
    (2, 6, 3.0, 900.0),
    (2, 7, 2.9, 4000.0),
    (2, 8, 2.8, 4100.0),
    (2, 9, 2.6, 3900.0),
    (2, 10, 2.5, 4200.0),
)


def test_run_report_shows_status_counts_curve_throughput_and_attempts():
    html = render_run_report(JOB_URI, json.dumps(run_job()).encode(), RUN_METRICS)
    text = page_text(html)
    assert text.startswith(f"Training run: retrain / manual_1 / train {JOB_URI} Status succeeded")

    summary = dict(page_tables(html)[0])
    assert {
        k: summary[k]
        for k in (
            "Status",
            "Attempts",
            "Preemptions",
            "Infrastructure failures",
            "Steps lost to interruptions",
            "Last logged step",
            "Loss at that step",
        )
    } == {
        "Status": "succeeded",
        "Attempts": "2",
        "Preemptions": "1",
        "Infrastructure failures": "0",
        "Steps lost to interruptions": "1",
        "Last logged step": "10",
        "Loss at that step": "2.5",
    }
    assert summary["Metrics"] == "s3://bucket/root/runs/retrain/manual_1/train/metrics.jsonl"
    assert (
        'href="report?uri=s3%3A%2F%2Fbucket%2Froot%2Fruns%2Fretrain%2Fmanual_1%2Ftrain%2Fconfig.yaml"'
    ) in html

    chart = _Svg(html)
    assert chart.svgs == 1
    assert [(name, len(points)) for name, points in chart.lines] == [
        ("attempt 1 (preempted)", 6),
        ("attempt 2 (succeeded)", 5),
    ]
    assert chart.legend == ["attempt 1 (preempted)", "attempt 2 (succeeded)"]
    assert chart.ticks == {"y-max": "4", "y-min": "2.5", "x-min": "1", "x-max": "10"}
    first, second = (points for _, points in chart.lines)
    assert [p[0] for p in first] == sorted(p[0] for p in first)  # drawn left to right
    assert first[0][1] < first[-1][1] < second[-1][1]  # loss goes down (SVG y grows down)
    assert second[0][0] == first[-1][0]  # attempt 2 resumes at step 6, which attempt 1 logged
    assert chart.dots == [first[0], second[0]]  # a dot where each attempt starts
    assert [p[1] for p in first].index(min(p[1] for p in first)) == 0  # highest loss on top

    assert table_with(html, "Attempt")[1:] == [
        ["attempt 1", "6", "1 to 6", "3,000", "3,000", "3.05"],
        ["attempt 2", "5", "6 to 10", "4,000", "4,200", "2.5"],
    ]
    attempts = table_with(html, "Attempt", skip=1)
    assert attempts[0] == [
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
    assert attempts[1] == [
        "1",
        "spot",
        "2026-01-01T00:00:00+00:00",
        "2026-01-01T00:10:00+00:00",
        "preempted",
        "spot interruption notice",
        "1",
        "node 0: g5.xlarge (spot)",
        "preemption 1 of at most 3: relaunching to resume",
    ]
    assert attempts[2][:7] == [
        "2",
        "on-demand",
        "2026-01-01T00:11:00+00:00",
        "2026-01-01T00:20:00+00:00",
        "succeeded",
        "the trainer completed every step",
        "0",
    ]
    assert "Raw JSON" in text and text.index("Attempts Attempt") < text.index("Raw JSON")
    assert "SECRET-1" not in html and "<script" not in html


def test_run_report_escapes_hostile_values_in_the_table_and_the_chart():
    job = run_job(status=ATTACK)
    job["attempts"][0].update(
        reason=ATTACK, classification=ATTACK, node_types=[{"index": 0, "instance_type": ATTACK}]
    )
    metrics = RUN_METRICS + json.dumps({"step": 11, "loss": 2.4, "attempt": ATTACK}) + "\n"
    html = render_run_report(f"file:///r/runs/{ATTACK}/r/t/job.json", json.dumps(job).encode(), metrics)
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    attempts = table_with(html, "Attempt", skip=1)
    assert attempts[1][4:6] == [ATTACK, ATTACK]
    assert attempts[1][7] == f"node 0: {ATTACK}"
    assert dict(page_tables(html)[0])["Status"] == ATTACK
    assert f"attempt {ATTACK}" in _Svg(html).legend


def test_run_report_without_metrics_says_why_and_draws_nothing():
    job = json.dumps(run_job()).encode()
    missing = render_run_report(JOB_URI, job, None)
    assert "<svg" not in missing
    assert "No loss curve: metrics.jsonl was not found next to job.json." in page_text(missing)
    assert table_with(missing, "Attempt")[1][0] == "1"  # the attempts table is still there
    assert "Throughput" not in page_text(missing)

    refused = render_run_report(JOB_URI, job, None, metrics_problem=f"refused {ATTACK}")
    assert f"No loss curve: refused {ATTACK}." in page_text(refused)

    for empty in ("", "\n", "not json\n", '{"loss": 1.0}\n'):
        html = render_run_report(JOB_URI, job, empty)
        assert "<svg" not in html and "Throughput" not in page_text(html)
        assert "No loss values have been logged yet." in page_text(html)
        assert "Preemptions 1" in page_text(html)


def test_non_finite_losses_are_reported_and_left_out_of_the_curve():
    metrics = metrics_jsonl(
        (1, 1, 3.0, 10.0),
        (1, 2, float("nan"), 10.0),
        (1, 3, 2.0, 10.0),
        (1, 4, float("inf"), 10.0),
        (1, 5, 1.0, 10.0),
    )
    assert "NaN" in metrics and "Infinity" in metrics  # as json.dumps writes them
    html = render_run_report(JOB_URI, json.dumps(run_job()).encode(), metrics)
    assert (
        "The loss was not a finite number (NaN or infinite) at 2 logged step(s), first at "
        "step 2 of attempt 1; those steps are not drawn."
    ) in page_text(html)
    chart = _Svg(html)
    assert [len(points) for _, points in chart.lines] == [3]
    assert (chart.ticks["y-min"], chart.ticks["y-max"]) == ("1", "3")

    only_nan = render_run_report(
        JOB_URI, json.dumps(run_job()).encode(), metrics_jsonl((1, 1, float("nan"), 10.0))
    )
    assert "<svg" not in only_nan and "No loss values have been logged yet." in page_text(only_nan)


def test_a_single_logged_step_is_a_dot_on_a_widened_axis():
    job = run_job(status="running", preemptions=0)
    job["attempts"] = [{"attempt": 1, "capacity": "spot", "launched_at": "2026-01-01T00:00:00+00:00"}]
    html = render_run_report(JOB_URI, json.dumps(job).encode(), metrics_jsonl((1, 7, 2.5, 10.0)))
    chart = _Svg(html)
    assert [(name, len(points)) for name, points in chart.lines] == [("attempt 1", 1)]
    assert len(chart.dots) == 1
    assert chart.ticks == {"y-max": "2.75", "y-min": "2.25", "x-min": "6", "x-max": "8"}
    assert table_with(html, "Attempt", skip=1)[1][:5] == [
        "1",
        "spot",
        "2026-01-01T00:00:00+00:00",
        "running",
        "-",
    ]


def test_svg_line_chart_without_points_and_with_long_series():
    empty = svg_line_chart([("attempt 1", [])])
    assert "<polyline" not in empty and ">no data</text>" in empty
    assert svg_line_chart([]).count("<svg") == 1

    long = [(step, 1.0 / step) for step in range(1, 5001)]
    chart = _Svg(svg_line_chart([("a", long), ("b", [(1, float("nan")), (2, 0.5)])]))
    (_, thinned), (_, short) = chart.lines
    assert len(thinned) <= MAX_CHART_POINTS + 1 and len(short) == 1
    assert (chart.ticks["x-min"], chart.ticks["x-max"]) == ("1", "5000")
    assert (chart.ticks["y-min"], chart.ticks["y-max"]) == ("0.0002", "1")


def test_job_json_that_is_not_an_object_falls_back_to_the_plain_page():
    assert "This object is not valid JSON" in page_text(render_run_report(JOB_URI, b"{", None))
    listed = page_text(render_run_report(JOB_URI, b"[1, 2]", None))
    assert listed.startswith(f"Stored report: job.json {JOB_URI}") and "1, 2" in listed
