"""A person's click-through in a real headless browser: the demo DAG's first run (dag.test(),
shared with the README walkthrough: tests/e2e/demo_run.py),
Airflow's own API server serves the report app, and headless Chromium opens the trainops home
page, follows its link to the run's report, from there to the model card promoted from it, and
from the card back to the run's page in Airflow's UI, which renders that run; and Airflow's
navigation entry (Browse > trainops) shows the home page in Airflow's frame.

Chromium is driven with ``--dump-dom``: each page is loaded as a browser loads it (the report
pages run no script; Airflow's UI is a React app, given virtual time to fetch and render), and
the next URL is the ``href`` of the link a person would click, resolved against the page's URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote, urljoin

import pytest

from tests.e2e.browser import CHROMIUM, browse, click
from tests.e2e.demo_run import FirstRun

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"{CHROMIUM} is not installed: the browser test needs Debian's chromium package",
    ),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, server: subprocess.Popen, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the API server exited with {server.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s:.0f} s")


@pytest.fixture
def demo_env(demo_first_run, monkeypatch) -> FirstRun:
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", demo_first_run.root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", demo_first_run.local_state)
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    return demo_first_run


@pytest.fixture
def api_server(demo_env):
    """Airflow's API server over the test's database and storage root, with the simple auth
    manager's all_admins switch, so a headless browser needs no login."""
    port = _free_port()
    env = {**os.environ, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}
    args = [
        sys.executable,
        "-m",
        "airflow",
        "api-server",
        "--apps",
        "core",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    server = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


def test_home_to_run_to_model_card_and_back_to_the_airflow_run(demo_env, api_server, tmp_path):
    from trainer.contract import safe_segment
    from trainops.links import report_url

    results = demo_env.results
    assert demo_env.state.endswith("success"), results
    run_id, job_uri = demo_env.run_id, results["train"]["run_uri"] + "/job.json"

    # The task log names the report at the start of train and gate, and the home page at the
    # start of every task with a report (stage, train, evaluate, gate, promote).
    logged = demo_env.log
    assert f"trainops Training report: {report_url(job_uri, '')}" in logged
    gate_uri = results["train"]["run_uri"] + "/eval/gate.json"
    assert f"trainops Gate decision: {report_url(gate_uri, '')}" in logged
    assert logged.count("trainops home (runs, models, datasets): /trainops/") >= 5
    assert "trainops Model card: on this task's 'Model card' link once it is written" in logged

    base, server = api_server
    _wait_for(f"{base}/api/v2/monitor/health", server)
    profile = tmp_path / "chromium"

    home_url = f"{base}/trainops/"
    home = browse(home_url, profile)
    assert home.title == "trainops - trainops"
    # the page leads with the DAG run, its outcome in words (and a colour class): promoted
    version = results["promote"]["version"]
    assert ("promoted", f"promoted v{version}") in home.outcomes, home.outcomes
    assert (
        click(home, home_url, f"trainops_demo / {run_id}")
        == f"{base}/dags/trainops_demo/runs/{quote(run_id, safe='')}"
    )
    run_url = click(home, home_url, f"trainops_demo / {safe_segment(run_id)} / train")

    run_page = browse(run_url, profile)
    assert run_page.title == f"Training run: trainops_demo / {safe_segment(run_id)} / train - trainops"
    card_url = click(run_page, run_url, f"Model card demo-lm v{version}")

    card = browse(card_url, profile)
    assert "demo-lm" in card.title and "unavailable" not in card.title
    airflow_url = click(card, card_url, f"Airflow run trainops_demo / {run_id}")
    assert airflow_url == f"{base}/dags/trainops_demo/runs/{quote(run_id, safe='')}"
    assert click(run_page, run_url, f"Airflow run trainops_demo / {run_id}") == airflow_url

    # Airflow's UI renders that run's page (its title is the run id)
    airflow_page = browse(airflow_url, profile, virtual_time_ms=20_000)
    assert airflow_page.title == f"{run_id} - Airflow"
    # and back: the home page is one click from every report page
    assert click(card, card_url, "trainops home") == home_url

    # Browse > trainops: Airflow's UI shows the home page in its own frame
    mounted = browse(f"{base}/plugin/trainops-home", profile, virtual_time_ms=20_000)
    assert [urljoin(base, src) for src in mounted.frames] == [home_url]
