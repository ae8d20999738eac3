"""The terminal's verbs, from storage alone (no Airflow import, so each answers in well under a
second): ``runs``, ``status RUN``, ``logs RUN [-f]``, ``models [NAME]``, ``report RUN|MODEL``.

Each takes ``--storage-root`` (default ``$TRAINOPS_STORAGE_ROOT``, else the checkout's
embedded default, where ``make demo`` writes) and ``--json``. A run is a run URI, a run folder,
``<dag_id>/<run_id>`` or ``latest`` (:mod:`trainops.runs.refs`). Bad input gets one line saying
what was expected and what was found, exit status 2; a missing credential names what to set.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import webbrowser
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any

from trainer.contract import MetricsReader, RunLayout, join, safe_segment
from trainer.storage import NotFound, Storage, StorageError, open_storage
from trainops.cli.devenv import storage_root_choice
from trainops.recovery.classify import restart_note
from trainops.reports.urls import report_url
from trainops.runs import facts as run_facts
from trainops.runs.outcome import RunFacts, about, outcome
from trainops.runs.refs import RunRef, RunRefError, newest, resolve

DEFAULT_AIRFLOW_URL = "http://localhost:8080"  # what `make airflow` serves
FOLLOW_EVERY_S = 2.0


class CliError(Exception):
    """One line for stderr, and the exit status."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def storage_hint(exc: StorageError, root: str) -> str:
    """One line for a storage error, naming what to set when it is a missing credential."""
    text = str(exc)
    if "credential" in text.lower():
        return (
            f"no credentials to read {root}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE), or, where Airflow runs, the connection aws_default; then try again"
        )
    return f"cannot read {root}: {text.splitlines()[0] if text else type(exc).__name__}"


def _root(args: argparse.Namespace) -> tuple[str, str, Storage]:
    try:
        root, source = storage_root_choice(args.storage_root)
        return root, source, open_storage(root, outage_tolerance_s=10)
    except (ValueError, StorageError) as exc:
        raise CliError(str(exc)) from None


def _ref(text: str, root: str, store: Storage) -> RunRef:
    try:
        return resolve(text, root, store)
    except RunRefError as exc:
        raise CliError(str(exc)) from None


def _storage_for(ref: RunRef, root: str, store: Storage) -> Storage:
    if ref.run_uri.startswith(root.rstrip("/") + "/"):
        return store
    return open_storage(ref.run_uri, outage_tolerance_s=10)


def _when(text: object) -> str:
    return str(text or "-").replace("T", " ").replace("+00:00", "")[:19] or "-"


def _duration(f: RunFacts) -> str:
    try:
        start = datetime.fromisoformat(str(f.started_at))
        end = datetime.fromisoformat(str(f.ended_at)) if f.ended_at else None
    except ValueError:
        return "-"
    return about((end.timestamp() if end else time.time()) - start.timestamp())


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _record(f: RunFacts) -> dict[str, Any]:
    found = outcome(f)
    return {**asdict(f), "outcome": {"kind": found.kind, "text": found.text}}


# -- runs ------------------------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    root, source, store = _root(args)
    found = [
        run_facts.read_facts(store, ref) for ref in newest(store, root, dag_id=args.dag, limit=args.limit)
    ]
    if args.json:
        print(json.dumps([_record(f) for f in found], indent=2, default=str))
        return 0
    print(f"storage root: {root} ({source})")
    if not found:
        print("no runs yet: `make demo` makes one")
        return 0
    rows = [["DAG", "RUN", "STARTED", "TOOK", "COST", "OUTCOME"]]
    for f in found:
        cost = "-" if f.cost is None else f"${f.cost:.2f}"
        rows.append([f.dag_id, f.run_id, _when(f.started_at), _duration(f), cost, outcome(f).text])
    print(_table(rows))
    print("\nmore: python -m trainops status <dag>/<run> (or latest), logs, report")
    return 0


