"""``python -m trainops``: the operator-side command line.

- ``demo``: run the ``trainops_demo`` DAG with ``dag.test()`` on the embedded default and print
  a summary (``make demo`` calls this): one line per task and training attempt, the training
  progress, the summary; the full log goes to the file named first (``-v`` prints it instead).
  Ctrl-C stops the run and deletes its jobs (exit status 130). ``--corrupt-data`` delivers bad
  data instead, to watch staging reject it before anything is trained; ``--seed N`` trains with
  another seed (2 trains a model that passes the gate and is promoted as the next version).
- ``airflow``: ``airflow standalone`` on the same embedded default, with this checkout's DAGs,
  on http://localhost:8080 (``make airflow`` calls this); docs/dags.md walks through a run.
- ``render-job SPEC.json``: print the Kubernetes manifests a JobSpec (JSON form) would submit,
  as multi-document YAML. A dry run: nothing is sent to a cluster.
- ``rollback MODEL VERSION --reason TEXT``: point MODEL's production back at VERSION (one that
  was production before), recording who (``--by``, default the OS user) and why in the
  pointer's history. ``--storage-root`` defaults to ``$TRAINOPS_STORAGE_ROOT``, else the
  checkout's embedded default (where ``make demo`` writes); the first line names the root.
  ``s3://`` roots use boto3's default credentials and ``AWS_ENDPOINT_URL_S3``.
- ``doctor``: check a cluster (an Airflow Kubernetes connection, or a kubeconfig) and a storage
  root before the first run: API, namespace, RBAC, CRDs, spot and GPU nodes, the notice window,
  storage with conditional writes, the Airflow API connection; one line each, pass or fail with
  the fix (docs/deploying.md, "Check the cluster").
- ``runs``, ``status RUN``, ``logs RUN [-f]``, ``models [NAME]``, ``report RUN|MODEL [--open]``:
  runs and their outcomes, where one stands, its attempts' logs, production models and their
  history, a report's URL; from storage alone, each with ``--json`` (:mod:`trainops.cli.runs`).
- ``cost RUN [--prices FILE]``: what one training run cost, estimated: its attempts'
  phases (queued, startup, productive, replayed, checkpoint stall, shutdown) in seconds and
  GPU-hours, goodput, recovery time, cost, the on-demand equivalent and the spot savings
  (docs/cost.md). ``--prices`` prices it with a JSON price table laid over the shipped one.
"""

from __future__ import annotations

import argparse
import getpass
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer.config import MAX_SEED
from trainer.contract import check_name
from trainer.storage import StorageError
from trainops.cli import doctor, runs, summary
from trainops.cli.cost import run_cost
from trainops.cli.devenv import PASSWORDS_FILE, airflow_api_env, apply_dev_env, storage_root_choice
from trainops.cli.render_job import NEWEST_RELEASE, TRAINER_RELEASES
from trainops.cli.render_job import main as render_job
from trainops.cli.watch import (
    BEST_CHECKPOINT,
    DEMO_DAG,
    DEMOS,
    TASK_DEMOS,
    VALIDATION_REPORT_KEY,
    run_quiet_demo,
    stop_jobs,
)
from trainops.hooks.storage import storage_for
from trainops.registry.promotion import PromotionError
from trainops.registry.rollback import rollback

DEMO_TASKS = ("stage", "train", "evaluate", "gate", "promote")


def _ensure_airflow_db(env: dict) -> None:
    """Create or upgrade the SQLite metadata DB (idempotent, a few seconds)."""
    stamp = Path(env["AIRFLOW_HOME"]) / ".trainops-db-migrated"
    if stamp.exists():
        return
    print("preparing the Airflow database (SQLite) ...", flush=True)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    stamp.touch()


