"""The fleet page: the last runs of each DAG with their cost, goodput, preemptions and savings.

One section per DAG: a trend chart of the runs' cost (actual and on-demand equivalent) and
goodput, oldest to newest, and a table with one row per run, newest first, linking to its
report. A run whose ``job.json`` holds no ``cost`` (older than the accounting, or still
running) or could not be read gets a row saying why. Pure: the report app finds and reads the
runs (:func:`trainops.reports.fleet_reader.find_runs`) and hands them here as :class:`FleetRun` records.
"""

# No ``from __future__ import annotations``: FleetRun is a TypedDict read at run time.
from collections.abc import Sequence
from typing import Any, TypedDict

from trainops.cost.money import money
from trainops.reports.charts import svg_line_chart
from trainops.reports.cost_page import COST_FORMAT, gpu_hours, percent
from trainops.reports.html import escape, page, report_link, table

__all__ = ["FleetRun", "fleet_page", "fleet_summary"]


class FleetRun(TypedDict):
    """One run as the app found it: where, when (the ``job.json``'s modification time), and
    its parsed ``job.json`` or why it could not be read."""

    dag_id: str
    run_id: str
    task_id: str
    uri: str
    mtime: float | None
    job: dict[str, Any] | None
    problem: str | None


def _cost_of(run: FleetRun) -> tuple[dict[str, Any] | None, str | None]:
    """``(RunCost, None)`` or ``(None, why the row has no figures)``."""
    if run["problem"] is not None:
        return None, run["problem"]
    job = run["job"] or {}
    cost = job.get("cost")
    if cost is None:
        if job.get("status") == "running":
            return None, "still running: the cost is recorded when the run ends (its report shows it so far)"
        return None, "no cost in job.json: a run older than cost accounting (its report computes it)"
    if not isinstance(cost, dict) or cost.get("format") != COST_FORMAT:
        return None, f"the cost in job.json is not a {COST_FORMAT} record"
    return cost, None


def fleet_summary(runs: Sequence[FleetRun]) -> dict[str, float | int]:
    """Totals over the runs that have a cost: ``runs``, ``cost``, ``on_demand_cost``,
    ``savings``, ``preemptions`` and ``goodput`` (productive over billed GPU-hours)."""
    costs = [c for c, _ in map(_cost_of, runs) if c is not None]

    def total(key: str) -> float:
        return sum(float(c[key]) for c in costs if isinstance(c.get(key), (int, float)))

    billed = total("billed_gpu_hours")
    return {
        "runs": len(costs),
        "cost": total("cost"),
        "on_demand_cost": total("on_demand_cost"),
        "savings": total("savings"),
        "preemptions": int(total("preemptions")),
        "goodput": total("productive_gpu_hours") / billed if billed > 0 else float("nan"),
    }


def _row(run: FleetRun) -> list[str]:
    cost, why = _cost_of(run)
    job = run["job"] or {}
    name = report_link(run["uri"], label=f"{run['run_id']} / {run['task_id']}")
    status = (
        escape(job.get("status", "-")) if run["problem"] is None else '<span class="fail">unreadable</span>'
    )
    if cost is None:
        return [name, status, f'<span class="muted">{escape(why)}</span>', "", "", "", "", ""]
    return [
        name,
        status,
        escape(money(cost.get("cost"))),
        escape(money(cost.get("on_demand_cost"))),
        escape(money(cost.get("savings"))),
        escape(percent(cost.get("goodput"))),
        escape(cost.get("preemptions", "-")),
        escape(gpu_hours(cost.get("lost_gpu_hours"))),
    ]