# -- status ----------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    root, _, store = _root(args)
    ref = _ref(args.run, root, store)
    f = run_facts.read_facts(_storage_for(ref, root, store), ref)
    if f.problem and args.run != "latest" and "no readable job.json" in f.problem:
        raise CliError(f"{args.run!r}: no run there ({f.problem}); `python -m trainops runs` lists them")
    if args.json:
        print(json.dumps(_record(f), indent=2, default=str))
        return 0
    lines = [
        f"run       {f.dag_id} / {f.run_id} ({f.task})",
        f"outcome   {outcome(f).text}",
        f"status    {f.status or '-'}, {f.attempts} attempt(s); started {_when(f.started_at)}, took {_duration(f)}",
    ]
    if f.step is not None:
        lines.append(f"progress  step {f.step}" + (f" of {f.max_steps}" if f.max_steps else ""))
    if f.cost is not None:
        lines.append(f"cost      ${f.cost:.2f} (estimated)")
    for check in (f.gate or {}).get("checks") or []:
        mark = "pass" if check.get("passed") else "FAIL"
        lines.append(
            f"gate      {mark} {check.get('name')}: observed {check.get('observed')}, expected {check.get('expected')}"
        )
    lines += [f"where     {f.run_uri}", f"report    {report_url(RunLayout(f.run_uri).job, args.airflow_url)}"]
    print("\n".join(lines))
    return 0


# -- logs ------------------------------------------------------------------------------------


def _attempt_lines(attempt: dict[str, Any], lines: int) -> list[str]:
    head = (
        f"== attempt {attempt.get('attempt')}: {attempt.get('classification') or 'running'}"
        f" ({attempt.get('job_name') or '-'}, {_when(attempt.get('launched_at'))} to {_when(attempt.get('ended_at'))})"
    )
    restarted = restart_note(attempt.get("record") if isinstance(attempt.get("record"), dict) else None)
    if restarted:  # the log tail is the newest incarnation's
        head += f"; {restarted}"
    tail = str(attempt.get("logs_tail") or "").splitlines()
    if not tail:
        return [head, "   (no log kept yet: it is saved when the attempt ends)"]
    return [head, *tail[-lines:]]


def cmd_logs(args: argparse.Namespace, *, sleep: Callable[[float], None] = time.sleep) -> int:
    root, _, store = _root(args)
    ref = _ref(args.run, root, store)
    store = _storage_for(ref, root, store)
    try:
        job = run_facts.read_job(store, ref)
    except NotFound as exc:
        raise CliError(f"{args.run!r}: {exc}; `python -m trainops runs` lists the runs") from None
    attempts = [a for a in job.get("attempts") or [] if isinstance(a, dict)]
    if args.json:
        print(
            json.dumps(
                [
                    {k: a.get(k) for k in ("attempt", "classification", "job_name", "logs_tail")}
                    for a in attempts
                ],
                indent=2,
            )
        )
        return 0
    print(f"{ref.dag_id} / {ref.run_id}: {len(attempts)} attempt(s), status {job.get('status')}")
    for attempt in attempts:
        print("\n".join(_attempt_lines(attempt, args.lines)))
    if not args.follow:
        return 0
    return _follow(store, ref, {a.get("attempt") for a in attempts if a.get("ended_at")}, sleep)


def _follow(store: Storage, ref: RunRef, shown: set[Any], sleep: Callable[[float], None]) -> int:
    """Print each new step's metrics and each attempt's log as it ends, until the run ends.
    ``shown``: the attempts whose final log was printed already."""
    reader, last_step = MetricsReader(store, ref.run_uri), -1
    try:
        while True:
            for record in reader.records():
                step = record.get("step")
                if isinstance(step, int) and step > last_step:
                    last_step = step
                    figures = ", ".join(
                        f"{k} {v:.4g}"
                        for k, v in record.items()
                        if k in ("loss", "lr", "eval_loss") and isinstance(v, int | float)
                    )
                    print(f"step {step}: {figures}", flush=True)
            job = run_facts.read_job(store, ref)
            attempts = [a for a in job.get("attempts") or [] if isinstance(a, dict)]
            for attempt in attempts:
                if attempt.get("ended_at") and attempt.get("attempt") not in shown:
                    print("\n".join(_attempt_lines(attempt, 60)), flush=True)
                    shown.add(attempt.get("attempt"))
            if job.get("status") != "running":
                print(f"the run ended: {job.get('status')}")
                return 0
            sleep(FOLLOW_EVERY_S)
    except KeyboardInterrupt:
        return 130


# -- models ----------------------------------------------------------------------------------


