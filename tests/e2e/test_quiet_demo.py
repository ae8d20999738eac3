"""``python -m trainops demo`` as a user runs it: what the terminal shows, and what Ctrl-C does.

Both run the real CLI in a subprocess (the demo DAG through ``dag.test()``, torchrun on the
local backend, one injected preemption) on a private storage root, local state and temp dir.
The first is the shared first demo run (``demo_first_run``, tests/e2e/demo_run.py), which the
README walkthrough and the browser test go on from.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.demo_run import demo_env as make_demo_env
from tests.e2e.demo_run import start_demo
from trainops.cluster.local.pgroups import job_processes, recorded_groups

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_env(tmp_path, airflow_db):
    return make_demo_env(tmp_path)


def test_the_demo_prints_a_few_lines_a_preemption_line_and_the_summary(demo_first_run):
    out = demo_first_run.terminal
    lines = out.splitlines()
    assert demo_first_run.returncode == 0, out
    assert len(lines) <= 60, f"{len(lines)} lines:\n{out}"
    assert "Traceback" not in out and "ChildFailedError" not in out, out
    assert lines[0].startswith("full log: ") and lines[0].split()[2].endswith(".log")
    log = Path(lines[0].split()[2])
    assert "ChildFailedError" not in log.read_text()  # the relay folds torchrun's traceback too
    assert "[DAG TEST]" in log.read_text()  # Airflow's own log went to the file
    preempted = [line for line in lines if "preempted" in line]
    assert len(preempted) == 1, out
    assert preempted[0].startswith("attempt 1 preempted at step ")
    assert "(injected SIGTERM); resuming from checkpoint step " in preempted[0]
    for task in ("stage", "train", "evaluate", "gate", "promote"):
        assert any(line.startswith(f"{task} ") and " success " in line for line in lines), (task, out)
    assert any(line.startswith("attempt 2: step 120/120  loss ") for line in lines), out
    assert "trainops demo summary" in out and "promoted         demo-lm v" in out
    assert lines[-1].startswith("DAG run manual__") and ": success in " in lines[-1]
    # the summary ends pointing onward: the run's report under make airflow, then three commands
    (report,) = [line for line in lines if line.startswith("  run report     ")]
    assert report.split()[-1].startswith("http://localhost:8080/trainops/report?uri=file%3A%2F%2F")
    assert report.endswith("%2Ftrain%2Fjob.json")
    assert lines[-5] == "look further"
    assert [line.split("  ")[1] for line in lines[-4:-1]] == [
        "python -m trainops status latest",
        "python -m trainops report latest",
        "python -m trainops models demo-lm",
    ]
    # torchrun's agent makes a torchelastic_* folder in its temp dir on every attempt of every
    # node: each node's temp dir is its attempt's, and goes when the attempt ends.
    left = [p.name for p in demo_first_run.tmp.iterdir() if p.name.startswith("torchelastic_")]
    assert left == [] and list(Path(demo_first_run.local_state).glob("jobs/*/node-*/tmp")) == []


def _live_train_job(local_state: Path) -> Path | None:
    """A training job of the run whose every node's process group is recorded and running."""
    for job_dir in sorted((local_state / "jobs").glob("train-*")):
        groups, _ = recorded_groups(job_dir)
        if len(groups) == 2 and len(job_processes(job_dir)) >= 2:
            return job_dir
    return None


def test_ctrl_c_stops_the_run_and_leaves_no_trainer_process(demo_env, tmp_path):
    demo = start_demo(demo_env, tmp_path / "terminal")
    local_state = Path(demo_env["TRAINOPS_LOCAL_STATE"])
    deadline = time.monotonic() + 180
    job_dir = None
    while job_dir is None and demo.poll() is None and time.monotonic() < deadline:
        job_dir = _live_train_job(local_state)
        if job_dir is None:
            time.sleep(0.2)
    assert job_dir is not None, f"no training job started: {(tmp_path / 'terminal').read_text()[-3000:]}"
    groups, _ = recorded_groups(job_dir)
    demo.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
    demo.send_signal(signal.SIGINT)  # and ``make demo`` passes its own on: no harm done
    demo.wait(timeout=120)
    out = (tmp_path / "terminal").read_text()
    assert demo.returncode == 130, out
    last = out.splitlines()[-1]
    assert last.startswith("interrupted: stopped DAG run manual__"), out
    assert "no trainer process is left" in last
    assert "Traceback" not in out
    assert job_processes(job_dir) == []
    for pgid in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
