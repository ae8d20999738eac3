"""The quiet ``python -m trainops demo``: the DAG runs in a child process whose whole output
(Airflow's, great-expectations', the trainer's) goes to a log file, while this process watches
what the run records and prints a few lines: one per task and per training attempt, the
training progress, and the summary.

It reads only records, never log text: task instances from Airflow's SQLite metadata DB (read
only), ``job.json`` (checked by :func:`trainops.shapes.check_job`: a damaged one is one line
naming the field), ``config.yaml`` and the metrics under the run prefix (through
``trainer.contract.MetricsReader``). When staging rejected the data, the child's summary cannot
name the failed expectations (a failed task returns nothing); this process reads the stage
task's validation report (its XCom ``trainops_validation_report``) and renders the summary with
it (:func:`staging_summary`). Ctrl-C stops the child (which marks the DAG run failed
and deletes its jobs, :func:`stop_jobs`), checks that no process of the jobs is left, says so
in one line and exits 130.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import yaml

from trainer.contract import MetricsReader, RunLayout, run_prefix, safe_segment
from trainer.storage import NotFound, open_storage
from trainops.cli import quiet, summary
from trainops.cli.devenv import apply_dev_env, storage_root_choice
from trainops.cluster.local.backend import LocalCluster
from trainops.shapes import ShapeError, check_job, load

DEMO_DAG = "trainops_demo"
# demo --task: the DAG each task's demo runs, and the model it promotes
DEMOS = {
    "causal_lm": (DEMO_DAG, "demo-lm"),
    # not a task: demo --best-checkpoint, the causal_lm demo promoting its best checkpoint
    "best_checkpoint": ("trainops_demo_best_checkpoint", "demo-lm-best"),
    "sft": ("trainops_demo_sft", "demo-sft"),
    "classification": ("trainops_demo_classification", "demo-classifier"),
}
BEST_CHECKPOINT = "best_checkpoint"
TASK_DEMOS = tuple(d for d in DEMOS if d != BEST_CHECKPOINT)  # demo --task's choices
POLL_S = 0.5
# The stage task's XCom key for its validation report (trainops.links.VALIDATION_REPORT_KEY,
# not imported: it imports Airflow, which this process must not load).
VALIDATION_REPORT_KEY = "trainops_validation_report"
# How long a stopped child gets to mark its run failed and delete its jobs before SIGKILL.
STOP_GRACE_S = 60.0


def sqlite_path(conn: str | None) -> Path | None:
    """The file of a ``sqlite:////abs/path`` connection URI (None: not SQLite)."""
    if not conn or not conn.startswith("sqlite:///"):
        return None
    return Path(conn[len("sqlite:///") :])


def newest_run_id(db: Path) -> int:
    """The highest ``dag_run.id`` so far (0: none, or no DB yet)."""
    try:
        with _connect(db) as conn:
            row = conn.execute("SELECT max(id) FROM dag_run").fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0] or 0)


def _connect(db: Path) -> sqlite3.Connection:
    if not db.exists():
        raise sqlite3.OperationalError(f"no database at {db} yet")
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)


def read_run(db: Path, dag_id: str, after_id: int) -> tuple[str, str, list[quiet.TaskRow]] | None:
    """The run of ``dag_id`` created after ``after_id`` (its run id, state and task rows);
    None when there is none yet or the DB is busy (the next poll reads again)."""
    try:
        with _connect(db) as conn:
            run = conn.execute(
                "SELECT run_id, state FROM dag_run WHERE dag_id = ? AND id > ? ORDER BY id DESC LIMIT 1",
                (dag_id, after_id),
            ).fetchone()
            if run is None:
                return None
            rows = conn.execute(
                "SELECT task_id, state, try_number, duration FROM task_instance "
                "WHERE dag_id = ? AND run_id = ? ORDER BY start_date",
                (dag_id, run[0]),
            ).fetchall()
    except sqlite3.Error:
        return None
    tasks: list[quiet.TaskRow] = [
        {"task_id": r[0], "state": r[1], "try_number": int(r[2] or 0), "duration": r[3]} for r in rows
    ]
    return run[0], run[1], tasks


def read_xcom(db: Path, dag_id: str, run_id: str, task_id: str, key: str) -> Any:
    """A task's XCom value (stored as JSON); None when there is none, or it cannot be read."""
    try:
        with _connect(db) as conn:
            row = conn.execute(
                'SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND "key" = ? '
                "AND map_index = -1",
                (dag_id, run_id, task_id, key),
            ).fetchone()
    except sqlite3.Error:
        return None
    try:
        return None if row is None or row[0] is None else json.loads(row[0])
    except (TypeError, ValueError):
        return None


def staging_summary(root: str, model_name: str, validation_uri: str) -> str:
    """The summary of a run whose data staging rejected, naming each failed expectation from
    the validation report at ``validation_uri`` (nothing ran after staging: no other results)."""
    facts = summary.collect(open_storage(root), root, {}, model_name, validation_uri=validation_uri)
    return summary.render(facts)


