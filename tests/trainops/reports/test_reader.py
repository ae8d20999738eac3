"""The home page as Airflow's API server serves it (``/trainops/``), over a storage root that
real staging, metrics logging, promotion and rollback wrote; and the links around report pages."""

from __future__ import annotations

import html
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.trainops.reports.helpers import main_text, page_text, run_job, table_with
from tests.trainops.reports.test_app import api, bearer, get  # noqa: F401 - fixtures and helpers
from trainer.contract import RunLayout, join
from trainer.storage import open_storage
from trainops.reports import access

RUN_ID = "manual__2026-01-01T00:00:00+00:00"
LIVE_RUN_ID = "scheduled__2026-01-02T00:00:00+00:00"


@pytest.fixture
def root(file_root, monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", file_root)
    monkeypatch.delenv("TRAINOPS_REPORT_ROOTS", raising=False)
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    access._readers.clear()
    return file_root


def _stage(root: str, tmp_path, corrupt: bool) -> None:
    from trainops.staging.demo_data import demo_rows
    from trainops.staging.errors import DataValidationError
    from trainops.staging.stage import stage_dataset

    raw = tmp_path / ("bad" if corrupt else "good")
    raw.mkdir()
    pq.write_table(pa.table(demo_rows(60, seed=1, corrupt=corrupt)), raw / "part-00000.parquet")
    try:
        stage_dataset(open_storage(root), root, f"file://{raw}", "web-text")
    except DataValidationError:
        assert corrupt


@pytest.fixture
def tree(root, tmp_path):
    """A dataset staged twice (passed, failed); a finished run promoted as v1, a second run
    promoted as v2 and rolled back from; a live run at step 40 of 100, 0.5 steps/s."""
    from trainer.runtime.metrics import MetricsLog
    from trainops.registry.promotion import promote
    from trainops.registry.rollback import rollback

    _stage(root, tmp_path, corrupt=False)
    _stage(root, tmp_path, corrupt=True)
    storage = open_storage(root)
    done = RunLayout(join(root, "runs", "retrain", "manual__2026-01-01T00_00_00_00_00", "train"))
    ids = {"dag_id": "retrain", "run_id": RUN_ID, "task_id": "train", "map_index": -1}
    storage.put_json(done.job, run_job(run_uri=done.run_uri, config_uri=done.config, airflow=ids))
    other = RunLayout(join(root, "runs", "nightly", "old", "train"))
    storage.put_json(other.job, run_job(run_uri=other.run_uri, config_uri=other.config))
    for layout, expected in ((done, None), (other, 1)):
        storage.put(join(layout.export, "model.safetensors"), b"weights")
        storage.put_json(layout.eval_gate, {"approved": True, "checks": [], "production_version": expected})
        promote(
            storage,
            root,
            "demo-lm",
            export_uri=layout.export,
            card={
                "run_uri": layout.run_uri,
                "metrics": {"candidate": {"eval_loss": 2.5}, "production": None},
            },
            expected_production_version=expected,
        )
    rollback(storage, root, "demo-lm", 1, reason="v2 regressed on forum text", by="ada")
    live = RunLayout(join(root, "runs", "retrain", "scheduled__2026-01-02T00_00_00_00_00", "train"))
    live_ids = {**ids, "run_id": LIVE_RUN_ID}
    storage.put(live.config, b"train:\n  max_steps: 100\n")
    storage.put_json(
        live.job,
        run_job(
            run_uri=live.run_uri, config_uri=live.config, status="running", attempts=[], airflow=live_ids
        ),
    )
    log = MetricsLog(storage, live.metrics, attempt=1, flush_every=10)
    now = time.time()
    for step in range(1, 41):
        log.add(step=step, loss=3.0, lr=0.1, tokens_per_s=100.0, time=now - 80 + 2 * step)
    return {"done": done, "other": other, "live": live}


def _airflow_links(page: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'<a class="airflow" href="([^"]+)"', page)]


