"""The cost section of a run's report: the timeline picture and the cost table, checked against
the hand-computed run of ``tests/trainops/cost/fixtures.py`` (one preemption, 10 steps replayed)."""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser

import pytest

from tests.trainops.cost.fixtures import (
    FIXTURE_PRICES,
    P4D_ON_DEMAND,
    P4D_SOURCE,
    P4D_SPOT,
    T0,
    one_preemption_cost,
    one_preemption_job,
    one_restart_job,
    one_rollback_job,
)
from tests.trainops.reports.helpers import JOB_URI, live_job, page_tables, page_text, svgs, table_with
from trainops.cost.accounting import account
from trainops.cost.money import money
from trainops.reports import cost_page
from trainops.reports.cost_page import (
    PHASE_COLOURS,
    TIMELINE_BOX,
    cost_section,
    duration,
    svg_timeline,
)
from trainops.reports.run_page import render_run_report

ATTACK = "<script>alert(1)</script>"


class Timeline(HTMLParser):
    """The timeline's shapes: phase rectangles, preemption marks, tick and legend texts."""

    def __init__(self, html: str):
        super().__init__()
        self.rects: list[dict] = []
        self.marks: list[dict] = []
        self.ticks: list[str] = []
        self.legend: list[str] = []
        self._text: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "rect" and attrs.get("class") == "phase":
            self.rects.append(attrs)
        elif tag == "path" and attrs.get("class") == "preemption":
            self.marks.append(attrs)
        elif tag == "text":
            self._text = attrs.get("class")

    def handle_endtag(self, tag):
        if tag == "text":
            self._text = None

    def handle_data(self, data):
        if self._text == "tick":
            self.ticks.append(data)
        elif self._text == "legend":
            self.legend.append(data)


def _run_with_cost() -> tuple[dict, list[dict]]:
    job, metrics = one_preemption_job()
    return {**job, "cost": one_preemption_cost()}, metrics


def test_one_bar_per_attempt_with_each_phase_as_wide_as_its_seconds():
    cost = one_preemption_cost()
    shapes = Timeline(svg_timeline(cost))
    left, _top, plot_w = TIMELINE_BOX
    px_per_s = plot_w / (314 - 0)  # the run spans T0 (first launch) to T0 + 314 (last pod end)

    rows = {}
    for rect in shapes.rects:
        rows.setdefault(rect["data-attempt"], set()).add(rect["y"])
    assert {a: len(ys) for a, ys in rows.items()} == {"1": 1, "2": 1}  # one bar (row) each
    assert float(rows["1"].pop()) < float(rows["2"].pop())

    for attempt in cost["attempts"]:
        rects = [r for r in shapes.rects if r["data-attempt"] == str(attempt["attempt"])]
        for phase, seconds in attempt["seconds"].items():
            drawn = sum(float(r["width"]) for r in rects if r["data-phase"] == phase)
            assert drawn == pytest.approx(seconds * px_per_s, abs=1.0), (attempt["attempt"], phase)
        for rect, span in zip(rects, (s for s in attempt["spans"] if s["end"] > s["start"]), strict=True):
            assert rect["data-phase"] == span["phase"]
            assert float(rect["x"]) == pytest.approx(left + (span["start"] - T0) * px_per_s, abs=1.0)
            assert rect["fill"] == PHASE_COLOURS[span["phase"]]
    # hand-computed: attempt 1 replays 10 s, attempt 2 none; attempt 2 starts queued at 170 s
    replayed = [r for r in shapes.rects if r["data-phase"] == "replayed"]
    assert [(r["data-attempt"], float(r["data-seconds"])) for r in replayed] == [("1", 10.0)]
    first_of_2 = next(r for r in shapes.rects if r["data-attempt"] == "2")
    assert (first_of_2["data-phase"], float(first_of_2["x"])) == (
        "queued",
        pytest.approx(left + 170 * px_per_s, abs=1),
    )


def test_preemptions_are_marked_where_the_attempt_ended_and_the_axis_reads_as_a_clock():
    cost = one_preemption_cost()
    shapes = Timeline(svg_timeline(cost))
    left, _top, plot_w = TIMELINE_BOX
    assert [m["data-attempt"] for m in shapes.marks] == ["1"]
    mark_x = float(shapes.marks[0]["d"][1:].split()[0])
    assert mark_x == pytest.approx(left + 160 * plot_w / 314, abs=1.0)  # attempt 1's pod ended at 160 s
    assert shapes.ticks == ["0:00", "1:00", "2:00", "3:00", "4:00", "5:00"]
    assert shapes.legend == [
        "queued (not billed)",
        "startup",
        "productive",
        "replayed",
        "checkpoint stall",
        "shutdown",
        "preemption",
    ]

    storm = copy.deepcopy(cost)
    for attempt in storm["attempts"]:
        attempt["preempted"] = True
    assert [m["data-attempt"] for m in Timeline(svg_timeline(storm)).marks] == ["1", "2"]