def cmd_models(args: argparse.Namespace) -> int:
    root, source, store = _root(args)
    if args.name:
        pointer = run_facts.pointer(store, root, args.name)
        if pointer is None:
            raise CliError(
                f"no model {args.name!r} under {root} (no models/{safe_segment(args.name)}/production.json); `python -m trainops models` lists them"
            )
        if args.json:
            print(json.dumps(pointer, indent=2))
            return 0
        print(f"{args.name}: production v{pointer.get('version')} since {_when(pointer.get('promoted_at'))}")
        for entry in reversed(pointer.get("history") or []):
            why = f": {entry['reason']}" if entry.get("reason") else ""
            run = f" (run {entry['run_uri']})" if entry.get("run_uri") else ""
            print(
                f"  v{entry.get('version')}  {entry.get('action'):<8} {_when(entry.get('at'))}  by {entry.get('by') or '-'}{why}{run}"
            )
        print(f"model card: {report_url(join(str(pointer.get('uri')), 'card.json'), args.airflow_url)}")
        return 0
    found: dict[str, dict[str, Any] | None] = {}
    depth = join(root, "models").count("/") + 2  # models/<folder>/production.json
    for uri in sorted(store.list(join(root, "models") + "/")):
        if uri.endswith("/production.json") and uri.count("/") == depth:
            pointer = run_facts.json_at(store, uri)
            found[str((pointer or {}).get("model") or uri.rsplit("/", 2)[-2])] = pointer
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    print(f"storage root: {root} ({source})")
    if not found:
        print("no model promoted yet")
        return 0
    rows = [["MODEL", "PRODUCTION", "SINCE", "LAST CHANGE"]]
    for name, p in found.items():
        last = ((p or {}).get("history") or [{}])[-1]
        rows.append(
            [
                name,
                f"v{(p or {}).get('version')}",
                _when((p or {}).get("promoted_at")),
                f"{last.get('action')} by {last.get('by') or '-'}",
            ]
        )
    print(_table(rows))
    return 0


# -- report ----------------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    root, _, store = _root(args)
    pointer = None
    if "/" not in args.target and "://" not in args.target and args.target != "latest":
        pointer = run_facts.pointer(store, root, args.target)
    if pointer is not None:
        url = report_url(join(str(pointer.get("uri")), "card.json"), args.airflow_url)
    else:
        ref = _ref(args.target, root, store)
        url = report_url(RunLayout(ref.run_uri).job, args.airflow_url)
    if args.json:
        print(json.dumps({"url": url}))
    else:
        print(url)
    if args.open:
        webbrowser.open(url)
    return 0


COMMANDS = {
    "runs": cmd_runs,
    "status": cmd_status,
    "logs": cmd_logs,
    "models": cmd_models,
    "report": cmd_report,
}


def add_parsers(sub: Any) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--storage-root", default=None, help="default: $TRAINOPS_STORAGE_ROOT, else the checkout's"
        )
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.add_argument(
            "--airflow-url",
            default=DEFAULT_AIRFLOW_URL,
            help=f"where Airflow serves (default {DEFAULT_AIRFLOW_URL})",
        )

    run_help = "a run URI, a run folder, <dag_id>/<run_id>, or latest"
    p = sub.add_parser("runs", help="recent runs and their outcomes")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--dag", default=None, help="only this DAG's runs")
    common(p)
    p = sub.add_parser("status", help="where a run stands, and its outcome")
    p.add_argument("run", metavar="RUN", help=run_help)
    common(p)
    p = sub.add_parser("logs", help="a run's attempts' log tails (-f follows a live run)")
    p.add_argument("run", metavar="RUN", help=run_help)
    p.add_argument(
        "-f", "--follow", action="store_true", help="print new steps and attempts until the run ends"
    )
    p.add_argument("--lines", type=int, default=40, help="lines of each attempt's tail")
    common(p)
    p = sub.add_parser("models", help="production models; with NAME, its history: who and why")
    p.add_argument("name", metavar="NAME", nargs="?", default=None)
    common(p)
    p = sub.add_parser("report", help="the URL of a run's report or a model's card (--open opens it)")
    p.add_argument("target", metavar="RUN|MODEL", help=f"{run_help}, or a model name")
    p.add_argument("--open", action="store_true", help="open it in the browser")
    common(p)


def run_verb(argv: list[str]) -> int:
    """``python -m trainops <verb> ...`` without the rest of the command line's imports (the
    ``__main__`` fast path: no Airflow, well under a second)."""
    parser = argparse.ArgumentParser(prog="python -m trainops")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    return main(parser.parse_args(argv))


def main(args: argparse.Namespace) -> int:
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"{args.command}: {exc}", file=sys.stderr)
        return exc.status
    except ValueError as exc:  # a name that cannot be a folder (".", ".."): what was given, and why
        print(f"{args.command}: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:
        print(
            f"{args.command}: {storage_hint(exc, getattr(args, 'storage_root', None) or 'the storage root')}",
            file=sys.stderr,
        )
        return 2
