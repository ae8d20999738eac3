"""The quiet demo's watcher over the records a run leaves: Airflow's DB rows, job.json, the
metrics; and the deletion of a run's local jobs."""

from __future__ import annotations

import io
import json
import sqlite3
import time
from pathlib import Path

from tests.trainops.cli.test_quiet import PREEMPTED
from trainer.contract import RunLayout, run_prefix, safe_segment
from trainer.storage import open_storage
from trainops.cli.watch import (
    DEMO_DAG,
    Console,
    DemoWatch,
    newest_run_id,
    read_run,
    read_xcom,
    sqlite_path,
    stop_jobs,
    summary_text,
)
from trainops.cluster.local.backend import LocalCluster
from trainops.cluster.local.pgroups import job_processes
from trainops.cluster.spec import JobSpec

RUN_ID = "manual__2026-12-01T20:59:22.410112+00:00"


def airflow_db(path: Path) -> Path:
    """The columns of Airflow 3's dag_run and task_instance that the watcher reads."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE dag_run (id INTEGER PRIMARY KEY, dag_id TEXT, run_id TEXT, state TEXT)")
        conn.execute(
            "CREATE TABLE task_instance (dag_id TEXT, run_id TEXT, task_id TEXT, state TEXT, "
            "try_number INTEGER, duration REAL, start_date TEXT)"
        )
        conn.execute("INSERT INTO dag_run VALUES (1, ?, 'an-older-run', 'success')", (DEMO_DAG,))
    return path


def set_task(db: Path, task_id: str, state: str, start: str, duration: float | None = None) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM task_instance WHERE task_id = ?", (task_id,))
        conn.execute(
            "INSERT INTO task_instance VALUES (?, ?, ?, ?, 1, ?, ?)",
            (DEMO_DAG, RUN_ID, task_id, state, duration, start),
        )


def test_the_watch_prints_tasks_progress_and_attempts_once_each(tmp_path):
    db = airflow_db(tmp_path / "airflow.db")
    assert sqlite_path(f"sqlite:///{db}") == db and sqlite_path("postgresql://x") is None
    assert newest_run_id(db) == 1 and newest_run_id(tmp_path / "none.db") == 0
    root = f"file://{tmp_path}/storage"
    out = io.StringIO()
    watch = DemoWatch(Console(out), db, newest_run_id(db), root)
    watch.poll()
    assert out.getvalue() == ""  # no run of ours yet (the older one is not ours)

    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO dag_run VALUES (2, ?, ?, 'running')", (DEMO_DAG, RUN_ID))
    set_task(db, "stage", "success", "1", 2.5)
    set_task(db, "train", "deferred", "2")
    layout = RunLayout(run_prefix(root, DEMO_DAG, RUN_ID, "train"))
    run_dir = Path(layout.run_uri[len("file://") :])
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("train:\n  max_steps: 120\n")
    now = time.time()
    for part, (step, at) in enumerate([(10, now), (40, now + 3)], start=1):
        record = {"step": step, "loss": 3.0, "tokens_per_s": 9000.0, "attempt": 1, "time": at}
        (run_dir / "metrics" / f"part-000001-{part:08d}.jsonl").write_text(json.dumps(record) + "\n")
        watch.poll()
    watch.poll()
    (run_dir / "job.json").write_text(
        json.dumps({"attempts": [PREEMPTED, {"attempt": 2, "status": "running"}]})
    )
    watch.poll()
    set_task(db, "train", "success", "2", 38.9)
    watch.poll()
    watch.poll()
    assert watch.run_id == RUN_ID
    assert out.getvalue().splitlines() == [
        "stage        success             2.5s  (try 1)",
        "attempt 1: step 10/120  loss 3.000  9,000 tok/s",
        "attempt 1: step 40/120  loss 3.000  9,000 tok/s  ETA 8s",
        "attempt 1 preempted at step 55 (injected SIGTERM); resuming from checkpoint step 55",
        "train        success            38.9s  (try 1)",
    ]


def test_a_damaged_job_json_is_one_line_naming_the_field_not_a_crash(tmp_path):
    db = airflow_db(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/storage"
    out = io.StringIO()
    watch = DemoWatch(Console(out), db, newest_run_id(db), root)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO dag_run VALUES (2, ?, ?, 'running')", (DEMO_DAG, RUN_ID))
    layout = RunLayout(run_prefix(root, DEMO_DAG, RUN_ID, "train"))
    run_dir = Path(layout.run_uri[len("file://") :])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("train:\n  max_steps: 120\n")
    (run_dir / "job.json").write_text(json.dumps({"attempts": [{**PREEMPTED, "attempt": {"n": 1}}]}))
    set_task(db, "train", "success", "2", 38.9)  # its attempts are read once more as it ends
    watch.poll()
    watch.poll()
    assert out.getvalue().splitlines() == [
        f"training record unreadable: {layout.job}: field 'attempts[0].attempt' should be a whole number, "
        "got an object with 1 field(s); the run's record is damaged: restore it, or move it aside to start "
        "the run's bookkeeping afresh",
        "train        success            38.9s  (try 1)",
    ]


def test_data_staging_rejected_is_summed_up_from_the_stage_tasks_report(tmp_path):
    db = airflow_db(tmp_path / "airflow.db")
    root = f"file://{tmp_path}/storage"
    watch = DemoWatch(Console(io.StringIO()), db, newest_run_id(db), root)
    report = f"{root}/datasets/demo-text/9c1e/validation.json"
    failed = {"expectation": "expect_column_values_to_be_unique", "column": "id", "unexpected_count": 4}
    open_storage(root).put_json(report, {"success": False, "failed": [{**failed, "sample_values": ["w-1"]}]})
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO dag_run VALUES (2, ?, ?, 'failed')", (DEMO_DAG, RUN_ID))
        conn.execute(  # Airflow 3's xcom columns that the watcher reads; values are JSON
            'CREATE TABLE xcom (dag_id TEXT, run_id TEXT, task_id TEXT, map_index INTEGER, "key" TEXT, value JSON)'
        )
        conn.execute(
            "INSERT INTO xcom VALUES (?, ?, 'stage', -1, 'trainops_validation_report', ?)",
            (DEMO_DAG, RUN_ID, json.dumps(report)),
        )
    child = "\ntrainops demo summary\n---------------------\ndataset          REJECTED by staging (...)\n"
    set_task(db, "stage", "running", "1")
    watch.poll()
    assert summary_text(child, watch, root, "demo-lm") == child  # staging has not failed (yet)
    set_task(db, "stage", "failed", "1", 2.0)
    watch.poll()
    assert read_xcom(db, DEMO_DAG, RUN_ID, "stage", "trainops_validation_report") == report
    text = summary_text(child, watch, root, "demo-lm")
    assert (
        "staging rejected the data: id: expect_column_values_to_be_unique failed for 4 rows (e.g. 'w-1')"
        in text
    )
    assert "/trainops/report?uri=" in text and "python -m trainops models demo-lm" in text
    assert read_xcom(db, DEMO_DAG, RUN_ID, "stage", "another_key") is None
    assert read_xcom(tmp_path / "missing.db", DEMO_DAG, RUN_ID, "stage", "trainops_validation_report") is None


def test_read_run_of_a_busy_or_missing_db_is_no_answer(tmp_path):
    assert read_run(tmp_path / "missing.db", DEMO_DAG, 0) is None
    (tmp_path / "garbage.db").write_text("not a database")
    assert read_run(tmp_path / "garbage.db", DEMO_DAG, 0) is None


def test_on_a_terminal_the_progress_is_one_bar_redrawn_under_the_lines():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    console = Console(out)
    console.progress("[##--] step 1")
    console.progress("[###-] step 2")
    console.line("attempt 1 preempted")
    assert out.getvalue() == "\r\x1b[2K[##--] step 1\r\x1b[2K[###-] step 2\r\x1b[2Kattempt 1 preempted\n"


def test_stop_jobs_deletes_the_runs_live_jobs_and_waits_for_their_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    cluster = LocalCluster()
    labels = {"trainops/dag": DEMO_DAG, "trainops/run": safe_segment(RUN_ID)}
    ours = cluster.launch(
        JobSpec(
            name="train-x-a1",
            args=["python", "-c", "import time; time.sleep(120)"],
            labels=labels,
            distributed=False,
        )
    )
    other = cluster.launch(
        JobSpec(
            name="train-y-a1",
            args=["python", "-c", "import time; time.sleep(120)"],
            labels={**labels, "trainops/run": "another-run"},
            distributed=False,
        )
    )
    deadline = time.monotonic() + 30
    while not (job_processes(Path(ours["job_dir"])) and job_processes(Path(other["job_dir"]))):
        assert time.monotonic() < deadline, "the jobs never started"
        time.sleep(0.05)
    try:
        assert stop_jobs(DEMO_DAG, RUN_ID, wait_s=30) == (["train-x-a1"], [])
        assert job_processes(Path(ours["job_dir"])) == []
        assert job_processes(Path(other["job_dir"]))  # another run's job is left alone
    finally:
        cluster.delete(other)
    assert stop_jobs(DEMO_DAG, None, wait_s=30)[1] == []