# By hand: 254 billed seconds (130 + 124) on 8 GPUs, priced per instance-hour (8 GPUs).
SPOT_COST = 254 / 3600 * P4D_SPOT
ON_DEMAND_COST = 254 / 3600 * P4D_ON_DEMAND


def test_the_table_shows_the_run_costs_figures_labelled_as_estimates():
    job, metrics = _run_with_cost()
    cost = job["cost"]
    html = cost_section(job, metrics)
    text = page_text(html)
    assert text.startswith("Cost and goodput (estimates) Every figure is an estimate, in USD")

    summary = dict(page_tables(html)[0])
    assert summary == {
        "Goodput (productive / billed GPU time)": "47.2%",  # 120 / 254
        "Cost (estimate)": f"${SPOT_COST:,.2f}",
        "On-demand equivalent (estimate)": f"${ON_DEMAND_COST:,.2f}",
        "Spot savings (estimate)": f"${ON_DEMAND_COST - SPOT_COST:,.2f}",
        "GPU-hours billed": "0.564",  # 254 x 8 / 3600
        "GPU-hours productive": "0.267",
        "GPU-hours lost to preemptions and failures": "0.169",  # (10 + 60 + 6) x 8 / 3600
        "Preemptions": "1",
        "Recovery time (interruption to the next first step)": "77.5 s",  # 230 - 152.5
    }
    assert summary["Cost (estimate)"] == money(cost["cost"])
    assert summary["Spot savings (estimate)"] == money(cost["savings"])

    times = table_with(html, "Attempt (time by phase)")
    assert times[0][5:] == [
        "Productive",
        "Replayed",
        "Startup",
        "Checkpoint stall",
        "Shutdown",
        "Queued (not billed)",
    ]
    money_rows = table_with(html, "Attempt (money)")
    assert money_rows[0][1:] == [
        "GPU-hours billed",
        "Price per GPU-hour (estimate)",
        "Price source",
        "Cost (estimate)",
        "On-demand equivalent (estimate)",
        "Savings (estimate)",
    ]
    for row, paid, attempt in zip(times[1:3], money_rows[1:3], cost["attempts"], strict=True):
        assert row[:5] == [str(attempt["attempt"]), "spot", "p4d.24xlarge", "8", attempt["outcome"]]
        assert row[5:] == [
            duration(attempt["seconds"][p])
            for p in ("productive", "replayed", "startup", "checkpoint_stall", "shutdown", "queued")
        ]
        assert paid == [
            str(attempt["attempt"]),
            f"{attempt['billed_gpu_s'] / 3600:,.3f}",
            f"${P4D_SPOT / 8:,.2f}",
            P4D_SOURCE,
            money(attempt["cost"]),
            money(attempt["on_demand_cost"]),
            money(attempt["on_demand_cost"] - attempt["cost"]),
        ]
    assert times[1][5:] == ["50.0 s", "10.0 s", "60.0 s", "4.0 s", "6.0 s", "30.0 s"]
    assert times[3][0] == "Total" and money_rows[3][0] == "Total"
    assert money_rows[3][4:] == [money(SPOT_COST), money(ON_DEMAND_COST), money(ON_DEMAND_COST - SPOT_COST)]
    assert times[3][5:] == ["120.0 s", "10.0 s", "100.0 s", "8.0 s", "16.0 s", "50.0 s"]


def test_hostile_names_and_notes_are_escaped_and_an_unknown_price_is_flagged():
    job, metrics = _run_with_cost()
    attempt = job["cost"]["attempts"][0]
    attempt["instance_type"] = ATTACK
    attempt["price"] = {"per_gpu_hour": 2.5, "source": f"default per-GPU-hour ({ATTACK})", "known": False}
    attempt["attempt"] = ATTACK
    job["cost"]["notes"] = [f"{ATTACK}: unknown instance type, priced at the default $2.50/GPU-hour"]
    html = cost_section(job, metrics)
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    row = table_with(html, "Attempt (time by phase)")[1]
    assert row[0] == ATTACK and row[2] == ATTACK
    assert table_with(html, "Attempt (money)")[1][2:4] == ["$2.50", f"default per-GPU-hour ({ATTACK})"]
    assert '<span class="fail">$2.50</span>' in html
    assert f"Notes: {ATTACK}: unknown instance type, priced at the default $2.50/GPU-hour" in page_text(html)
    assert Timeline(svg_timeline(job["cost"])).rects[0]["data-attempt"] == ATTACK


