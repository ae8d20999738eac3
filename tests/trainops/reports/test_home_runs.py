"""The home page's runs: Airflow's DAG runs joined with their training in storage; a database
that cannot be read is one sentence, never an error page."""

import html
from datetime import UTC, datetime

from tests.trainops.runs.stored import every_outcome
from trainops.reports.home import home_page
from trainops.reports.home_runs import dag_run_rows
from trainops.runs.dag_runs import DagRunInfo, failure_note


def test_each_dag_run_is_joined_with_its_training_by_run_id(file_root):
    every_outcome(file_root)
    infos = [
        DagRunInfo(
            "retrain", "manual__2026-12-01T10:00:00+00:00", "success", start=datetime(2026, 12, 1, tzinfo=UTC)
        ),
        DagRunInfo(
            "retrain", "manual__2026-12-02T10:00:00+00:00", "success", start=datetime(2026, 12, 2, tzinfo=UTC)
        ),
        DagRunInfo(
            "retrain",
            "manual__2026-12-06T10:00:00+00:00",
            "failed",
            start=datetime(2026, 12, 6, tzinfo=UTC),
            failed_task="plan",
            note=failure_note("plan", "settings: unknown key 'max_step'"),
        ),
    ]
    asked = []

    def read_runs(limit, may_read):
        asked.append((limit, may_read("retrain")))
        return infos

    found, problem = dag_run_rows([file_root], None, may_read=lambda d: True, now=0.0, read_runs=read_runs)
    assert problem is None and asked == [(30, True)]
    assert [r.outcome.text for r in found] == [
        "failed at plan: settings: unknown key 'max_step'",
        "rejected: eval loss under max_eval_loss: eval_loss (observed 3.2, expected <= 2.5) (+1 more)",
        "promoted v2",
    ]
    page = home_page([], [], [], base_url="", dag_runs=found, now=0.0)
    assert page.index("<h2>Runs</h2>") < page.index("<h2>Training runs</h2>")  # the page leads with it


def test_a_database_that_cannot_be_read_is_a_sentence(file_root):
    def down(limit, may_read):
        raise ConnectionError("database is down")

    found, problem = dag_run_rows([file_root], None, may_read=lambda d: True, now=0.0, read_runs=down)
    assert (
        found == [] and problem == "The DAG runs could not be read from Airflow's database: ConnectionError."
    )
    assert html.escape(problem) in home_page([], [], [], base_url="", dag_runs_problem=problem)
