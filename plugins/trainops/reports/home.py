"""The trainops home page (``/trainops/``): recent training runs, models and datasets, each
linking to its report pages and to its Airflow run.

- **Training runs**, newest first: status, attempts, preemptions, goodput and cost (the
  ``cost`` record of ``job.json``, :mod:`trainops.cost`), and for a running run its live step
  and an ETA (:func:`progress`, from its metrics and ``train.max_steps``).
- **Models**: the production version and its card, since when, and the pointer's history: who
  moved it and why (a promotion: the DAG run whose gate approved it; a rollback: its ``by``
  and ``reason``).
- **Datasets**: the newest versions of each, rows, quarantined rows, tokens and the
  validation verdict.

Pure: the app reads (:mod:`trainops.reports.home_reader`) and hands the records here.
"""

# No ``from __future__ import annotations``: the records are TypedDicts read at run time.
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from trainer.contract import join
from trainops.cost.money import money
from trainops.gate.metrics import shown_metrics
from trainops.registry.promotion import card_uri
from trainops.reports.cost_page import COST_FORMAT, percent
from trainops.reports.dag_runs_page import dag_runs_section
from trainops.reports.fleet import FleetRun
from trainops.reports.frame import AirflowRef, airflow_link, airflow_ref
from trainops.reports.html import dicts, escape, page, report_link, scalar, table
from trainops.runs.dag_runs import DagRunRow
from trainops.runs.outcome import about
from trainops.runs.progress import Progress, progress

__all__ = ["DatasetVersion", "HomeRun", "ModelEntry", "Progress", "home_page", "progress"]

HISTORY_SHOWN = 10  # pointer moves per model, newest first


class HomeRun(TypedDict):
    """A run as the fleet page reads it, with its :class:`Progress` when it is running (or why
    there is none)."""

    run: FleetRun
    progress: Progress | None
    progress_problem: str | None


class ModelEntry(TypedDict):
    """A model's production pointer as read (or why it could not be), under storage ``root``."""

    name: str
    root: str
    pointer: dict[str, Any] | None
    problem: str | None
    # the production version's card ``metrics`` (its evaluation against the production before
    # it); None or absent: no readable card
    metrics: NotRequired[dict[str, Any] | None]


class DatasetVersion(TypedDict):
    """One staged version: its ``validation.json`` and ``manifest.json`` (None: missing or
    unreadable; a version that failed validation has no manifest) and when it was written;
    ``manifest_problem`` says why a manifest that is there was not read (damaged)."""

    name: str
    root: str
    version: str
    validation_uri: str
    validation: dict[str, Any] | None
    manifest_uri: str | None
    manifest: dict[str, Any] | None
    mtime: float | None
    problem: str | None
    manifest_problem: NotRequired[str | None]


def _progress_cell(entry: HomeRun) -> str:
    p = entry["progress"]
    if p is None:
        why = entry["progress_problem"]
        return f'<span class="muted">{escape(why)}</span>' if why else '<span class="muted">-</span>'
    text = f"step {p['step']}" + (f" of {p['max_steps']}" if p["max_steps"] is not None else "")
    if p["steps_per_s"] is not None:
        text += f", {p['steps_per_s']:.3g} steps/s"
    if p["eta_s"] is not None:
        text += f", about {about(p['eta_s'])} left"
    if p["age_s"] is not None:
        text += f" (last step {about(p['age_s'])} ago)"
    return escape(text)


def _airflow_cell(ref: AirflowRef | None, base_url: str) -> str:
    if ref is None:
        return '<span class="muted">-</span>'
    link = airflow_link(ref, base_url)
    label = "Airflow run" if ref.run_id is not None else "Airflow: the DAG's runs"
    return f'<a class="airflow" href="{escape(link.href)}">{escape(label)}</a>'


def _run_row(entry: HomeRun, base_url: str) -> list[str]:
    run = entry["run"]
    job = run["job"] or {}
    name = report_link(run["uri"], label=f"{run['dag_id']} / {run['run_id']} / {run['task_id']}")
    if run["problem"] is not None:
        return [
            name,
            "",
            '<span class="fail">unreadable</span>',
            f'<span class="muted">{escape(run["problem"])}</span>',
        ]
    cost = job.get("cost") if isinstance(job.get("cost"), dict) else None
    if cost is not None and cost.get("format") != COST_FORMAT:
        cost = None
    running = job.get("status") == "running"
    figures = (
        [escape(percent(cost.get("goodput"))), escape(money(cost.get("cost")))]
        if cost is not None
        else ['<span class="muted">when it ends</span>' if running else '<span class="muted">-</span>', ""]
    )
    return [
        name,
        _airflow_cell(airflow_ref(job, run["dag_id"]), base_url),
        escape(job.get("status", "unknown")),
        scalar(len(dicts(job.get("attempts")))),
        scalar(job.get("preemptions")),
        *figures,
        _progress_cell(entry) if running else '<span class="muted">-</span>',
    ]