def stop_jobs(dag_id: str, run_id: str | None, *, wait_s: float = 60.0) -> tuple[list[str], list[str]]:
    """Delete the live local jobs of a DAG run (of any run of ``dag_id`` when ``run_id`` is
    None) and wait up to ``wait_s`` for their processes to go; return the job ids deleted and
    those with a process still left."""
    cluster = LocalCluster()
    labels = {"trainops/dag": dag_id}
    if run_id is not None:
        labels["trainops/run"] = safe_segment(run_id)
    handles = cluster.find(labels)
    for handle in handles:
        cluster.delete(handle)
    deadline = time.monotonic() + wait_s
    left = list(handles)
    while left and time.monotonic() < deadline:
        left = [h for h in left if not cluster.all_gone(h)]
        if left:
            time.sleep(0.2)
    return [h["job_id"] for h in handles], [h["job_id"] for h in left]


class Console:
    """Permanent lines and, on a terminal, one progress bar redrawn under them."""

    def __init__(self, out: IO[str]):
        self.out = out
        self.tty = out.isatty()
        self._bar = False

    def line(self, text: str) -> None:
        self.clear()
        self.out.write(text + "\n")
        self.out.flush()

    def progress(self, text: str) -> None:
        self.out.write("\r\x1b[2K" + text)
        self.out.flush()
        self._bar = True

    def clear(self) -> None:
        if self._bar:
            self.out.write("\r\x1b[2K")
            self._bar = False


class DemoWatch:
    """What one demo run has printed so far, and the reads that print the rest.

    :param db: Airflow's SQLite metadata DB.
    :param after_id: the newest ``dag_run.id`` before the run was started.
    :param root: the storage root the run writes to.
    """

    def __init__(self, console: Console, db: Path | None, after_id: int, root: str, dag_id: str = DEMO_DAG):
        self.console, self.db, self.after_id, self.root = console, db, after_id, root
        self.dag_id = dag_id
        self.run_id: str | None = None
        self.run_state: str | None = None
        self.task_states: dict[str, str] = {}  # task id -> its state when last read
        self._printed_tasks: set[tuple[str, int]] = set()
        self._printed_attempts: set[int] = set()
        self._store: Any = None
        self._metrics: Any = None
        self._total: int | None = None
        self._first: dict[int, tuple[int, float]] = {}  # attempt -> its first seen (step, time)
        self._last_line_step: int | None = None
        self._damaged: str | None = None  # the message of a damaged job.json, once printed

    def poll(self) -> None:
        """Read what is new and print its lines (a read that fails now is read again later)."""
        if self.db is not None:
            found = read_run(self.db, self.dag_id, self.after_id)
            if found is not None:
                self.run_id, self.run_state, tasks = found
                self._tasks(tasks)
        if self.run_id is not None:
            try:
                self._training()
            except Exception:  # not there yet, or being written: the next poll reads again
                return

    def _tasks(self, rows: list[quiet.TaskRow]) -> None:
        for row in rows:
            key = (row["task_id"], row["try_number"])
            state = (row["state"] or "").lower()
            self.task_states[row["task_id"]] = state
            ended = state in quiet.FINAL_TASK_STATES or state == "up_for_retry"
            if ended and key not in self._printed_tasks:
                if row["task_id"] == "train":
                    self._training()  # its attempts' lines come before its own
                self._printed_tasks.add(key)
                self.console.line(quiet.task_line(row))

    def _training(self) -> None:
        assert self.run_id is not None
        run_uri = run_prefix(self.root, self.dag_id, self.run_id, "train")
        layout = RunLayout(run_uri)
        if self._store is None:
            self._store = open_storage(run_uri)
        if self._total is None:
            try:
                self._total = _max_steps(self._store.get(layout.config))
            except NotFound:
                return
        if self._metrics is None:
            self._metrics = MetricsReader(self._store, run_uri)
        latest = self._metrics.latest()
        if latest:
            self._progress(max(latest), latest[max(latest)])
        try:
            job = load(self._store.get(layout.job), layout.job, check_job)
        except NotFound:
            return
        except ShapeError as exc:  # writes are atomic: a damaged record stays so; say it once
            if str(exc) != self._damaged:
                self._damaged = str(exc)
                self.console.line(f"training record unreadable: {exc}")
            return
        for entry in job.get("attempts", []):
            if entry["attempt"] in self._printed_attempts:
                continue
            line = quiet.attempt_line(entry, self._total)
            if line is None:
                continue
            self._printed_attempts.add(entry["attempt"])
            self.console.line(line)
            if entry.get("classification") not in ("succeeded", "preempted"):
                for text in quiet.error_lines(entry):
                    self.console.line(text)

    def _progress(self, attempt: int, record: dict) -> None:
        step, at = int(record["step"]), float(record.get("time") or time.time())
        first = self._first.setdefault(attempt, (step, at))
        rate = (step - first[0]) / (at - first[1]) if at > first[1] and step > first[0] else None
        text = quiet.progress_text(attempt, record, self._total, rate)
        if self.console.tty:
            self.console.progress(quiet.bar(step, self._total) + text)
        elif quiet.progress_due(step, self._last_line_step, self._total):
            self._last_line_step = step
            self.console.line(text)


