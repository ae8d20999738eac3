"""The home page's runs: one row per DAG run, the outcome in words and colour."""

import html
from datetime import UTC, datetime

from tests.trainops.runs.stored import GATE_REJECTED
from trainops.reports.dag_runs_page import dag_runs_section
from trainops.runs.dag_runs import DagRunInfo, failure_note, rows
from trainops.runs.outcome import RunFacts

T = datetime(2026, 12, 1, 10, tzinfo=UTC)
URI = "file:///s/runs/retrain_manual/r2/train"


def section() -> str:
    infos = [
        DagRunInfo("retrain_manual", "r1", "success", start=T, end=datetime(2026, 12, 1, 10, 5, tzinfo=UTC)),
        DagRunInfo("retrain_manual", "r2", "success", start=datetime(2026, 12, 2, tzinfo=UTC)),
        DagRunInfo(
            "retrain_manual",
            "r3",
            "failed",
            start=datetime(2026, 12, 3, tzinfo=UTC),
            failed_task="stage",
            note=failure_note("stage", "dataset_uri 'data/demo/v1' is not a URI <b>"),
        ),
    ]
    found = {
        ("retrain_manual", "r1"): RunFacts(
            URI.replace("r2", "r1"),
            "retrain_manual",
            "r1",
            status="succeeded",
            promoted_version=4,
            model_name="retrain-lm",
            cost=0.5,
        ),
        ("retrain_manual", "r2"): RunFacts(
            URI, "retrain_manual", "r2", status="succeeded", gate=GATE_REJECTED, model_name="retrain-lm"
        ),
    }
    return dag_runs_section(rows(infos, found), "http://airflow:8080", now=0.0)


def test_rows_say_the_outcome_in_words_and_colour_newest_first():
    page = section()
    cells = [html.unescape(c) for c in page.split("<tr>")[2:]]
    assert "failed at stage: dataset_uri 'data/demo/v1' is not a URI <b>" in cells[0]
    assert 'class="outcome-failed fail"' in cells[0]
    assert (
        "rejected: eval loss under max_eval_loss" in cells[1] and 'class="outcome-rejected fail"' in cells[1]
    )
    assert "promoted v4" in cells[2] and 'class="outcome-promoted pass"' in cells[2]
    assert "5 min" in cells[2] and "$0.50" in cells[2] and "retrain-lm" in cells[2]


def test_a_user_given_text_is_escaped_and_links_go_to_airflow_and_the_report():
    page = section()
    assert "<b>" not in page and "&lt;b&gt;" in page
    assert 'href="http://airflow:8080/dags/retrain_manual/runs/r3"' in page
    assert "report?uri=" in page and "r3/train" not in page  # no training: no report link


def test_no_runs_and_a_problem():
    assert "No run of a trainops DAG yet" in dag_runs_section([], "http://a", 0.0)
    assert "database is down" in dag_runs_section([], "http://a", 0.0, problem="database is down")
