"""The demo DAG through Airflow's own dag.test(), and one first run shared by the tests that
start from it.

A demo run trains for about 40 s of CPU. The README walkthrough (``test_demo_dag.py``) and the
browser click-through (``test_home_browser.py``) both start from a first, promoted run, so they
share one: the session fixture ``demo_first_run`` (in ``tests/e2e/conftest.py``). It is listed in
``SHARED_SESSION_FIXTURES`` (tests/conftest.py), so under xdist both tests run on one worker and
the run is made once. The walkthrough goes on from it (more runs, a rollback); the browser test
only follows the links of the first run, which those later runs leave as they were.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from trainops.cli.main import DEMO_DAG, DEMO_TASKS, load_dag, xcom_results


def run_demo(run_conf: dict | None = None):
    """One run of the demo DAG with ``run_conf``: the DagRun and each task's XCom result."""
    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DEMO_DAG)
    dagrun = dag.test(run_conf=run_conf)
    return dagrun, xcom_results(DEMO_DAG, dagrun.run_id, DEMO_TASKS)


def run_note(run_id: str) -> str | None:
    from trainops.cli.main import run_note as note_of

    return note_of(DEMO_DAG, run_id)


def task_states(run_id: str) -> dict:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter_by(dag_id=DEMO_DAG, run_id=run_id).all()
        return {ti.task_id: str(ti.state).rsplit(".", 1)[-1].lower() for ti in rows}


@dataclass(frozen=True)
class FirstRun:
    """The shared first demo run: where it wrote, what it returned and what it logged."""

    root: str  # its storage root (file://)
    local_state: str  # the local cluster's state folder
    run_id: str
    state: str  # the DagRun's state
    results: dict  # each task's XCom result
    log: str  # everything the run printed (task logs, stdout and stderr)


def make_first_run(tmp, capture_manager) -> FirstRun:
    """Run the demo once under a storage root of its own in ``tmp``, reading its log from
    pytest's own output capture (the run is made during a test's setup)."""
    if capture_manager is None or not capture_manager.is_globally_capturing():
        pytest.fail("the shared demo run reads its log from pytest's output capture: run without -s")
    root, local_state = f"file://{tmp}/storage", str(tmp / "local")
    capture_manager.read_global_capture()  # drop what came before the run
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRAINOPS_STORAGE_ROOT", root)
        env.setenv("TRAINOPS_LOCAL_STATE", local_state)
        dagrun, results = run_demo()
    out, err = capture_manager.read_global_capture()
    return FirstRun(root, local_state, dagrun.run_id, str(dagrun.state), results, out + err)
