"""The fleet page over found runs: per DAG its newest runs, their figures, a trend, and rows
that say why a run has none."""

from __future__ import annotations

import copy

from tests.trainops.cost.fixtures import one_preemption_cost, one_preemption_job
from tests.trainops.reports.helpers import Svg, page_tables, page_text
from trainops.reports.fleet import FleetRun, fleet_page, fleet_summary

ATTACK = "<script>alert(1)</script>"


def _run(dag: str, run_id: str, mtime: float | None, *, scale: float = 1.0, **job_fields) -> FleetRun:
    job, _ = one_preemption_job()
    cost = copy.deepcopy(one_preemption_cost())
    for key in ("cost", "on_demand_cost", "savings"):
        cost[key] *= scale
    return FleetRun(
        dag_id=dag,
        run_id=run_id,
        task_id="train",
        uri=f"file:///r/runs/{dag}/{run_id}/train/job.json",
        mtime=mtime,
        job={**job, "cost": cost, **job_fields},
        problem=None,
    )


def _rows(html: str, skip: int = 0) -> list[list[str]]:
    return [t for t in page_tables(html) if t[0][0] == "Run / task"][skip]


def test_each_dag_shows_its_newest_runs_with_their_figures_and_a_trend():
    runs = [_run("nightly", f"r{i}", 1000.0 + i, scale=i) for i in range(1, 5)]
    runs.append(_run("adhoc", "a1", 50.0))
    html = fleet_page(runs, limit=3)
    text = page_text(html)
    assert text.startswith("Training cost of the fleet The last 3 runs of each DAG, newest first.")
    assert "Every amount is an estimate in USD" in text

    assert text.index("adhoc") < text.index("nightly")  # DAGs in name order
    nightly = _rows(html, skip=1)
    assert [row[0] for row in nightly[1:]] == ["r4 / train", "r3 / train", "r2 / train"]  # r1 is older
    cost = one_preemption_cost()
    assert nightly[1] == [
        "r4 / train",
        "succeeded",
        f"${4 * cost['cost']:,.2f}",
        f"${4 * cost['on_demand_cost']:,.2f}",
        f"${4 * cost['savings']:,.2f}",
        "47.2%",
        "1",
        "0.169",
    ]
    assert 'href="report?uri=file%3A%2F%2F%2Fr%2Fruns%2Fnightly%2Fr4%2Ftrain%2Fjob.json"' in html

    # per DAG with two runs or more a cost chart (spot and on-demand, oldest to newest) and a
    # goodput chart, both from zero; a DAG with one run says why it has none
    charts = Svg(html)
    assert charts.svgs == 2
    assert "The trend charts of cost and goodput appear once the DAG has two runs with a cost." in text
    assert text.index("appear once the DAG") < text.index("nightly")  # under adhoc
    [nightly_spot] = [points for name, points in charts.lines if name == "cost (spot, estimate)"]
    assert len(nightly_spot) == 3
    assert nightly_spot[0][1] > nightly_spot[1][1] > nightly_spot[2][1]  # r2 < r3 < r4: rising (y down)
    assert html.count('class="tick y-min">0</text>') == 2

    totals = dict(page_tables(html)[0])  # over the runs shown: adhoc's a1 and nightly's r2..r4
    assert totals["Runs with a cost"] == "4"
    assert totals["Cost (estimate)"] == f"${(1 + 2 + 3 + 4) * cost['cost']:,.2f}"
    assert totals["Preemptions"] == "4"


def test_runs_without_figures_say_why():
    old = _run("nightly", "old", 1.0)
    del old["job"]["cost"]
    running = _run("nightly", "running", 3.0, status="running")
    del running["job"]["cost"]
    broken = FleetRun(
        dag_id="nightly",
        run_id="broken",
        task_id="train",
        uri="file:///r/runs/nightly/broken/train/job.json",
        mtime=2.0,
        job=None,
        problem=f"job.json is not valid JSON ({ATTACK})",
    )
    future = _run("nightly", "future", 4.0)
    future["job"]["cost"] = {"format": "trainops.cost/v9"}
    html = fleet_page([old, running, broken, future], limit=20)
    rows = {row[0]: row[1:3] for row in _rows(html)[1:]}
    assert rows == {
        "future / train": ["succeeded", "the cost in job.json is not a trainops.cost/v1 record"],
        "running / train": [
            "running",
            "still running: the cost is recorded when the run ends (its report shows it so far)",
        ],
        "broken / train": ["unreadable", f"job.json is not valid JSON ({ATTACK})"],
        "old / train": [
            "succeeded",
            "no cost in job.json: a run older than cost accounting (its report computes it)",
        ],
    }
    assert "<script" not in html
    assert "<svg" not in html  # no run with a cost: no trend
    assert fleet_summary([old, running, broken, future])["runs"] == 0


def test_no_runs_hidden_dags_problems_and_hostile_names():
    empty = page_text(fleet_page([], limit=20, dag_id="nightly"))
    assert empty.startswith("Training cost: nightly The last 20 runs")
    assert "No training runs of DAG 'nightly' were found under the storage roots." in empty
    assert "No training runs were found" in page_text(fleet_page([], limit=20))

    noted = page_text(fleet_page([], limit=5, hidden_dags=2, problems=[f"could not list {ATTACK}"]))
    assert f"could not list {ATTACK}" in noted
    assert "2 DAG(s) with runs are not shown: you may not read their task instances." in noted

    hostile = _run(ATTACK, ATTACK, 1.0)
    html = fleet_page([hostile], limit=20)
    assert "<script" not in html
    assert _rows(html)[1][0] == f"{ATTACK} / train"
    assert (
        f"<h2>{ATTACK}</h2>".replace("<script>", "&lt;script&gt;").replace("</script>", "&lt;/script&gt;")
        in html
    )
