"""The demo DAG through Airflow's own dag.test(), and one first run shared by the tests that
start from it.

A demo run trains for about 40 s of CPU. The README walkthrough (``test_demo_dag.py``), the
browser click-through (``test_home_browser.py``) and the terminal's check (``test_quiet_demo.py``)
all start from a first, promoted run, so they share one: the session fixture ``demo_first_run``
(in ``tests/e2e/conftest.py``). It is made as a user makes it, by ``python -m trainops demo`` in a
subprocess, on a private storage root, local state and temp dir, and the worker's own Airflow DB
(so this process reads its XCom results and notes). It is listed in ``SHARED_SESSION_FIXTURES``
(tests/conftest.py), so under xdist these tests run on one worker and the run is made once. The
walkthrough goes on from it in this process (more runs, a rollback); the others only read the
first run, which those later runs leave as they were.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainops.cli.main import DEMO_DAG, DEMO_TASKS, load_dag, xcom_results

REPO = Path(__file__).resolve().parents[2]


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


def demo_env(tmp: Path) -> dict[str, str]:
    """The environment of a ``python -m trainops demo`` subprocess: this worker's Airflow (its
    DB), and a storage root, local state and temp dir of its own under ``tmp``."""
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "TRAINOPS_STORAGE_ROOT": f"file://{tmp}/storage",
            "TRAINOPS_LOCAL_STATE": str(tmp / "local"),
            "TMPDIR": str(tmp / "tmp"),  # the demo's own: what it leaves there is under test
            "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)]),
        }
    )
    env.pop("COLUMNS", None)
    return env


def start_demo(env: dict, terminal: Path) -> subprocess.Popen[bytes]:
    """The demo, its stdout and stderr going to ``terminal`` (a file: a pipe nobody reads
    while the test waits would fill and stall a chatty demo)."""
    with open(terminal, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "trainops", "demo", "--project-dir", str(REPO)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@dataclass(frozen=True)
class FirstRun:
    """The shared first demo run: where it wrote, what it printed, returned and logged."""

    root: str  # its storage root (file://)
    local_state: str  # the local cluster's state folder
    tmp: Path  # its temp dir (TMPDIR)
    returncode: int  # the command's exit status
    terminal: str  # what the command printed
    run_id: str  # "" when the command never named its DAG run
    state: str  # the DagRun's state, as the command's last line gives it
    results: dict  # each task's XCom result
    log: str  # the full log (task logs, the trainer's output), from the file the command names


# The command's last line: "DAG run <run id>: <state> in <n>s; full log: <path>".
LAST_LINE = re.compile(r"^DAG run (?P<run_id>\S+): (?P<state>\w+) in \d+s; full log: (?P<log>.+)$")


def make_first_run(tmp: Path) -> FirstRun:
    """Run ``python -m trainops demo`` once, as ``make demo`` does, under ``tmp``."""
    env = demo_env(tmp)
    demo = start_demo(env, tmp / "terminal")
    try:
        demo.wait(timeout=300)
    finally:
        if demo.poll() is None:  # stuck: Ctrl-C, as a user would (it stops its jobs)
            demo.send_signal(signal.SIGINT)
            demo.wait(timeout=120)
    terminal = (tmp / "terminal").read_text()
    lines = terminal.splitlines()
    last = LAST_LINE.match(lines[-1]) if lines else None
    run_id, state = (last["run_id"], last["state"]) if last else ("", "")
    log = Path(last["log"]).read_text() if last else ""
    results = xcom_results(DEMO_DAG, run_id, DEMO_TASKS) if run_id else {}
    root, local_state = env["TRAINOPS_STORAGE_ROOT"], env["TRAINOPS_LOCAL_STATE"]
    return FirstRun(
        root, local_state, tmp / "tmp", int(demo.returncode), terminal, run_id, state, results, log
    )