def test_home_page_lists_runs_models_and_datasets_with_their_links(api, tree, root):  # noqa: F811
    response = api[0].get("/trainops/", headers=bearer(api))
    assert response.status_code == 200, response.text
    page = response.text
    runs = table_with(page, "Run")
    assert [row[0] for row in runs[1:]] == [
        "retrain / scheduled__2026-01-02T00_00_00_00_00 / train",  # the newest job.json first
        "nightly / old / train",
        "retrain / manual__2026-01-01T00_00_00_00_00 / train",
    ]
    live = runs[1]
    assert live[1:3] == ["Airflow run", "running"]
    assert live[-1].startswith("step 40 of 100, 0.5 steps/s, about 2 min left (last step ")
    assert runs[2][1] == "Airflow: the DAG's runs"  # a record from before the Airflow ids
    # (the page's first section, the DAG runs, comes from the test database that other tests share)
    training = page.split("<h2>Training runs</h2>", 1)[1]
    assert _airflow_links(training)[:3] == [
        "/dags/retrain/runs/scheduled__2026-01-02T00%3A00%3A00%2B00%3A00",
        "/dags/nightly/runs",
        "/dags/retrain/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00",
    ]
    text = main_text(page)
    assert "demo-lm under " + root + " Production: v1 since" in text
    assert "Promoted on Eval loss 2.5." in text  # read from v1's card
    history = table_with(page, "Version")
    assert [row[:5] for row in history[1:]] == [
        ["v1", "rollback", history[1][2], "ada", "v2 regressed on forum text (replaced v2)"],
        [
            "v2",
            "promote",
            history[2][2],
            "the training DAG run",
            "its evaluation gate approved it: gate decision",
        ],
        [
            "v1",
            "promote",
            history[3][2],
            "the training DAG run: Airflow run",
            "its evaluation gate approved it: gate decision",
        ],
    ]
    datasets = table_with(page, "Version", skip=1)
    assert [(row[2], row[6]) for row in datasets[1:]] == [("60", "FAILED report"), ("60", "PASSED report")]
    # a live run on the page: it reloads
    assert '<meta http-equiv="refresh" content="15">' in page
    # each report link it shows is served
    for href in re.findall(r'href="(report\?uri=[^"]+)"', page):
        assert api[0].get(f"/trainops/{html.unescape(href)}", headers=bearer(api)).status_code == 200, href


def test_home_page_needs_a_login_and_reads_nothing_for_a_stranger(api, tree):  # noqa: F811
    assert api[0].get("/trainops/").status_code == 401
    refused = api[0].get("/trainops/", headers=bearer(api, role=None, name="nobody"))
    assert refused.status_code == 403 and "may not read trainops reports" in page_text(refused.text)


def test_report_pages_link_back_to_the_airflow_run_and_reload_while_live(api, tree):  # noqa: F811
    done, live = tree["done"], tree["live"]
    finished = get(api, done.job).text
    assert "http-equiv" not in finished
    assert _airflow_links(finished) == ["/dags/retrain/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"]
    card = re.search(r'<a href="([^"]+)">Model card demo-lm v1</a>', finished).group(1)
    card_page = api[0].get(f"/trainops/{html.unescape(card)}", headers=bearer(api)).text
    assert main_text(card_page).startswith("Model card: demo-lm v1")
    assert _airflow_links(card_page) == _airflow_links(finished)
    assert ">Training report</a>" in card_page

    running = get(api, live.job).text
    assert '<meta http-equiv="refresh" content="15">' in running
    assert "live: this page reloads every 15 s" in page_text(running)
    assert _airflow_links(running) == ["/dags/retrain/runs/scheduled__2026-01-02T00%3A00%3A00%2B00%3A00"]

    # every page carries the way home, refusals included
    missing = get(api, join(done.run_uri, "eval", "metrics.json"))
    assert missing.status_code == 404 and '<a href="./">trainops home</a>' in missing.text


def test_links_follow_airflows_base_url(api, tree, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team-a/")
    page = get(api, tree["done"].job).text
    assert _airflow_links(page) == [
        "https://airflow.example.com/team-a/dags/retrain/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    ]