def _max_steps(config_yaml: bytes) -> int | None:
    config = yaml.safe_load(config_yaml) or {}
    steps = (config.get("train") or {}).get("max_steps")
    return int(steps) if steps else None


def log_path(airflow_home: str) -> Path:
    """Where this demo's full log goes: ``$AIRFLOW_HOME/logs/trainops-demo/<time>.log``."""
    folder = Path(airflow_home) / "logs" / "trainops-demo"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / time.strftime("%Y%m%d-%H%M%S.log")


def run_quiet_demo(
    project_dir: str,
    *,
    corrupt_data: bool = False,
    seed: int | None = None,
    out: IO[str] | None = None,
    task: str = "causal_lm",
) -> int:
    """Run the demo in a child (``demo --verbose``) logging to a file, print its course and
    its summary; 130 after a Ctrl-C, else the child's exit status."""
    console = Console(out or sys.stdout)
    root, source = storage_root_choice(None, checkout=project_dir)
    env = apply_dev_env(project_dir)
    log = log_path(env["AIRFLOW_HOME"])
    result = log.with_suffix(".result.json")
    console.line(f"full log: {log} (python -m trainops demo -v shows it here)")
    console.line(f"storage root: {root} ({source})")
    db = sqlite_path(env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"))
    if db is None:
        console.line("(Airflow's DB is not SQLite: no task or training lines here; -v shows the log)")
    watch = DemoWatch(console, db, newest_run_id(db) if db else 0, root, DEMOS[task][0])
    argv = [
        sys.executable,
        "-m",
        "trainops",
        "demo",
        "--verbose",
        "--project-dir",
        project_dir,
        *(["--best-checkpoint"] if task == BEST_CHECKPOINT else ["--task", task]),
    ]
    argv += ["--result-file", str(result)] + (["--corrupt-data"] if corrupt_data else [])
    argv += ["--seed", str(seed)] if seed is not None else []
    with open(log, "ab") as sink:
        # Its own session: the terminal's Ctrl-C reaches this process only, which stops it.
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    # Ctrl-C sets a flag rather than raising: a second one (``make`` passes its own on) must
    # not cut the cleanup short, wherever it lands.
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        while child.poll() is None and not interrupted:
            watch.poll()
            time.sleep(POLL_S)
        if interrupted:
            return _interrupted(console, child, watch, result)
    finally:
        signal.signal(signal.SIGINT, previous)
    watch.poll()
    console.clear()
    try:
        outcome = json.loads(result.read_text())
    except (FileNotFoundError, ValueError):
        console.line(f"the demo ended with status {child.returncode} before its summary: see {log}")
        return child.returncode or 1
    finally:
        result.unlink(missing_ok=True)
    console.out.write(summary_text(outcome["summary"], watch, root, DEMOS[task][1]))
    console.line(
        f"DAG run {outcome['run_id']}: {outcome['state']} in {outcome['elapsed']:.0f}s; full log: {log}"
    )
    return int(child.returncode)


def summary_text(text: str, watch: DemoWatch, root: str, model_name: str) -> str:
    """The child's summary; when staging rejected the data, the summary that names the failed
    expectations, from the report the stage task pushed (when it can be read)."""
    if watch.db is None or watch.run_id is None or watch.task_states.get("stage") != "failed":
        return text
    uri = read_xcom(watch.db, watch.dag_id, watch.run_id, "stage", VALIDATION_REPORT_KEY)
    if not isinstance(uri, str):
        return text
    try:
        return staging_summary(root, model_name, uri)
    except Exception:  # storage gone: the child's summary still says staging rejected the data
        return text


def _interrupted(console: Console, child: subprocess.Popen[bytes], watch: DemoWatch, result: Path) -> int:
    """Ctrl-C: stop the child (it marks the run failed and deletes its jobs, writing what it
    did to ``result``), then make sure no job of the run is left, and say what was done."""
    console.clear()
    console.out.write("\n")
    with contextlib.suppress(ProcessLookupError):  # it may be gone already
        child.send_signal(signal.SIGINT)
    try:
        child.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    watch.poll()
    try:
        done = json.loads(result.read_text())
        result.unlink()
    except (FileNotFoundError, ValueError):  # killed before it could say
        done = {}
    deleted, left = stop_jobs(watch.dag_id, watch.run_id)  # what the child did not delete
    jobs = [*done.get("deleted", []), *deleted]
    run = watch.run_id or "(none started yet)"
    what = f"deleted its job(s) {', '.join(jobs)}" if jobs else "it had no job running"
    if left:
        console.line(
            f"interrupted: stopped DAG run {run} and {what}, but {', '.join(left)} still "
            f"have processes: see {Path(os.environ.get('TRAINOPS_LOCAL_STATE', '.')) / 'jobs'}"
        )
    else:
        console.line(
            f"interrupted: stopped DAG run {run} (marked failed) and {what}; no trainer process is left"
        )
    return 130
