"""The example DAGs on a real Airflow: scheduler, DAG processor, triggerer and API server.

From a blank AIRFLOW_HOME (SQLite, LocalExecutor, parallelism 4) the module migrates the
database, starts the four components, each in its own process group, and logs in through the
REST API the way a user's script would (``POST /auth/token`` as the simple auth manager's
``admin``, with a password the test wrote to the passwords file).

1. ``retrain_manual`` is triggered through the REST API with a params payload and the run
   succeeds on the embedded default (``file://`` storage, the local cluster); the training
   task defers, so the triggerer does the waiting. The promotion records the API user. A
   one-step model is rejected: the run stays green and its note (written by the supervised
   worker through the REST API) names the failed checks. Bad payloads are refused when
   triggered, naming the field, and start nothing.
2. ``data_team_publish`` lands a snapshot and emits a real asset event; the scheduler starts
   ``retrain_on_new_data``, which stages exactly that snapshot and trains with the settings of
   the ``trainops_retrain`` Variable (set through the API).

At the end every component is stopped (SIGTERM, then SIGKILL after a grace period) and the
module checks that none of their processes, nor any training job, is left. When a test fails,
the tails of the components' logs and of the latest task logs are printed.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.browser import CHROMIUM, SigningProxy, browse

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "retrain_manual"
COMPONENTS = {
    "scheduler": ["scheduler"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer"],
    "api-server": ["api-server", "--host", "127.0.0.1", "--port", "{port}", "--workers", "1"],
}
# A user-facing payload: every key of the form, small enough to train in seconds.
PAYLOAD = {
    "model_preset": "tiny",
    "hf_model": "",
    "task": "causal_lm",
    "nodes": 1,
    "gpus_per_node": 0,
    "capacity": "spot",
    "max_preemptions": 1,
    "restarts_in_place": 1,
    "lr": 0.004,
    "max_steps": 20,
    "warm_start": "auto",
    "dry_run": False,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _group_alive(pgid: int) -> list[int]:
    """Pids of processes (not zombies) still in process group ``pgid``."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


