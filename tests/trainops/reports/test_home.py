"""The home page: runs with their Airflow links, cost and live progress; models with who moved
production and why; datasets with their verdicts. Pure: records in, a page out."""

from __future__ import annotations

import html
import re

import pytest

from tests.trainops.reports.helpers import main_text, page_text, run_job, table_with
from trainops.reports.fleet import FleetRun
from trainops.reports.home import DatasetVersion, HomeRun, ModelEntry, home_page, progress

ATTACK = "<script>alert(1)</script>"
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
ROOT = "s3://lake/trainops"


def _records(steps: range, attempt: int = 1, start: float = 1000.0, per_step: float = 2.0) -> list[dict]:
    return [
        {"step": s, "attempt": attempt, "loss": 1.0, "time": start + (s - steps[0]) * per_step} for s in steps
    ]


def test_progress_measures_the_newest_attempt_and_counts_the_eta_from_its_last_step():
    # attempt 1 was fast and preempted at step 30; attempt 2 resumed at 21 at 0.5 steps/s
    records = _records(range(1, 31), per_step=0.1) + _records(range(21, 41), attempt=2, start=5000.0)
    last_time = 5000.0 + 19 * 2.0
    p = progress(records, 100, now=last_time + 10.0)
    assert p == {"step": 40, "max_steps": 100, "steps_per_s": 0.5, "eta_s": 60 / 0.5 - 10.0, "age_s": 10.0}
    assert progress(records, None, now=last_time)["eta_s"] is None  # no max_steps: no ETA
    assert progress(records, 100, now=last_time + 10_000)["eta_s"] == 0.0  # stalled: never negative
    one = progress(_records(range(5, 6)), 100, now=1000.0)
    assert (one["step"], one["steps_per_s"], one["eta_s"]) == (5, None, None)  # one step is no rate
    assert progress([], 100, now=0.0) is None
    assert progress([{"step": "x"}], 100, now=0.0) is None


def _run(run_id: str, job: dict | None, problem: str | None = None, dag: str = "retrain") -> FleetRun:
    uri = f"{ROOT}/runs/{dag}/{run_id}/train/job.json"
    return FleetRun(dag_id=dag, run_id=run_id, task_id="train", uri=uri, mtime=1.0, job=job, problem=problem)


def _home(**overrides) -> str:
    from tests.trainops.cost.fixtures import one_preemption_cost

    done = _run(
        "manual__2026-01-01T00_00_00_00_00",
        run_job(
            run_uri=f"{ROOT}/runs/retrain/manual__2026-01-01T00_00_00_00_00/train",
            cost=one_preemption_cost(),
            airflow={"dag_id": "retrain", "run_id": RUN_ID, "task_id": "train", "map_index": -1},
        ),
    )
    live = _run("scheduled_2", run_job(status="running", attempts=[{"attempt": 1}], preemptions=0))
    runs: list[HomeRun] = [
        {
            "run": live,
            "progress": {"step": 40, "max_steps": 100, "steps_per_s": 0.5, "eta_s": 120.0, "age_s": 3.0},
            "progress_problem": None,
        },
        {"run": done, "progress": None, "progress_problem": None},
        {
            "run": _run("broken", None, problem="job.json is not valid JSON"),
            "progress": None,
            "progress_problem": None,
        },
    ]
    history = [
        {
            "version": 1,
            "at": "2026-01-01T01:00:00+00:00",
            "action": "promote",
            "run_uri": done["job"]["run_uri"],
        },
        {
            "version": 2,
            "at": "2026-01-02T01:00:00+00:00",
            "action": "promote",
            "run_uri": f"{ROOT}/runs/x/y/train",
        },
        {
            "version": 1,
            "at": "2026-01-03T01:00:00+00:00",
            "action": "rollback",
            "from_version": 2,
            "by": "ada",
            "reason": f"v2 regressed on the forum slice {ATTACK}",
            "run_uri": done["job"]["run_uri"],
        },
    ]
    pointer = {
        "version": 1,
        "promoted_at": history[-1]["at"],
        "run_uri": done["job"]["run_uri"],
        "history": history,
    }
    models: list[ModelEntry] = [
        {"name": "demo-lm", "root": ROOT, "pointer": pointer, "problem": None},
        {
            "name": "broken-lm",
            "root": ROOT,
            "pointer": None,
            "problem": "the production pointer is malformed",
        },
        {"name": ATTACK, "root": ROOT, "pointer": None, "problem": f"unreadable {ATTACK}"},
    ]
    base = f"{ROOT}/datasets/web-text"
    datasets: list[DatasetVersion] = [
        {
            "name": "web-text",
            "root": ROOT,
            "version": "aaa111",
            "validation_uri": f"{base}/aaa111/validation.json",
            "validation": {"success": True, "rows": 4000, "quarantine": {"rows": 12}},
            "manifest_uri": f"{base}/aaa111/manifest.json",
            "manifest": {
                "created_at": "2026-01-02",
                "splits": {"train": {"tokens": 9000}, "eval": {"tokens": 900}},
            },
            "mtime": 2.0,
            "problem": None,
        },
        {
            "name": "web-text",
            "root": ROOT,
            "version": "bbb222",
            "validation_uri": f"{base}/bbb222/validation.json",
            "validation": {"success": False, "rows": 60},
            "manifest_uri": None,
            "manifest": None,
            "mtime": 3.0,
            "problem": None,
        },
    ]
    args = {"base_url": "https://airflow.example.com", **overrides}
    return home_page(runs, models, datasets, **args)