def test_a_broken_cost_record_is_a_sentence_and_bad_values_are_dashes():
    job, metrics = _run_with_cost()
    assert "has format 'v0'" not in page_text(cost_section({**job, "cost": {"format": "v0"}}, metrics))
    assert (
        "The cost in job.json has format v0, which this version does not read (it reads trainops.cost/v1)."
        in page_text(cost_section({**job, "cost": {"format": "v0"}}, metrics))
    )
    assert "The cost in job.json is not a record (list)." in page_text(
        cost_section({**job, "cost": [1]}, metrics)
    )

    odd = copy.deepcopy(job)
    odd["cost"]["goodput"] = float("nan")
    odd["cost"]["cost"] = "lots"
    odd["cost"]["attempts"][0]["spans"] = [{"phase": "coffee", "start": 0, "end": 1}, {"phase": "startup"}]
    html = cost_section(odd, metrics)
    summary = dict(page_tables(html)[0])
    assert (summary["Goodput (productive / billed GPU time)"], summary["Cost (estimate)"]) == ("-", "-")
    assert {r["data-attempt"] for r in Timeline(html).rects} == {"2"}  # attempt 1's spans were unusable

    empty = copy.deepcopy(job)
    empty["cost"]["attempts"] = []
    assert "no timeline: the cost record holds no phase spans" in svg_timeline(empty["cost"])


class _Accounting:
    """``trainops.cost.accounting.account`` and ``trainops.cost.prices.load_prices`` as stand-ins
    where the cost section calls them."""

    def __init__(self, monkeypatch, account):
        self.calls: list[tuple] = []

        def recorded(job, metrics, prices, now=None):
            self.calls.append((job, metrics, prices, now))
            return account(job, metrics, prices, now)

        monkeypatch.setattr(cost_page, "account", recorded)
        monkeypatch.setattr(
            cost_page,
            "load_prices",
            lambda param, variable: ({"p4d.24xlarge": {}}, "the shipped default table"),
        )


def test_an_older_run_without_cost_is_accounted_now(monkeypatch):
    job, metrics = one_preemption_job()
    assert "cost" not in job
    fake = _Accounting(monkeypatch, lambda job, metrics, prices, now: one_preemption_cost())
    html = cost_section(job, metrics, now=T0 + 400)
    assert len(fake.calls) == 1 and fake.calls[0][1:] == (metrics, {"p4d.24xlarge": {}}, T0 + 400)
    assert (
        "This run's job.json predates cost accounting: the figures below were computed now "
        "(prices: the shipped default table)."
    ) in page_text(html)
    assert len(Timeline(html).rects) == 16
    assert dict(page_tables(html)[0])["Cost (estimate)"] == money(SPOT_COST)


def test_an_older_run_says_why_when_it_cannot_be_accounted(monkeypatch):
    job, metrics = one_preemption_job()
    no_metrics = page_text(cost_section(job, None))
    assert no_metrics == (
        "Cost and goodput (estimates) No cost: this run's job.json predates cost accounting, and its "
        "metrics, which the accounting needs, could not be read."
    )

    def fails(*_args):
        raise ValueError(f"attempt 1 has no launched_at {ATTACK}")

    _Accounting(monkeypatch, fails)
    html = cost_section(job, metrics)
    assert "<svg" not in html and "<script" not in html
    assert page_text(html).endswith(
        f"No cost: this run's job.json predates cost accounting, and accounting for it failed: "
        f"attempt 1 has no launched_at {ATTACK}."
    )

    def lacks(*_args):
        raise KeyError("nodes")

    _Accounting(monkeypatch, lacks)
    assert page_text(cost_section(job, metrics)).endswith(
        "accounting for it failed: its job.json has no field 'nodes'."
    )


def test_an_older_run_is_accounted_by_the_real_accounting():
    pytest.importorskip("trainops.cost.accounting", reason="the accounting (#15) is not in this tree")
    job, metrics = one_preemption_job()
    html = cost_section(job, metrics)
    assert "computed now" in page_text(html)
    shapes = Timeline(html)
    assert {r["data-attempt"] for r in shapes.rects} == {"1", "2"}
    assert [m["data-attempt"] for m in shapes.marks] == ["1"]
    assert dict(page_tables(html)[0])["Goodput (productive / billed GPU time)"] == "47.2%"


def test_the_run_report_shows_the_cost_between_the_summary_and_the_loss():
    job, metrics = _run_with_cost()
    html = render_run_report(JOB_URI, json.dumps(job).encode(), metrics)
    text = page_text(html)
    assert text.index("Status succeeded") < text.index("Cost and goodput (estimates)")
    assert html.index("<h2>Cost and goodput (estimates)</h2>") < html.index('<h2 id="loss">Loss</h2>')
    assert html.count('class="chart timeline"') == 1  # and the loss curve:
    assert svgs(html)["Training loss by step"].count("<polyline") == 2
    assert (
        dict(table_with(html, "Goodput (productive / billed GPU time)"))[
            "Goodput (productive / billed GPU time)"
        ]
        == "47.2%"
    )
    assert table_with(html, "Attempt")[1][0] == "attempt 1"  # the throughput table is still found
    assert "<script" not in html and "javascript:" not in html