def load_dag(dags_folder: str, dag_id: str):
    """Import one DAG file from the dags folder the way the DAG processor would."""
    path = Path(dags_folder) / f"{dag_id}.py"
    spec = importlib.util.spec_from_file_location(f"trainops_dags_{dag_id}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path} as a DAG file; pass the folder that holds {dag_id}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def xcom_results(dag_id: str, run_id: str, task_ids, key: str = "return_value") -> dict:
    """The return values (or the XComs ``key``) of a finished run's tasks, read from Airflow's
    metadata DB."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    out = {}
    with create_session() as session:
        for task_id in task_ids:
            row = (
                session.query(XComModel)
                .filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key)
                .first()
            )
            out[task_id] = XComModel.deserialize_value(row) if row is not None else None
    return out


def run_note(dag_id: str, run_id: str) -> str | None:
    """The DAG run's note (the gate writes why it rejected a candidate there)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).first()
        return run.note if run is not None else None


DEMO_TASK_DEFAULT = "causal_lm"


def demo_conf(corrupt_data: bool, seed: int | None, task: str = "causal_lm") -> dict[str, object]:
    """The demo DAG run's conf: only what the command line set (the DAG's params hold the rest;
    the ``sft`` demo has no bad-data switch)."""
    bad = {"corrupt_data": corrupt_data} if task == DEMO_TASK_DEFAULT else {}
    return {**bad, **({"seed": seed} if seed is not None else {})}


def run_demo(
    project_dir: str,
    corrupt_data: bool = False,
    result_file: str | None = None,
    seed: int | None = None,
    task: str = "causal_lm",
) -> int:
    """The demo with everything printed (``demo -v``; the quiet ``demo`` runs this in a child,
    :mod:`trainops.cli.watch`). Ctrl-C (SIGINT) stops the run: it is marked failed and its
    jobs are deleted (exit status 130).

    :param result_file: also write the summary, run id, state and duration there (JSON).
    :param seed: the DAG's ``seed`` param (None: the DAG's default, what ``make demo`` trains with).
    :param task: which demo (``DEMOS``): ``causal_lm`` (the default, ``trainops_demo``), ``sft``
        (``trainops_demo_sft``: instruction tuning of a small Hugging Face Qwen2) or
        ``classification`` (``trainops_demo_classification``: a small Hugging Face BERT classifier).
    """
    dag_id, model = DEMOS[task]
    # A parent that ignored SIGINT (a shell's background job) passes the ignoring on: the
    # quiet demo stops this process with SIGINT, so it must raise KeyboardInterrupt here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    root, source = storage_root_choice(None, checkout=project_dir)
    print(f"storage root: {root} ({source})", flush=True)
    env = apply_dev_env(project_dir)
    # dag.test() runs each trigger in this process: no scheduler to race (trainops.triggers.job)
    os.environ.setdefault("AIRFLOW__TRAINOPS__TRIGGER_SETTLE_SECONDS", "0")
    _ensure_airflow_db(env)

    started = time.monotonic()
    dag = load_dag(env["AIRFLOW__CORE__DAGS_FOLDER"], dag_id)
    try:
        dagrun = dag.test(run_conf=demo_conf(corrupt_data, seed, task))
    except KeyboardInterrupt:
        return _stop_demo_run(result_file, dag_id)
    elapsed = time.monotonic() - started
    results = xcom_results(dag_id, dagrun.run_id, (*DEMO_TASKS, "evaluate_checkpoints"))
    # a stage task that rejected the data returns nothing, but pushed its report's URI
    validation_uri = xcom_results(dag_id, dagrun.run_id, ("stage",), key=VALIDATION_REPORT_KEY)["stage"]
    facts = summary.collect(
        storage_for(root, None),
        root,
        results,
        model,
        run_note(dag_id, dagrun.run_id),
        validation_uri=validation_uri if isinstance(validation_uri, str) else None,
    )
    text = summary.render(facts)
    state = str(dagrun.state).rsplit(".", 1)[-1].lower()
    print(text)
    print(f"DAG run {dagrun.run_id}: {state} in {elapsed:.0f}s")
    if result_file:
        Path(result_file).write_text(
            json.dumps({"summary": text, "run_id": dagrun.run_id, "state": state, "elapsed": elapsed})
        )
    return 0 if state == "success" else 1


def _stop_demo_run(result_file: str | None, dag_id: str = DEMO_DAG) -> int:
    """After a Ctrl-C in ``dag.test()``: mark the demo's running DAG run failed and delete its
    jobs (their process groups), say so (and write it to ``result_file``), return 130."""
    # Deferred: the command line imports Airflow only once apply_dev_env has set its configuration.
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState  # noqa: PLC0415

    run_ids = []
    with create_session() as session:
        for run in session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.state == DagRunState.RUNNING):
            run.set_state(DagRunState.FAILED)
            run_ids.append(run.run_id)
    deleted, left = stop_jobs(dag_id, run_ids[0] if len(run_ids) == 1 else None)
    if result_file:
        Path(result_file).write_text(
            json.dumps({"interrupted": True, "run_ids": run_ids, "deleted": deleted, "left": left})
        )
    print(
        f"interrupted: DAG run {', '.join(run_ids) or '-'} marked failed; deleted job(s) "
        f"{', '.join(deleted) or '-'}" + (f"; still running: {', '.join(left)}" if left else ""),
        flush=True,
    )
    return 130