class RealAirflow:
    """The four Airflow components, each in its own process group, with logs under ``home``."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.home = tmp / "airflow"
        self.home.mkdir()
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.password = secrets.token_urlsafe(12)
        passwords = tmp / "passwords.json"
        passwords.write_text(json.dumps({"admin": self.password}))
        self.storage_root = f"file://{tmp / 'storage'}"
        self.local_state = tmp / "local"
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            "AIRFLOW__API__BASE_URL": self.base,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            # The simple auth manager's default user, with a password we chose.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            # The workers write a rejection on the run's note through the REST API as this user.
            "AIRFLOW_CONN_TRAINOPS_AIRFLOW_API": json.dumps(
                {"conn_type": "http", "host": self.base, "login": "admin", "password": self.password}
            ),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # The DAG files do not change during the module: parse each once, not every 30 s
            # (every re-parse imports the DAG files anew, CPU the trained models need).
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # The log servers' fixed default ports (8793, 8794) could be taken on this host.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(_free_port()),
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "TRAINOPS_STORAGE_ROOT": self.storage_root,
            "TRAINOPS_LOCAL_STATE": str(self.local_state),
            "PYTHONUNBUFFERED": "1",
        }
        # A real scheduler races a trigger that fires within seconds of deferring (the tiny
        # model trains in a few): the product default must keep this test green, so it applies.
        self.env.pop("AIRFLOW__TRAINOPS__TRIGGER_SETTLE_SECONDS", None)
        self.procs: dict[str, subprocess.Popen] = {}
        self.token: str | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def airflow(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def migrate(self) -> None:
        with open(self.home / "db-migrate.log", "wb") as log:
            subprocess.run(
                self.airflow("db", "migrate"),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=180,
            )

    def start(self) -> None:
        for name, args in COMPONENTS.items():
            log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - the child writes it; closed here once handed over
            self.procs[name] = subprocess.Popen(
                self.airflow(*[a.format(port=self.port) for a in args]),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # its own process group: stop() reaches its children
            log.close()

    def stop(self, grace: float = 30.0) -> dict[str, list[int]]:
        """SIGTERM every component's group, SIGKILL what is left after ``grace``; also
        delete any local training job still running. Returns the pids still alive (none)."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        while time.monotonic() < deadline and any(_group_alive(p.pid) for p in self.procs.values()):
            time.sleep(0.2)
        for proc in self.procs.values():
            if _group_alive(proc.pid):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self._stop_local_jobs()
        kill_deadline = time.monotonic() + 10
        left = {}
        while time.monotonic() < kill_deadline:
            left = {n: _group_alive(p.pid) for n, p in self.procs.items() if _group_alive(p.pid)}
            if not left:
                break
            time.sleep(0.2)
        return left

    def _stop_local_jobs(self) -> None:
        """Training jobs run detached (their own sessions); delete any the test left behind."""
        from trainops.cluster.local.backend import LocalCluster

        cluster = LocalCluster(self.local_state)
        handles = cluster.find({})
        for handle in handles:
            cluster.delete(handle)
        deadline = time.monotonic() + 60
        while handles and time.monotonic() < deadline:
            handles = [h for h in handles if not cluster.all_gone(h)]
            time.sleep(0.5)

    def live_jobs(self) -> list[dict]:
        from trainops.cluster.local.backend import LocalCluster

        return LocalCluster(self.local_state).find({})

    def log_tails(self, lines: int = 60) -> str:
        """The end of each component's log, then of the most recently written task logs."""
        out = []
        for path in sorted(self.home.glob("*.log")):
            text = [line[:400] for line in path.read_text(errors="replace").splitlines()[-lines:]]
            out.append(f"===== {path.name} (last {len(text)} lines) =====\n" + "\n".join(text))
        task_logs = sorted((self.home / "logs").rglob("dag_id=*/**/*.log"), key=lambda p: p.stat().st_mtime)[
            -8:
        ]
        for path in task_logs:
            text = [line[:400] for line in path.read_text(errors="replace").splitlines()[-15:]]
            out.append(f"===== {path.relative_to(self.home)} =====\n" + "\n".join(text))
        return "\n".join(out)

    # -- REST API -----------------------------------------------------------------------
    def request(self, method: str, path: str, headers: dict | None = None, **kwargs):
        import httpx

        headers = dict(headers or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return httpx.request(method, f"{self.base}{path}", headers=headers, timeout=30, **kwargs)

    def wait_for(self, what: str, check, timeout: float, interval: float = 1.0):
        """Poll ``check()`` until it returns something truthy; fail after ``timeout``,
        naming what was awaited and whatever the last check saw."""
        import httpx

        deadline = time.monotonic() + timeout
        last = None
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    pytest.fail(f"airflow {name} exited with {proc.returncode} while waiting for {what}")
            try:
                last = check()
                if last:
                    return last
            except httpx.TransportError as exc:  # the API server is not listening yet
                last = exc
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")
            time.sleep(interval)

    def healthy(self):
        response = self.request("GET", "/api/v2/monitor/health")
        if response.status_code != 200:
            return None
        health = response.json()
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return health if all((health.get(p) or {}).get("status") == "healthy" for p in parts) else None

    def login(self) -> None:
        response = self.request("POST", "/auth/token", json={"username": "admin", "password": self.password})
        assert response.status_code == 201, response.text
        self.token = response.json()["access_token"]

    def trigger(self, conf: dict, dag_id: str = DAG_ID):
        return self.request(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf}
        )

    def unpause(self, dag_id: str) -> None:
        self.wait_for(
            f"{dag_id} to be parsed",
            lambda: self.request("GET", f"/api/v2/dags/{dag_id}").status_code == 200,
            timeout=60,
        )
        response = self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
        assert response.status_code == 200, response.text

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 200) -> tuple[dict, dict]:
        """Wait for a run to finish; its JSON and its task states."""

        def finished():
            run = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()
            return run if run["state"] in ("success", "failed") else None

        run = self.wait_for(f"{dag_id} run {run_id} to finish", finished, timeout=timeout)
        tis = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
        return run, {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str):
        response = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value",
            params={"deserialize": True},
        )
        assert response.status_code == 200, response.text
        return response.json()["value"]


@pytest.fixture(scope="module")
def airflow_instance(tmp_path_factory):
    """One Airflow for this module's tests: started, healthy, logged in; stopped at the end."""
    af = RealAirflow(tmp_path_factory.mktemp("real-airflow"))
    try:
        af.migrate()
        af.start()
        af.wait_for("every component to report healthy", af.healthy, timeout=120)
        af.login()
    except BaseException:
        af.stop()
        print(af.log_tails())
        raise
    yield af
    left = af.stop()
    assert left == {}, f"processes outlived the test: {left}\n{af.log_tails()}"
    assert af.live_jobs() == []


@pytest.fixture
def real_airflow(airflow_instance, request):
    """The shared Airflow; the components' log tails are printed if the test fails."""
    failed = request.session.testsfailed
    yield airflow_instance
    if request.session.testsfailed > failed:
        print(airflow_instance.log_tails())