_RUN_HEADER = [
    "Run",
    "In Airflow",
    "Status",
    "Attempts",
    "Preemptions",
    "Goodput",
    "Cost (estimate)",
    "Progress",
]


def _runs_section(runs: Sequence[HomeRun], base_url: str) -> str:
    head = "<h2>Training runs</h2>"
    if not runs:
        return head + '<p class="muted">No training runs were found under the storage roots.</p>'
    rows = []
    for entry in runs:
        row = _run_row(entry, base_url)
        rows.append(row + [""] * (len(_RUN_HEADER) - len(row)))
    return head + table(_RUN_HEADER, rows)


def _who_and_why(entry: Mapping[str, Any], refs: Mapping[str, AirflowRef], base_url: str) -> tuple[str, str]:
    run_uri = entry.get("run_uri") if isinstance(entry.get("run_uri"), str) else None
    if entry.get("action") == "rollback":
        by = escape(entry.get("by") or "unknown") + (
            f" via {escape(entry['via'])}" if entry.get("via") else ""
        )
        why = escape(entry.get("reason") or "no reason recorded")
        if isinstance(entry.get("from_version"), int):
            why += escape(f" (replaced v{entry['from_version']})")
        return by, why
    ref = refs.get(run_uri) if run_uri else None
    by = "the training DAG run" + (f": {_airflow_cell(ref, base_url)}" if ref is not None else "")
    why = (
        "its evaluation gate approved it: " + report_link(join(run_uri, "eval", "gate.json"), "gate decision")
        if run_uri
        else "its evaluation gate approved it"
    )
    return by, why


def _promoted_on(metrics: Mapping[str, Any] | None) -> str:
    """The production version's own metrics (the task's first two, a team's after them) against
    the production before it, as its card recorded them; "" without a card."""
    if not isinstance(metrics, Mapping) or not isinstance(metrics.get("candidate"), Mapping):
        return ""
    candidate, before = metrics["candidate"], metrics.get("production")
    before = before if isinstance(before, Mapping) else {}
    shown = [m for m in shown_metrics(candidate, before) if isinstance(candidate.get(m.name), (int, float))]
    if not shown:
        return ""
    version = metrics.get("production_version")
    parts = []
    for metric in shown[:2] + [m for m in shown[2:] if not m.direction]:
        theirs = before.get(metric.name)
        was = f" (v{escape(version)}: {theirs:.4g})" if isinstance(theirs, (int, float)) else ""
        parts.append(f"{escape(metric.label)} {candidate[metric.name]:.4g}{was}")
    return f"<p>Promoted on {', '.join(parts)}.</p>"


def _model_section(model: ModelEntry, refs: Mapping[str, AirflowRef], base_url: str) -> str:
    where = f' <span class="muted">under {escape(model["root"])}</span>'
    head = f"<h3>{escape(model['name'])}{where}</h3>"
    pointer = model["pointer"]
    if pointer is None:
        return head + f'<p class="fail">{escape(model["problem"] or "no production pointer")}</p>'
    version = int(pointer["version"])  # the reader keeps only pointers with an integer version
    card = report_link(card_uri(model["root"], model["name"], version), f"v{version}")
    summary = f"<p>Production: {card} since {escape(pointer.get('promoted_at', '?'))}"
    run_uri = pointer.get("run_uri")
    if isinstance(run_uri, str) and run_uri:
        summary += ", trained by " + report_link(join(run_uri, "job.json"), "this run")
        if run_uri in refs:
            summary += " (" + _airflow_cell(refs[run_uri], base_url) + ")"
    summary += "</p>" + _promoted_on(model.get("metrics"))
    history = dicts(pointer.get("history"))[-HISTORY_SHOWN:][::-1]
    rows = []
    for entry in history:
        by, why = _who_and_why(entry, refs, base_url)
        v = entry.get("version")
        version_cell = (
            report_link(card_uri(model["root"], model["name"], v), f"v{v}") if isinstance(v, int) else "?"
        )
        run = entry.get("run_uri")
        run_cell = (
            report_link(join(run, "job.json"), "training report") if isinstance(run, str) and run else "-"
        )
        rows.append(
            [version_cell, escape(entry.get("action", "?")), scalar(entry.get("at")), by, why, run_cell]
        )
    header = ["Version", "Action", "When", "By", "Why", "Run"]
    return head + summary + (table(header, rows) if rows else "")