def run_rollback(model: str, version: int, *, reason: str, by: str | None, storage_root: str | None) -> int:
    """``rollback``: print what changed, or the error on stderr (exit status 1)."""
    try:
        root, source = storage_root_choice(storage_root)
        print(f"storage root: {root} ({source})", flush=True)
        result = rollback(
            storage_for(root, None), root, model, version, reason=reason, by=by or getpass.getuser()
        )
    except (PromotionError, ValueError, StorageError) as exc:  # each names what to do; one line, no traceback
        print(f"rollback failed: {exc}", file=sys.stderr)
        return 1
    if result["changed"]:
        print(
            f"{model}: production is now v{version} (was v{result['previous_version']}); "
            f"recorded in {result['production_uri']} as rollback by {result['by']}: "
            f"{result['reason']}"
        )
        if result["production_version"] != version:
            print(f"{model}: production has since moved on to v{result['production_version']}")
    else:
        since = result.get("since") or {}
        print(
            f"{model}: v{version} already is production (since {since.get('at')}, "
            f"{since.get('action')} by {since.get('by') or '-'}); nothing changed"
        )
    return 0


def run_airflow(project_dir: str) -> int:
    """``airflow standalone`` on the embedded default (scheduler, DAG processor, triggerer and
    API server on http://localhost:8080), with this interpreter's ``bin`` first on PATH."""
    root, source = storage_root_choice(None, checkout=project_dir)
    print(f"storage root: {root} ({source})", flush=True)
    bin_dir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    airflow = os.path.join(bin_dir, "airflow")
    added, password = airflow_api_env(os.environ["AIRFLOW_HOME"])
    os.environ.update(added)  # run notes reach this API server (a rejection's reason, for one)
    print(
        f"airflow standalone with AIRFLOW_HOME={os.environ['AIRFLOW_HOME']}: log in as admin, "
        f"password {password} (kept in $AIRFLOW_HOME/{PASSWORDS_FILE}); the connection "
        "trainops_airflow_api points at it, so runs get their notes",
        flush=True,
    )
    os.execv(airflow, [airflow, "standalone"])
    return 0  # not reached


def _seed(text: str) -> int:
    """``--seed``: a whole number the trainer takes (argparse names the option on error)."""
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_SEED}, got {text!r}")
    return seed


