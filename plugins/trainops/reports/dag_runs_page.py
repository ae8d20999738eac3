"""The home page's first section: one row per DAG run, its outcome in words and colour
(:mod:`trainops.runs.dag_runs`), with the model, start, duration, cost and links to the run in
Airflow and to its report. A run that failed before training has its row too. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from trainer.contract import RunLayout
from trainops.reports.frame import AirflowRef, airflow_link
from trainops.reports.html import escape, report_link, table
from trainops.runs.dag_runs import DagRunRow
from trainops.runs.outcome import about

# outcome kind -> CSS class: a rejection or a failure reads red, a promotion green
KIND_CLASS = {
    "promoted": "pass",
    "rejected": "fail",
    "failed": "fail",
    "running": "live",
    "identical": "muted",
    "approved": "muted",
    "trained": "muted",
    "succeeded": "muted",
    "unknown": "muted",
}
HEADER = ["DAG run", "Outcome", "Model", "Started", "Took", "Cost (estimate)", "Report"]


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if value else "-"


def _took(row: DagRunRow, now: float) -> str:
    start, end = row.info.start, row.info.end
    if start is None:
        return "-"
    return about((end.timestamp() if end else now) - start.timestamp())


def outcome_cell(row: DagRunRow) -> str:
    kind = row.outcome.kind
    return f'<span class="outcome-{escape(kind)} {KIND_CLASS.get(kind, "muted")}">{escape(row.outcome.text)}</span>'


def _row(row: DagRunRow, base_url: str, now: float) -> list[str]:
    info, facts = row.info, row.facts
    link = airflow_link(AirflowRef(info.dag_id, info.run_id), base_url)
    run = f'<a class="airflow" href="{escape(link.href)}">{escape(info.dag_id)} / {escape(info.run_id)}</a>'
    model = (
        escape(facts.model_name) if facts is not None and facts.model_name else '<span class="muted">-</span>'
    )
    cost = f"${facts.cost:.2f}" if facts is not None and facts.cost is not None else "-"
    report = (
        report_link(RunLayout(facts.run_uri).job, "run report")
        if facts is not None and not facts.problem
        else '<span class="muted">-</span>'
    )
    return [run, outcome_cell(row), model, _when(info.start), _took(row, now), cost, report]


def dag_runs_section(rows: Sequence[DagRunRow], base_url: str, now: float, problem: str | None = None) -> str:
    """``<h2>Runs</h2>`` and the table (newest first), or why it could not be read."""
    head = "<h2>Runs</h2>"
    if problem:
        return head + f'<p class="muted">{escape(problem)}</p>'
    if not rows:
        return head + '<p class="muted">No run of a trainops DAG yet.</p>'
    return head + table(HEADER, [_row(r, base_url, now) for r in rows])