def test_retrain_manual_on_a_real_airflow(real_airflow):
    af = real_airflow
    started = time.monotonic()
    dag = af.wait_for(
        f"{DAG_ID} to be parsed",
        lambda: r.json() if (r := af.request("GET", f"/api/v2/dags/{DAG_ID}")).status_code == 200 else None,
        timeout=60,
    )
    assert dag["has_import_errors"] is False
    errors = af.request("GET", "/api/v2/importErrors").json()
    assert errors["total_entries"] == 0, errors
    assert af.request("PATCH", f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200

    # The form's schema is what the UI renders: every field has a title and a description.
    details = af.request("GET", f"/api/v2/dags/{DAG_ID}/details").json()
    assert set(details["params"]) == {"dataset_uri", *PAYLOAD}
    assert all(p["schema"].get("title") and p["description"] for p in details["params"].values())

    response = af.trigger(PAYLOAD)
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]
    assert response.json()["conf"] == PAYLOAD

    run, states = af.wait_run(DAG_ID, run_id)
    assert run["state"] == "success", states
    assert states["dry_run"] == "skipped"
    assert all(s == "success" for t, s in states.items() if t != "dry_run"), states
    # The training task waited in the triggerer, not in a worker slot.
    log = af.request(
        "GET",
        f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train/logs/1",
        params={"full_content": True},
        headers={"Accept": "application/json"},
    )
    assert log.status_code == 200, log.text
    events = [str(e.get("event")) for e in log.json()["content"]]
    # What the UI's log view shows: the task deferred, the triggerer's JobTrigger streamed
    # the job's progress, fired, and the task resumed to decide.
    order = [
        next((i for i, e in enumerate(events) if marker in e), None)
        for marker in (
            "Pausing task as DEFERRED",
            "step 20/20",
            "Trigger fired event",
            "attempt 1: succeeded",
        )
    ]
    assert None not in order and order == sorted(order), events

    # What the user asked for is what trained, and the model went to production.
    from trainer.contract import RunLayout, production_pointer, run_prefix
    from trainer.storage import open_storage

    store = open_storage(af.storage_root)
    layout = RunLayout(run_prefix(af.storage_root, DAG_ID, run_id, "train"))
    assert store.get_json(layout.latest)["step"] == 20
    job = store.get_json(layout.job)
    assert [a["classification"] for a in job["attempts"]] == ["succeeded"]
    assert job["capacity"] == "spot" and job["attempts"][0]["nodes"] == 1
    assert job["attempts"][0]["spec"]["restarts_in_place"] == 1  # the form's, rendered into the launch
    pointer = store.get_json(production_pointer(af.storage_root, "retrain-lm"))
    assert pointer["run_uri"] == layout.run_uri
    # ... promoted by the user who triggered it through the API
    card = store.get_json(f"{pointer['uri']}/card.json")
    assert card["promoted_by"] == {"user": "admin", "trigger": "manual", "run_id": run_id}
    assert pointer["history"][-1]["by"] == "admin"

    # One step from random weights cannot pass the gate: the run stays green, the reason is in
    # its note, written by a supervised worker (no database) through the REST API.
    response = af.trigger({**PAYLOAD, "max_steps": 1, "warm_start": "none"})
    assert response.status_code == 200, response.text
    rejected_id = response.json()["dag_run_id"]
    run, states = af.wait_run(DAG_ID, rejected_id)
    assert run["state"] == "success" and (states["gate"], states["promote"]) == ("success", "skipped"), states
    assert run["note"].startswith("REJECTED: retrain-lm failed 2 of 2 gate checks (against production v1)")
    gate_ti = af.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{rejected_id}/taskInstances/gate").json()
    assert gate_ti["note"] == run["note"]
    assert store.get_json(production_pointer(af.storage_root, "retrain-lm")) == pointer

    # A setting the form lets through but the plan does not know fails the run at once, and
    # its note says where and why (fail_fast writes it through the REST API).
    response = af.trigger({**PAYLOAD, "max_step": 3})
    assert response.status_code == 200, response.text
    failed_id = response.json()["dag_run_id"]
    run, states = af.wait_run(DAG_ID, failed_id)
    assert run["state"] == "failed" and states["plan"] == "failed", states
    assert run["note"].startswith("FAILED at plan: ") and "max_step" in run["note"], run["note"]

    # The trainops home page leads with one row per DAG run, its outcome in words and colour:
    # the promoted run, the rejected one with its check, and the one that failed at a setting.
    home = af.request("GET", "/trainops/")
    assert home.status_code == 200, home.text
    runs_table = home.text.split("<h2>Runs</h2>", 1)[1].split("</table>", 1)[0]
    row_of = {
        rid: next(r for r in runs_table.split("<tr>") if html.escape(rid) in r)
        for rid in (run_id, rejected_id, failed_id)
    }
    assert 'class="outcome-promoted pass">promoted v1<' in row_of[run_id]
    assert 'class="outcome-rejected fail">rejected: ' in row_of[rejected_id]
    assert "eval_loss" in row_of[rejected_id]
    assert (
        'class="outcome-failed fail">failed at plan: ' in row_of[failed_id]
        and "max_step" in row_of[failed_id]
    )
    # ... and as a browser shows them: headless Chromium, through a proxy that adds the token a
    # logged-in browser's cookie stands for; and the rejected run's page in Airflow's UI, with
    # its note naming the failed check.
    if os.path.exists(CHROMIUM):
        with SigningProxy(af.base, af.token) as proxy:
            shown = browse(f"{proxy.url}/trainops/", af.tmp / "chromium").outcomes
            ui = browse(
                f"{proxy.url}/dags/{DAG_ID}/runs/{rejected_id}", af.tmp / "chromium", virtual_time_ms=20_000
            )
        assert ("promoted", "promoted v1") in shown, shown
        assert any(k == "rejected" and t.startswith("rejected: ") and "eval_loss" in t for k, t in shown), (
            shown
        )
        assert any(
            k == "failed" and t.startswith("failed at plan: ") and "max_step" in t for k, t in shown
        ), shown
        assert "REJECTED: retrain-lm failed 2 of 2 gate checks" in ui.text, ui.text[-2000:]

    # A bad payload is refused when triggered, naming the field, and starts nothing.
    runs_before = af.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    for conf, field in (
        ({**PAYLOAD, "nodes": 0}, "nodes"),
        ({**PAYLOAD, "capacity": "cheapest"}, "capacity"),
    ):
        response = af.trigger(conf)
        assert response.status_code == 400, response.text
        assert f"Invalid input for param {field}" in response.json()["detail"], response.text
    assert af.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns").json()["total_entries"] == runs_before
    print(f"real Airflow: retrain_manual checked after {time.monotonic() - started:.0f}s")