def _model_name(value: str) -> str:
    """The rollback's MODEL, checked when the command line is parsed (argparse names it)."""
    try:
        return check_name(value, "model name")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _default_root_text(checkout: str | None = None) -> str:
    """The storage root a command would use now, for ``--help`` (nothing is applied)."""
    try:
        root, source = storage_root_choice(None, checkout=checkout, apply=False)
    except ValueError as exc:
        return str(exc)
    return f"{root}, {source}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainops", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="run the demo DAG on the embedded default and print a summary",
        description="Run the trainops_demo DAG with dag.test() and print one line per task and "
        "training attempt, the progress and a summary; the full log goes to a file. Storage: "
        "$TRAINOPS_STORAGE_ROOT, else PROJECT_DIR/.trainops/storage (here: "
        f"{_default_root_text(os.getcwd())}). Ctrl-C stops the run and deletes its jobs (exit status 130).",
    )
    demo.add_argument(
        "--project-dir",
        default=os.getcwd(),
        help="the checkout (holds dags/, plugins/; .airflow and .trainops go here)",
    )
    demo.add_argument(
        "--corrupt-data",
        action="store_true",
        help="deliver data that fails its expectations (staging rejects it)",
    )
    demo.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="train with this seed instead of the default 1234: the same data then trains another "
        "model (2 passes the gate and becomes the next version)",
    )
    demo.add_argument(
        "--task",
        choices=TASK_DEMOS,
        default="causal_lm",
        help="causal_lm (the default: our tiny Llama on the demo text), sft (a small Hugging Face "
        "Qwen2 instruction-tuned on prompt/response pairs, its own tokenizer, the loss on the responses) "
        "or classification (a small Hugging Face BERT that labels each post with its source, accuracy "
        "and F1 in its evaluation)",
    )
    demo.add_argument(
        "--best-checkpoint",
        action="store_true",
        help="the causal_lm demo with mid-run evaluation (trainops_demo_best_checkpoint): every "
        "checkpoint is scored while the model trains, and the best one by eval loss is promoted",
    )
    demo.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print everything (Airflow's, great-expectations' and the trainer's logs) here "
        "instead of to the log file",
    )
    demo.add_argument("--result-file", default=None, help=argparse.SUPPRESS)  # the quiet parent's
    standalone = sub.add_parser(
        "airflow",
        help="run Airflow (standalone) on the embedded default, "
        "with the DAGs of this checkout, on http://localhost:8080",
    )
    standalone.add_argument(
        "--project-dir",
        default=os.getcwd(),
        help="the checkout (holds dags/, plugins/; .airflow and .trainops go here)",
    )
    doctor.add_parser(sub)
    runs.add_parsers(sub)
    render = sub.add_parser("render-job", help="print the Kubernetes manifests of a JobSpec (dry run)")
    render.add_argument("spec", metavar="SPEC.json", help="a JobSpec in its JSON form")
    render.add_argument(
        "--trainer-release",
        choices=sorted(TRAINER_RELEASES),
        default=NEWEST_RELEASE,
        help=f"the Kubeflow Trainer release a TrainJob is rendered for (default {NEWEST_RELEASE})",
    )
    back = sub.add_parser("rollback", help="point a model's production back at an earlier version")
    back.add_argument("model", metavar="MODEL", type=_model_name, help="the model name, e.g. demo-lm")
    back.add_argument("version", metavar="VERSION", type=int, help="the version to return to")
    back.add_argument("--reason", required=True, help="why; kept in the pointer's history")
    back.add_argument("--by", default=None, help="who asks for it (default: the OS user)")
    back.add_argument(
        "--storage-root",
        default=None,
        help="file:///abs/path or s3://bucket/prefix (default: $TRAINOPS_STORAGE_ROOT, else "
        f"the checkout's embedded default; here: {_default_root_text()})",
    )
    cost = sub.add_parser("cost", help="print the estimated cost, goodput and phases of one training run")
    cost.add_argument(
        "run_uri",
        metavar="RUN",
        help="the run: its URI (the train task's run_uri), its folder, <dag_id>/<run_id>, or latest",
    )
    cost.add_argument(
        "--storage-root", default=None, help="default: $TRAINOPS_STORAGE_ROOT, else the checkout's"
    )
    cost.add_argument(
        "--prices", default=None, metavar="FILE", help="a JSON price table laid over the shipped one"
    )
    cost.add_argument("--json", action="store_true", help="print the bill and its lost time by cause as JSON")
    args = parser.parse_args(argv)
    if args.command == "cost":
        return run_cost(args.run_uri, args.prices, storage_root=args.storage_root, as_json=args.json)
    if args.command == "rollback":
        return run_rollback(
            args.model, args.version, reason=args.reason, by=args.by, storage_root=args.storage_root
        )
    if args.command == "demo":
        if args.best_checkpoint and args.task != DEMO_TASK_DEFAULT:
            parser.error(f"--best-checkpoint is the causal_lm demo's; drop --task {args.task} or it")
        if args.best_checkpoint:
            args.task = BEST_CHECKPOINT
        if args.corrupt_data and args.task != DEMO_TASK_DEFAULT:
            parser.error(
                f"--corrupt-data is the causal_lm demo's; the {args.task} demo has no bad-data switch"
            )
        if args.verbose:
            return run_demo(
                args.project_dir,
                corrupt_data=args.corrupt_data,
                result_file=args.result_file,
                seed=args.seed,
                task=args.task,
            )

        return run_quiet_demo(
            args.project_dir, corrupt_data=args.corrupt_data, seed=args.seed, task=args.task
        )
    if args.command == "airflow":
        return run_airflow(args.project_dir)
    if args.command == "render-job":
        return render_job(args.spec, args.trainer_release)
    if args.command == "doctor":
        return doctor.main(args)
    if args.command in runs.COMMANDS:
        return runs.main(args)
    return 2
