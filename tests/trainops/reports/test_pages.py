"""The stored report pages as a reader sees them: their text and tables, escaped and redacted."""

from __future__ import annotations

import json

from tests.trainops.reports.helpers import page_tables, page_text, table_with
from tests.trainops.staging.helpers import record_batches
from trainops.reports.pages import error_page, render_report, report_kind
from trainops.staging.expectations import normalize_expectations
from trainops.staging.validation import validate_batches

VALIDATION_URI = "s3://bucket/root/datasets/web-text/3f9a/validation.json"


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
    # the verdict first, naming the failed expectations, their column, count and a sample
    assert text.startswith(
        f"Dataset validation report {VALIDATION_URI} Validation FAILED: "
        "expect_column_values_to_not_be_null on id: 1 unexpected; "
        'expect_column_values_to_be_unique on id: 2 unexpected, e.g. "r2"; '
        'expect_column_value_lengths_to_be_between on text: 1 unexpected, e.g. "" Dataset web-text'
    )
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
    assert html.index('<details class="fold"><summary>Raw JSON') < html.index(
        "&quot;unexpected_count&quot;: 2"
    )


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
    # the verdict first, each failed check observed against expected, then every check
    assert text.startswith(
        "Evaluation gate decision file:///r/runs/d/r1/train/eval/gate.json "
        "Gate REJECTED: loss under 4 (observed 4.5, expected <= 4) Checks Check"
    )
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