def test_data_team_snapshot_triggers_retrain_on_new_data(real_airflow):
    """A real asset event: the producer lands a snapshot, the scheduler starts the consumer,
    whose source task reads the event's extra and stages exactly that snapshot."""
    af = real_airflow
    # The unattended DAGs' training settings, as an operator would set them: a short run.
    response = af.request(
        "POST",
        "/api/v2/variables",
        json={"key": "trainops_retrain", "value": json.dumps({"max_steps": 20, "lr": 0.004})},
    )
    assert response.status_code == 201, response.text
    af.unpause("retrain_on_new_data")
    # Switched on, the producer runs once for its latest daily slot (catchup is off), as it
    # would for a data team enabling it.
    af.unpause("data_team_publish")

    def only_run(dag_id):
        def check():
            runs = af.request("GET", f"/api/v2/dags/{dag_id}/dagRuns").json()["dag_runs"]
            assert len(runs) <= 1, runs
            return runs[0] if runs else None

        return check

    producer = af.wait_for("data_team_publish to start", only_run("data_team_publish"), timeout=60)
    assert producer["run_type"] == "scheduled"
    run, states = af.wait_run("data_team_publish", producer["dag_run_id"], timeout=120)
    assert run["state"] == "success", states
    landed = af.xcom("data_team_publish", producer["dag_run_id"], "land_raw_data")
    assert landed["rows"] == 4000 and landed["uri"].startswith(f"{af.storage_root}/raw/datateam/")

    consumer = af.wait_for(
        "the asset event to start retrain_on_new_data", only_run("retrain_on_new_data"), timeout=60
    )
    assert consumer["run_type"] == "asset_triggered"
    run, states = af.wait_run("retrain_on_new_data", consumer["dag_run_id"])
    assert run["state"] == "success", states
    chosen = af.xcom("retrain_on_new_data", consumer["dag_run_id"], "source")
    assert chosen["uri"] == landed["uri"] and chosen["rows"] == 4000
    assert chosen["from_event"]["source_dag_id"] == "data_team_publish"
    stage = af.xcom("retrain_on_new_data", consumer["dag_run_id"], "stage")
    assert stage["rows"] == 4000 and stage["dataset_name"] == "demo-text"
    assert af.xcom("retrain_on_new_data", consumer["dag_run_id"], "train")["steps"] == 20
