"""A deferred training task's ``execution_timeout`` fires: the job is deleted, the attempt is
recorded, nothing is left running. Real parts: a DAG run by ``dag.test()`` (its trigger in the
test's process, as dag.test runs triggers), the local cluster's supervisor and torchrun.

Airflow 3.3 does not bound a deferral by ``execution_timeout``, and cancels a timed-out trigger
without ``on_kill``; the operator therefore hands the deadline to its trigger, which reports
it ``DEADLINE_MARGIN_S`` (30 s) before (trainops.operators.base). The second test takes the
path where Airflow's own deferral timeout wins the race: the task is resumed in
``resume_execution("__fail__")``, which must delete the live job before Airflow fails the task.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from airflow.sdk.bases.operator import TriggerFailureReason
from airflow.sdk.exceptions import TaskDeferralTimeout, TaskDeferred

from tests.trainer.helpers import TRAIN_KEYS, write_dataset
from trainer.contract import RunLayout, run_prefix
from trainer.storage import open_storage
from trainops.cli.main import load_dag
from trainops.operators import FSDPTrainingOperator
from trainops.triggers.job import DEADLINE_MARGIN_S

pytestmark = pytest.mark.slow

TIMEOUT_S = DEADLINE_MARGIN_S + 15  # the deadline event comes some 15 s after the task starts
LONG_RUN = {**TRAIN_KEYS, "train": {**TRAIN_KEYS["train"], "max_steps": 1_000_000}}


def gang_processes(local_state: Path) -> list[psutil.Process]:
    """Every process a local job of this test started that is still alive (supervisors, torchrun
    agents and their workers, found by the job directory in their command lines or cwd)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(proc.info["cmdline"] or [])
            if str(local_state) in text or str(local_state) in (proc.cwd() or ""):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def node_pids(local_state: Path) -> list[int]:
    import json

    pids = []
    for status in local_state.glob("jobs/*/status.json"):
        pids += [n["pid"] for n in json.loads(status.read_text())["nodes"] if n.get("pid")]
    return pids


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.1)


def nothing_left(local_state: Path) -> bool:
    return not [
        p for p in node_pids(local_state) if psutil.pid_exists(p) and not zombie(p)
    ] and not gang_processes(local_state)


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


DAG_FILE = f"""
import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from tests.e2e.test_execution_timeout import training

with DAG("deadline", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
    training(
        os.environ["DEADLINE_TEST_ROOT"],
        os.environ["DEADLINE_TEST_DATASET"],
        deferrable=True,
        execution_timeout=timedelta(seconds={TIMEOUT_S}),
    )
"""


def training(root: str, dataset: str, **kw) -> FSDPTrainingOperator:
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": dataset},
        storage_root=root,
        trainer_config=LONG_RUN,
        nodes=2,
        cluster="local",
        poll_interval=0.5,
        progress_every=3600,
        termination_grace_seconds=5,
        job_options={"env": {"OMP_NUM_THREADS": "1"}},
        **kw,
    )


def test_a_deferred_tasks_execution_timeout_deletes_the_job_and_leaves_nothing_running(
    tmp_path, monkeypatch, airflow_db
):
    root, local_state = f"file://{tmp_path}/storage", tmp_path / "local"
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(local_state))
    dataset = write_dataset(tmp_path / "data" / "datasets" / "demo" / "v1")
    dags = tmp_path / "dags"  # dag.test() runs DAGs of a bundle: this one is the only DAG in it
    dags.mkdir()
    (dags / "deadline.py").write_text(DAG_FILE)
    from airflow import settings

    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(dags))
    monkeypatch.setattr(settings, "DAGS_FOLDER", str(dags))  # what the dags-folder bundle reads
    monkeypatch.setenv("DEADLINE_TEST_ROOT", root)
    monkeypatch.setenv("DEADLINE_TEST_DATASET", dataset)
    dag = load_dag(str(dags), "deadline")

    started = time.monotonic()
    dagrun = dag.test()
    took = time.monotonic() - started

    (ti,) = dagrun.get_task_instances()
    assert str(ti.state).endswith("failed")
    assert took < TIMEOUT_S + 10  # ended by the deadline event, not by a run of a million steps
    layout = RunLayout(run_prefix(root, "deadline", dagrun.run_id, "train"))
    job = open_storage(root).get_json(layout.job)
    entry = job["attempts"][-1]
    assert job["status"] == "failed"
    assert entry["classification"] == "timeout" and "execution_timeout ends at" in entry["reason"]
    assert entry["state"]["phase"] == "running"  # it was running when the deadline came
    assert node_pids(local_state), "the job never started"
    wait_until(lambda: nothing_left(local_state), "every process of the gang to be gone")
    print(
        f"\nexecution_timeout {TIMEOUT_S:.0f} s: task failed after {took:.1f} s, job deleted, 0 processes left"
    )


def test_when_airflows_deferral_timeout_wins_the_resumed_task_deletes_the_live_job(tmp_path, monkeypatch):
    root, local_state = f"file://{tmp_path}/storage", tmp_path / "local"
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(local_state))
    dataset = write_dataset(tmp_path / "data" / "datasets" / "demo" / "v1")
    ctx = {"ti": SimpleNamespace(dag_id="deadline", run_id="manual__1", task_id="train", map_index=-1)}
    with pytest.raises(TaskDeferred) as deferred:
        training(root, dataset, deferrable=True, execution_timeout=timedelta(hours=1)).execute(ctx)
    handle = deferred.value.trigger.handle
    wait_until(lambda: training(root, dataset).backend.status(handle)["phase"] == "running", "the job to run")

    # Airflow's scheduler timed the deferral out: a new worker resumes the task only to fail it.
    resumed = training(root, dataset, deferrable=True, execution_timeout=timedelta(hours=1))
    with pytest.raises(TaskDeferralTimeout):
        resumed.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, ctx)
    wait_until(lambda: nothing_left(local_state), "every process of the gang to be gone")
    # recorded as the deadline event would have: the next try must not take it for a lost attempt
    job = open_storage(root).get_json(RunLayout(run_prefix(root, "deadline", "manual__1", "train")).job)
    (entry,) = job["attempts"]
    assert (job["status"], entry["status"], entry["classification"]) == ("failed", "ended", "timeout")
    assert "Airflow failed the deferral" in entry["reason"] and "the job was deleted" in entry["reason"]