def test_a_running_run_is_accounted_up_to_now_and_never_said_to_predate_the_accounting():
    job, metrics, last = live_job(steps=30)
    text = page_text(cost_section(job, metrics, now=last + 5))
    assert "predates" not in text
    assert "This run is still running: the figures below are accounted up to now (prices: " in text
    assert "its final bill is written when it ends" in text
    phases = [r["data-phase"] for r in Timeline(cost_section(job, metrics, now=last + 5)).rects]
    assert phases == ["startup", "productive"]  # up to now: no shutdown while it trains
    unread = page_text(cost_section(job, None))
    assert unread == (
        "Cost and goodput (estimates) No cost yet: this run is still running, and its metrics, "
        "which the accounting needs, could not be read."
    )


def test_the_lost_time_by_cause_adds_up_to_the_billed_gpu_time():
    job, metrics = _run_with_cost()
    job = copy.deepcopy(job)
    job["attempts"][1]["record"]["restore_s"] = 5.0
    job["attempts"][0]["record"]["emergency_save_s"] = ATTACK  # a damaged record counts as none
    html = cost_section(job, metrics)
    rows = {row[0]: row[1:] for row in table_with(html, "Lost time by cause")[1:]}
    gpu_s = P4D_SPOT / 8 / 3600  # USD per GPU-second
    assert rows == {
        "Startup": ["95.0 s", "760", money(760 * gpu_s), "0"],
        "Restore (checkpoint load)": ["5.0 s", "40", money(40 * gpu_s), "0"],
        "Checkpoint save": ["18.0 s", "144", money(144 * gpu_s), "0"],  # stalls 8 s, final save 10 s
        "Lost progress (replayed or rolled-back steps)": ["10.0 s", "80", money(80 * gpu_s), "0"],
        # attempt 1's shutdown (billed) and the 10 s before attempt 2's launch (not billed)
        "Recovery": ["16.0 s", "48", money(48 * gpu_s), "80"],
        "Waiting for capacity (not billed)": ["50.0 s", "0", "$0.00", "400"],
        "Productive": ["", "960", money(960 * gpu_s), ""],
    }
    assert (
        f"Productive + causes = billed: 960 + 1,072 = 2,032 GPU-seconds; {money(960 * gpu_s)} + "
        f"{money(1072 * gpu_s)} = {money(SPOT_COST)}." in page_text(html)
    )
    assert "<script>" not in html


def test_a_restart_in_place_gets_its_column_colour_and_legend_only_where_there_was_one():
    job, metrics = one_restart_job()
    job = {**job, "cost": account(job, metrics, FIXTURE_PRICES)}
    html = cost_section(job, metrics)
    times = table_with(html, "Attempt (time by phase)")
    at = times[0].index("Restart in place")
    assert times[0][at - 1] == "Replayed" and times[1][at] == "13.0 s" and times[2][at] == "13.0 s"
    shapes = Timeline(svg_timeline(job["cost"]))
    restart = [r for r in shapes.rects if r["data-phase"] == "restart"]
    assert [float(r["data-seconds"]) for r in restart] == [13.0]
    assert restart[0]["fill"] == PHASE_COLOURS["restart"] and "restart in place" in shapes.legend
    plain, _ = _run_with_cost()
    assert "Restart in place" not in table_with(cost_section(plain, metrics), "Attempt (time by phase)")[0]
    assert "restart in place" not in Timeline(svg_timeline(plain["cost"])).legend


def test_a_bad_loss_rollback_gets_its_column_colour_and_legend_only_where_there_was_one():
    job, metrics = one_rollback_job()
    job = {**job, "cost": account(job, metrics, FIXTURE_PRICES)}
    times = table_with(cost_section(job, metrics), "Attempt (time by phase)")
    at = times[0].index("Rolled back (bad loss)")
    assert times[1][at] == "8.0 s" and "Restart in place" not in times[0]
    shapes = Timeline(svg_timeline(job["cost"]))
    rolled = [r for r in shapes.rects if r["data-phase"] == "rollback"]
    assert [float(r["data-seconds"]) for r in rolled] == [8.0]
    assert rolled[0]["fill"] == PHASE_COLOURS["rollback"] and "rolled back (bad loss)" in shapes.legend
    assert "restart in place" not in shapes.legend
    plain, _ = _run_with_cost()
    assert (
        "Rolled back (bad loss)" not in table_with(cost_section(plain, metrics), "Attempt (time by phase)")[0]
    )
    assert "rolled back (bad loss)" not in Timeline(svg_timeline(plain["cost"])).legend
