"""The training run page: a run's ``job.json`` and its metrics as one HTML page, read top down.

First the outcome in one line and the few numbers that matter (:mod:`trainops.reports.run_outcome`:
promoted, rejected with the check, failed with the reason, or, while it trains, its step of
``train.max_steps`` and about how long is left; steps, duration, cost, goodput). Then the status,
cost and goodput (the timeline of attempts by phase and the cost table, from
:mod:`trainops.reports.cost_page`), the training charts (loss with the evaluation points,
learning rate, tokens/s and memory, one line per attempt so a resume after a preemption shows:
:mod:`trainops.reports.training_charts`), throughput per attempt and the attempts table, then each attempt's
log tail (folded, its last lines: :mod:`trainops.reports.log_tails`) and the raw ``job.json``
(folded); pure functions, no I/O. It is built from the page primitives of :mod:`trainops.reports.html`, so
every report page looks and is escaped the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from trainer.contract import METRICS_DIR, MetricsRecord, metrics_records
from trainops.recovery.hang import limit_in_verdict
from trainops.recovery.record import total_restarts_in_place
from trainops.reports.charts import CHART_COLOURS, MAX_CHART_POINTS, svg_line_chart
from trainops.reports.cost_page import cost_section, is_live, run_cost
from trainops.reports.html import (
    dicts,
    escape,
    json_value,
    object_name,
    page,
    raw_json,
    redact,
    report_link,
    scalar,
    table,
)
from trainops.reports.log_tails import attempt_logs
from trainops.reports.pages import TEXT_SUFFIXES, damaged_page
from trainops.reports.run_outcome import figures_table, outcome_line, run_outcome
from trainops.reports.training_charts import training_charts
from trainops.runs.progress import progress
from trainops.shapes import ShapeError, check_job, load

__all__ = ["CHART_COLOURS", "MAX_CHART_POINTS", "render_run_report", "run_report", "svg_line_chart"]


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ----------------------------------------------------------------------------- run report

_OUTCOME_CLASS = {
    "succeeded": "pass",
    "error": "fail",
    "infra": "fail",
    "failed": "fail",
    "hung": "fail",
    "timeout": "fail",
}


def _by_attempt(records: list[dict]) -> dict[object, list[dict]]:
    """Metrics records grouped by attempt, in attempt order (numbered attempts first)."""
    groups: dict[object, list[dict]] = {}
    for rec in records:
        attempt = rec.get("attempt")
        groups.setdefault(attempt if isinstance(attempt, (int, str)) else None, []).append(rec)
    order = sorted(groups, key=lambda a: (0, a, "") if isinstance(a, int) else (1, 0, str(a)))
    return {a: groups[a] for a in order}


def _attempt_name(attempt: object) -> str:
    return f"attempt {attempt}" if attempt is not None else "attempt ?"


def _last(recs: list[dict]) -> dict:
    """The record of the highest step (the later one in the file for a repeated step)."""
    return max(reversed(recs), key=lambda r: r["step"])


def _outcome(value: object) -> str:
    css = _OUTCOME_CLASS.get(str(value))
    return f'<span class="{css}">{escape(value)}</span>' if css else scalar(value)


def _run_summary(uri: str, job: dict, final: dict | None, metrics_uri: str | None) -> str:
    attempts = dicts(job.get("attempts"))
    lost = [a["steps_lost"] for a in attempts if _finite(a.get("steps_lost"))]
    restarts = total_restarts_in_place(job)
    rows = [
        ("Status", _outcome(job.get("status", "unknown"))),
        ("Attempts", scalar(len(attempts))),
        ("Preemptions", scalar(job.get("preemptions"))),
        ("Infrastructure failures", scalar(job.get("infra_failures"))),
        # torchrun's restarts of failed workers inside an attempt's pods (each attempt's reason says why)
        ("Restarts in place", scalar(restarts) if restarts else None),
        ("Steps lost to interruptions", scalar(sum(lost)) if lost else None),
        ("Hang timeout", _hang_limit(attempts)),
        ("Last logged step", scalar(final["step"]) if final else None),
        ("Loss at that step", scalar(final.get("loss")) if final else None),
        ("Cluster", scalar(job.get("cluster")) if "cluster" in job else None),
        ("Capacity (latest)", scalar(job.get("capacity")) if "capacity" in job else None),
    ]
    for label, key in (("Config", "config_uri"), ("Run prefix", "run_uri")):
        value = job.get(key)
        if isinstance(value, str) and value:
            rows.append(
                (
                    label,
                    report_link(value) if value.endswith(TEXT_SUFFIXES) else f"<code>{escape(value)}</code>",
                )
            )
    if metrics_uri:  # a file (an older run's metrics.jsonl) is a link; the parts are a folder
        rows.append(
            (
                "Metrics",
                report_link(metrics_uri)
                if metrics_uri.endswith(TEXT_SUFFIXES)
                else f"<code>{escape(metrics_uri)}</code>",
            )
        )
    return (
        "<table>"
        + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows if v is not None)
        + "</table>"
    )


def _hang_limit(attempts: list[dict]) -> str | None:
    """The limit the hang watch applied to the newest hung attempt, from its verdict (which
    rule gave it, with the numbers); None when no attempt hung."""
    for a in reversed(attempts):
        reason = a.get("reason")
        found = (
            limit_in_verdict(reason)
            if a.get("classification") == "hung" and isinstance(reason, str)
            else None
        )
        if found is not None:
            return escape(f"{found[0]:.0f} s ({found[1]}), attempt {a.get('attempt', '?')}")
    return None


def _throughput(groups: dict) -> str:
    has_mfu = any(_finite(r.get("mfu")) for recs in groups.values() for r in recs)
    header = ["Attempt", "Logged steps", "Steps", "Median tokens/s", "Last tokens/s", "Last loss"] + (
        ["Median MFU"] if has_mfu else []
    )
    rows = []
    for attempt, recs in groups.items():
        last = _last(recs)
        speeds = [r["tokens_per_s"] for r in recs if _finite(r.get("tokens_per_s"))]
        mfus = [r["mfu"] for r in recs if _finite(r.get("mfu"))]
        row = [
            escape(_attempt_name(attempt)),
            scalar(len(recs)),
            escape(f"{min(r['step'] for r in recs)} to {last['step']}"),
            _rate(statistics.median(speeds)) if speeds else "-",
            _rate(last.get("tokens_per_s")),
            scalar(last.get("loss")),
        ]
        if has_mfu:
            row.append(escape(f"{100 * statistics.median(mfus):.1f}%") if mfus else "-")
        rows.append(row)
    if not rows:
        return ""
    return f"<h2>Throughput</h2>{table([escape(h) for h in header], rows)}"


def _rate(value: object) -> str:
    return escape(f"{value:,.0f}") if _finite(value) else scalar(value)


def _cell(value: object) -> str:
    return '<span class="muted">-</span>' if value is None else scalar(value)


def _node_types(value: object) -> str:
    nodes = dicts(value)
    if not nodes:
        return '<span class="muted">-</span>' if not value else json_value(value)
    parts = []
    for node in nodes:
        kind = node.get("instance_type") or "?"
        capacity = f" ({node['capacity_type']})" if node.get("capacity_type") else ""
        parts.append(f"node {node.get('index', '?')}: {kind}{capacity}")
    return "<br>".join(escape(p) for p in parts)


def _attempts_table(job: dict) -> str:
    attempts = dicts(job.get("attempts"))
    if not attempts:
        return '<h2>Attempts</h2><p class="muted">No attempt has been launched yet.</p>'
    running = job.get("status") == "running"
    rows = []
    for i, a in enumerate(attempts):
        ended = a.get("ended_at")
        if ended is None and running and i == len(attempts) - 1:
            ended_cell = '<span class="muted">running</span>'
        else:
            ended_cell = _cell(ended)
        decision = a.get("decision")
        decision = decision.get("reason") if isinstance(decision, dict) else decision
        outcome = a.get("classification")
        rows.append(
            [
                _cell(a.get("attempt", i + 1)),
                _cell(a.get("capacity")),
                _cell(a.get("launched_at")),
                ended_cell,
                _cell(outcome) if outcome is None else _outcome(outcome),
                _cell(a.get("reason")),
                _cell(a.get("steps_lost")),
                _node_types(a.get("node_types")),
                _cell(decision),
            ]
        )
    header = [
        "Attempt",
        "Capacity",
        "Launched",
        "Ended",
        "Classification",
        "Reason",
        "Steps lost",
        "Node types",
        "Decision",
    ]
    return f"<h2>Attempts</h2>{table(header, rows)}"


def run_report(
    job: dict,
    metrics: str | Sequence[MetricsRecord] | None,
    *,
    uri: str = "",
    metrics_problem: str | None = None,
    metrics_uri: str | None = None,
    now: float | None = None,
    evaluation: dict | None = None,
    gate: Mapping | None = None,
    promotion: Mapping | None = None,
    promoted: Sequence[tuple[str, int, str]] = (),
    max_steps: int | None = None,
    linkable: Callable[[str], bool] = lambda _uri: False,
) -> str:
    """A training run's report (HTML, no page around it) from its ``job.json`` and metrics.

    :param job: the run's ``job.json``, parsed.
    :param metrics: its records as :class:`trainer.contract.MetricsReader` merged them, or the
        text of one ``metrics.jsonl`` (the previous version's file), or None when they could
        not be read (the page then says so, with ``metrics_problem`` as the reason, and draws
        no curve).
    :param uri: the job.json's storage URI, for links to the config and the metrics.
    :param metrics_uri: where the metrics were read, for the summary; by default, beside
        ``uri``: its ``metrics.jsonl`` for a text, its ``metrics/`` folder for records.
    :param now: the time a running run is accounted up to, when its ``job.json`` holds no
        ``cost`` (see :func:`trainops.reports.cost_page.cost_section`).
    :param evaluation: the run's ``eval/metrics.json``, parsed, when it has one: its loss is
        drawn on the loss curve.
    :param gate: the gate's decision beside the run (``eval/gate.json``), parsed, when there is
        one: a finished run's outcome is its verdict.
    :param promotion: what became of an approved candidate (``eval/promotion.json``: promoted,
        identical to production, rejected on re-gate), parsed, when the promote task wrote it.
    :param promoted: ``(model, version, card URI)`` of each version promoted from the run.
    :param max_steps: the run's ``train.max_steps`` when known: a live run's progress and ETA.
    :param linkable: whether the report app serves a URI (a node's whole log), to link to it.
    """
    redacted = redact(job)
    job = redacted if isinstance(redacted, dict) else {}  # redact keeps a dict a dict
    records = metrics_records(metrics) if isinstance(metrics, str) else list(metrics or [])
    groups = _by_attempt(records)
    final = _last([r for recs in groups.values() for r in recs]) if groups else None
    outcomes = {
        a.get("attempt"): a["classification"]
        for a in dicts(job.get("attempts"))
        if isinstance(a.get("classification"), str) and isinstance(a.get("attempt"), int | str | None)
    }
    if metrics_uri is None and metrics is not None and uri.endswith("/job.json"):
        folder = uri[: -len("job.json")]
        metrics_uri = folder + ("metrics.jsonl" if isinstance(metrics, str) else f"{METRICS_DIR}/")
    found = run_cost(job, records if metrics is not None else None, now=now)
    where = None
    if is_live(job) and records:
        at = (
            now
            if now is not None
            else max((r["time"] for r in records if _finite(r.get("time"))), default=0.0)
        )
        where = progress(records, max_steps, at)
    decision = redact(dict(gate)) if gate is not None else None  # its checks' notes are shown
    outcome = run_outcome(
        job,
        task=_task_of(uri),
        gate=decision if isinstance(decision, dict) else None,
        promotion=promotion,
        promoted=promoted,
        found=where,
        max_steps=max_steps,
    )
    return (
        outcome_line(outcome)
        + figures_table(job, found[0], last_step=final["step"] if final else None, max_steps=max_steps)
        + _run_summary(uri, job, final, metrics_uri if metrics is not None else None)
        + cost_section(job, records if metrics is not None else None, now=now, found=found)
        + training_charts(
            groups,
            outcomes=outcomes,
            evaluation=evaluation,
            metrics_read=metrics is not None,
            metrics_problem=metrics_problem,
        )
        + _throughput(groups)
        + _attempts_table(job)
        + attempt_logs(job, linkable)
    )


def _task_of(uri: str) -> str:
    """The Airflow task of the run whose ``job.json`` is at ``uri`` (its folder's name)."""
    parts = uri.split("/")
    return parts[-2] if len(parts) >= 2 and parts[-1] == "job.json" and parts[-2] else "train"


def _run_title(uri: str) -> str:
    parts = uri.split("/")
    if len(parts) >= 6 and parts[-5] == "runs":
        return f"Training run: {parts[-4]} / {parts[-3]} / {parts[-2]}"
    return f"Training run: {object_name(uri)}"


def render_run_report(
    uri: str,
    data: bytes,
    metrics: str | Sequence[MetricsRecord] | None,
    *,
    metrics_problem: str | None = None,
    metrics_uri: str | None = None,
    now: float | None = None,
    evaluation: dict | None = None,
    gate: Mapping | None = None,
    promotion: Mapping | None = None,
    promoted: Sequence[tuple[str, int, str]] = (),
    max_steps: int | None = None,
    linkable: Callable[[str], bool] = lambda _uri: False,
) -> str:
    """The page for a run's ``job.json`` (bytes ``data``) with its metrics (see :func:`run_report`).

    The report (outcome, status, cost, training charts, throughput, attempts, log tails) comes
    first and the raw JSON last, folded;
    a ``job.json`` that is not JSON, or not a run's record (:func:`trainops.shapes.check_job`),
    gets a page that says which field is wrong, and what it holds.
    """
    text = data.decode("utf-8", errors="replace")
    try:
        job: dict = load(text, uri, check_job)
    except ShapeError as exc:
        return damaged_page(_run_title(uri), uri, exc, text)
    body = run_report(
        job,
        metrics,
        uri=uri,
        metrics_problem=metrics_problem,
        metrics_uri=metrics_uri,
        now=now,
        evaluation=evaluation,
        gate=gate,
        promotion=promotion,
        promoted=promoted,
        max_steps=max_steps,
        linkable=linkable,
    )
    return page(_run_title(uri), uri, body + raw_json(redact(job), "job.json"))