def _trend(dag_id: str, runs: Sequence[FleetRun]) -> str:
    """Cost and goodput of the runs with a cost, oldest first (x: the run's place in the list)."""
    costs = [c for c, _ in map(_cost_of, reversed(runs)) if c is not None]
    if len(costs) < 2:  # one point is no trend
        return (
            '<p class="muted">The trend charts of cost and goodput appear once the DAG has two runs '
            "with a cost.</p>"
        )

    def series(key: str, factor: float = 1.0) -> list[tuple[float, float]]:
        out = []
        for i, cost in enumerate(costs, start=1):
            value = cost.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.append((float(i), float(value) * factor))
        return out

    money_chart = svg_line_chart(
        [("cost (spot, estimate)", series("cost")), ("on-demand equivalent", series("on_demand_cost"))],
        x_label="run, oldest to newest",
        y_label="USD",
        title=f"Cost per run of {dag_id}",
        height=200,
        y_from_zero=True,
    )
    goodput_chart = svg_line_chart(
        [("goodput", series("goodput", 100.0))],
        x_label="run, oldest to newest",
        y_label="goodput %",
        title=f"Goodput per run of {dag_id}",
        height=200,
        y_from_zero=True,
    )
    return money_chart + goodput_chart


_HEADER = [
    "Run / task",
    "Status",
    "Cost (estimate)",
    "On-demand equivalent (estimate)",
    "Savings (estimate)",
    "Goodput",
    "Preemptions",
    "GPU-hours lost",
]


def fleet_page(
    runs: Sequence[FleetRun],
    *,
    limit: int,
    dag_id: str | None = None,
    hidden_dags: int = 0,
    problems: Sequence[str] = (),
) -> str:
    """The whole fleet page: per DAG, the trend charts and the table of its last ``limit`` runs.

    :param runs: every run found, in any order; each DAG shows its ``limit`` newest (by
        ``mtime``, the higher run id first on a tie; runs without one last).
    :param dag_id: the DAG the page was narrowed to, if any (for the title).
    :param hidden_dags: DAGs left out because the user may not read them (counted on the page).
    :param problems: sentences about what could not be searched (a root that was unavailable).
    """
    by_dag: dict[str, list[FleetRun]] = {}
    for run in runs:
        by_dag.setdefault(run["dag_id"], []).append(run)
    body = [
        '<p class="muted">'
        + escape(
            f"The last {limit} runs of each DAG, newest first. Every amount is an estimate in USD "
            "(billed GPU time as the cluster saw it, at the price table's figures), not an invoice; "
            "a run's report shows its timeline and the price of each attempt."
        )
        + "</p>"
    ]
    body += [f'<p class="fail">{escape(p)}</p>' for p in problems]
    if hidden_dags:
        body.append(
            f'<p class="muted">{escape(hidden_dags)} DAG(s) with runs are not shown: you may not read '
            "their task instances.</p>"
        )
    if not by_dag:
        where = f" of DAG {dag_id!r}" if dag_id else ""
        body.append(
            f'<p class="muted">{escape(f"No training runs{where} were found under the storage roots.")}</p>'
        )
    shown: list[FleetRun] = []
    for dag in sorted(by_dag):
        by_id = sorted(by_dag[dag], key=lambda r: r["run_id"], reverse=True)  # ties: the higher run id
        newest = sorted(by_id, key=lambda r: (r["mtime"] is None, -(r["mtime"] or 0.0)))[:limit]
        shown += newest
        body.append(f"<h2>{escape(dag)}</h2>{_trend(dag, newest)}{table(_HEADER, [_row(r) for r in newest])}")
    if len(by_dag) > 1:
        totals = fleet_summary(shown)
        body.insert(
            1,
            "<table>"
            + "".join(
                f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>"
                for k, v in (
                    ("Runs with a cost", str(totals["runs"])),
                    ("Cost (estimate)", money(totals["cost"])),
                    ("On-demand equivalent (estimate)", money(totals["on_demand_cost"])),
                    ("Spot savings (estimate)", money(totals["savings"])),
                    ("Goodput", percent(totals["goodput"])),
                    ("Preemptions", str(totals["preemptions"])),
                )
            )
            + "</table>",
        )
    title = f"Training cost: {dag_id}" if dag_id else "Training cost of the fleet"
    return page(title, "", "".join(body))