def test_runs_show_state_attempts_preemptions_goodput_cost_and_live_progress():
    from tests.trainops.cost.fixtures import one_preemption_cost
    from trainops.cost.money import money

    page = _home()
    rows = table_with(page, "Run")
    assert rows[0] == [
        "Run",
        "In Airflow",
        "Status",
        "Attempts",
        "Preemptions",
        "Goodput",
        "Cost (estimate)",
        "Progress",
    ]
    assert rows[1] == [
        "retrain / scheduled_2 / train",
        "Airflow: the DAG's runs",
        "running",
        "1",
        "0",
        "when it ends",
        "",
        "step 40 of 100, 0.5 steps/s, about 2 min left (last step 3 s ago)",
    ]
    cost = one_preemption_cost()
    assert rows[2] == [
        "retrain / manual__2026-01-01T00_00_00_00_00 / train",
        "Airflow run",
        "succeeded",
        "2",
        "1",
        "47.2%",
        money(cost["cost"]),
        "-",
    ]
    assert rows[3][:4] == ["retrain / broken / train", "", "unreadable", "job.json is not valid JSON"]
    hrefs = [html.unescape(h) for h in re.findall(r'<a class="airflow" href="([^"]+)"', page)]
    assert "https://airflow.example.com/dags/retrain/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00" in hrefs
    assert "https://airflow.example.com/dags/retrain/runs" in hrefs
    assert (
        'href="report?uri=s3%3A%2F%2Flake%2Ftrainops%2Fruns%2Fretrain%2Fscheduled_2%2Ftrain%2Fjob.json"'
        in page
    )


def test_models_say_who_moved_production_and_why():
    page = _home()
    text = main_text(page)
    assert (
        "demo-lm under s3://lake/trainops Production: v1 since 2026-01-03T01:00:00+00:00, trained by this run (Airflow run)"
        in text
    )
    history = table_with(page, "Version")
    assert history[1:] == [
        [
            "v1",
            "rollback",
            "2026-01-03T01:00:00+00:00",
            "ada",
            f"v2 regressed on the forum slice {ATTACK} (replaced v2)",
            "training report",
        ],
        [
            "v2",
            "promote",
            "2026-01-02T01:00:00+00:00",
            "the training DAG run",
            "its evaluation gate approved it: gate decision",
            "training report",
        ],
        [
            "v1",
            "promote",
            "2026-01-01T01:00:00+00:00",
            "the training DAG run: Airflow run",
            "its evaluation gate approved it: gate decision",
            "training report",
        ],
    ]
    assert ATTACK not in page  # shown, escaped
    assert (
        'href="report?uri=s3%3A%2F%2Flake%2Ftrainops%2Fmodels%2Fdemo-lm%2Fversions%2F1%2Fcard.json"' in page
    )
    assert "broken-lm under s3://lake/trainops the production pointer is malformed" in text
    assert f"{ATTACK} under s3://lake/trainops unreadable {ATTACK}" in text  # a folder name is data too


def test_datasets_show_versions_newest_first_with_rows_and_verdicts():
    rows = table_with(_home(), "Version", skip=1)
    assert rows[1:] == [
        ["bbb222", "-", "60", "0", "-", "-", "FAILED report"],
        ["aaa111", "2026-01-02", "4000", "12", "9000", "900", "PASSED report"],
    ]


@pytest.mark.parametrize(
    "section", ["No training runs were found", "No model has been promoted", "No staged datasets"]
)
def test_an_empty_root_says_what_is_missing(section):
    assert section in page_text(home_page([], [], [], base_url=""))


def test_problems_and_hidden_dags_are_named():
    text = page_text(_home(hidden_dags=2, problems=[f"could not list {ATTACK}"]))
    assert f"could not list {ATTACK}" in text
    assert "2 DAG(s) with runs are not shown: you may not read their task instances." in text


def test_a_models_production_version_shows_the_metrics_it_was_promoted_on():
    from tests.trainops.reports.helpers import page_text

    pointer = {"version": 3, "promoted_at": "2026-12-01", "history": []}
    metrics = {
        "candidate": {
            "accuracy": 0.934,
            "f1_macro": 0.91,
            "eval_loss": 0.2,
            "worst_label_recall": 0.8,
            "user_metrics": {"worst_label_recall": "team_metrics:worst_label_recall"},
        },
        "production": {"accuracy": 0.92, "f1_macro": 0.9, "eval_loss": 0.21},
        "production_version": 2,
    }
    model = {"name": "support-intent", "root": ROOT, "pointer": pointer, "problem": None, "metrics": metrics}
    text = page_text(home_page([], [model], [], base_url="https://airflow.example.com"))
    assert "Promoted on Accuracy 0.934 (v2: 0.92), Macro F1 0.91 (v2: 0.9), worst_label_recall 0.8." in text
    first = {**model, "metrics": {"candidate": {"eval_loss": 1.5, "perplexity": 4.5}, "production": None}}
    assert "Promoted on Eval loss 1.5, Perplexity 4.5." in page_text(home_page([], [first], [], base_url="x"))
    assert "Promoted on" not in page_text(home_page([], [{**model, "metrics": None}], [], base_url="x"))