def _dataset_row(d: DatasetVersion) -> list[str]:
    validation, manifest = d["validation"] or {}, d["manifest"] or {}
    quarantine = validation["quarantine"] if isinstance(validation.get("quarantine"), dict) else {}
    splits = manifest["splits"] if isinstance(manifest.get("splits"), dict) else {}

    def tokens(split: str) -> str:
        value = splits[split].get("tokens") if isinstance(splits.get(split), dict) else None
        return scalar(value) if value is not None else '<span class="muted">-</span>'

    if d["validation"] is None:
        verdict = f'<span class="fail">{escape(d["problem"] or "no validation report")}</span>'
    elif validation.get("success"):
        verdict = '<span class="pass">PASSED</span> ' + report_link(d["validation_uri"], "report")
    else:
        verdict = '<span class="fail">FAILED</span> ' + report_link(d["validation_uri"], "report")
    damaged = d.get("manifest_problem")
    return [
        report_link(d["manifest_uri"], d["version"])
        if d["manifest"] is not None and d["manifest_uri"]
        else escape(d["version"]) + (f'<br><span class="fail">{escape(damaged)}</span>' if damaged else ""),
        scalar(manifest.get("created_at")) if manifest else '<span class="muted">-</span>',
        scalar(validation.get("rows")) if "rows" in validation else '<span class="muted">-</span>',
        scalar(quarantine.get("rows", 0)),
        tokens("train"),
        tokens("eval"),
        verdict,
    ]


def _datasets_section(datasets: Sequence[DatasetVersion]) -> str:
    head = "<h2>Datasets</h2>"
    if not datasets:
        return head + '<p class="muted">No staged datasets were found under the storage roots.</p>'
    by_name: dict[tuple[str, str], list[DatasetVersion]] = {}
    for d in datasets:
        by_name.setdefault((d["root"], d["name"]), []).append(d)
    header = ["Version", "Staged at", "Rows", "Quarantined", "Train tokens", "Eval tokens", "Validation"]
    out = [head]
    for (root, name), versions in sorted(by_name.items(), key=lambda kv: kv[0][1]):
        newest = sorted(versions, key=lambda d: (d["mtime"] is None, -(d["mtime"] or 0.0)))
        out.append(f'<h3>{escape(name)} <span class="muted">under {escape(root)}</span></h3>')
        out.append(table(header, [_dataset_row(d) for d in newest]))
    return "".join(out)


def home_page(
    runs: Sequence[HomeRun],
    models: Sequence[ModelEntry],
    datasets: Sequence[DatasetVersion],
    *,
    base_url: str,
    hidden_dags: int = 0,
    problems: Sequence[str] = (),
    dag_runs: Sequence[DagRunRow] | None = None,
    dag_runs_problem: str | None = None,
    now: float = 0.0,
) -> str:
    """The whole home page. ``runs`` newest first; ``base_url``: Airflow's public URL ("" for
    host-relative links); ``hidden_dags``: DAGs left out because the user may not read them;
    ``problems``: sentences about what could not be read (a root that could not be listed).
    ``dag_runs``: one row per DAG run with its outcome, the page's first section (None: not
    shown, as where no Airflow database is at hand); ``dag_runs_problem``: why they could not
    be read."""
    body = [f'<p class="fail">{escape(p)}</p>' for p in problems]
    if hidden_dags:
        body.append(
            f'<p class="muted">{escape(hidden_dags)} DAG(s) with runs are not shown: you may not read '
            "their task instances.</p>"
        )
    if dag_runs is not None or dag_runs_problem:
        body.append(dag_runs_section(dag_runs or [], base_url, now, dag_runs_problem))
    body.append(_runs_section(runs, base_url))
    refs = {}
    for entry in runs:
        job = entry["run"]["job"] or {}
        ref = airflow_ref(job, entry["run"]["dag_id"])
        if isinstance(job.get("run_uri"), str) and ref is not None and ref.run_id is not None:
            refs[job["run_uri"]] = ref
    body.append("<h2>Models</h2>")
    if models:
        body += [
            _model_section(m, refs, base_url) for m in sorted(models, key=lambda m: (m["name"], m["root"]))
        ]
    else:
        body.append('<p class="muted">No model has been promoted under the storage roots.</p>')
    body.append(_datasets_section(datasets))
    return page("trainops", "", "".join(body))
