"""The training run page as a reader sees it: summary, loss curve, throughput and attempts."""

from __future__ import annotations

import json
import re

from tests.trainops.reports.helpers import (
    JOB_URI,
    RUN_METRICS,
    Svg,
    live_job,
    metrics_jsonl,
    page_text,
    run_job,
    svgs,
    table_with,
)
from trainops.recovery.hang import hang_verdict
from trainops.reports.run_page import MAX_CHART_POINTS, render_run_report, svg_line_chart

ATTACK = "<script>alert(1)</script>"


def test_run_report_shows_status_counts_curve_throughput_and_attempts():
    html = render_run_report(JOB_URI, json.dumps(run_job()).encode(), RUN_METRICS)
    text = page_text(html)
    # the outcome first (no gate decision was passed: trained, not yet decided), then the figures
    assert text.startswith(
        f"Training run: retrain / manual_1 / train {JOB_URI} TRAINED, not evaluated "
        "Steps Duration Cost (estimate) Goodput Attempts 10 "
    )
    assert text.index(" 2 (1 preempted) ") < text.index("Status succeeded")

    summary = dict(table_with(html, "Status"))
    assert {
        k: summary[k]
        for k in (
            "Status",
            "Attempts",
            "Preemptions",
            "Infrastructure failures",
            "Steps lost to interruptions",
            "Last logged step",
            "Loss at that step",
        )
    } == {
        "Status": "succeeded",
        "Attempts": "2",
        "Preemptions": "1",
        "Infrastructure failures": "0",
        "Steps lost to interruptions": "1",
        "Last logged step": "10",
        "Loss at that step": "2.5",
    }
    assert summary["Metrics"] == "s3://bucket/root/runs/retrain/manual_1/train/metrics.jsonl"
    assert (
        'href="report?uri=s3%3A%2F%2Fbucket%2Froot%2Fruns%2Fretrain%2Fmanual_1%2Ftrain%2Fconfig.yaml"'
    ) in html

    assert list(svgs(html)) == [
        "Training loss by step",
        "Training loss by step (log)",
        "Learning rate by step",
        "Learning rate by step (log)",
        "Tokens per second by step",
        "Tokens per second by step (log)",
    ]
    chart = Svg(svgs(html)["Training loss by step"])
    assert [(name, len(points)) for name, points in chart.lines] == [
        ("attempt 1 (preempted)", 6),
        ("attempt 2 (succeeded)", 5),
    ]
    assert chart.legend == ["attempt 1 (preempted)", "attempt 2 (succeeded)"]
    assert chart.ticks == {"y-max": "4", "y-min": "2.5", "x-min": "1", "x-max": "10"}
    first, second = (points for _, points in chart.lines)
    assert [p[0] for p in first] == sorted(p[0] for p in first)  # drawn left to right
    assert first[0][1] < first[-1][1] < second[-1][1]  # loss goes down (SVG y grows down)
    assert second[0][0] == first[-1][0]  # attempt 2 resumes at step 6, which attempt 1 logged
    assert chart.dots == [first[0], second[0]]  # a dot where each attempt starts
    assert [p[1] for p in first].index(min(p[1] for p in first)) == 0  # highest loss on top

    assert table_with(html, "Attempt")[1:] == [
        ["attempt 1", "6", "1 to 6", "3,000", "3,000", "3.05"],
        ["attempt 2", "5", "6 to 10", "4,000", "4,200", "2.5"],
    ]
    attempts = table_with(html, "Attempt", skip=1)
    assert attempts[0] == [
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
    assert attempts[1] == [
        "1",
        "spot",
        "2026-01-01T00:00:00+00:00",
        "2026-01-01T00:10:00+00:00",
        "preempted",
        "spot interruption notice",
        "1",
        "node 0: g5.xlarge (spot)",
        "preemption 1 of at most 3: relaunching to resume",
    ]
    assert attempts[2][:7] == [
        "2",
        "on-demand",
        "2026-01-01T00:11:00+00:00",
        "2026-01-01T00:20:00+00:00",
        "succeeded",
        "the trainer completed every step",
        "0",
    ]
    assert "Raw JSON" in text and text.index("Attempts Attempt") < text.index("Raw JSON")
    assert "SECRET-1" not in html and "<script" not in html


def test_run_report_escapes_hostile_values_in_the_table_and_the_chart():
    job = run_job(status=ATTACK)
    job["attempts"][0].update(
        reason=ATTACK, classification=ATTACK, node_types=[{"index": 0, "instance_type": ATTACK}]
    )
    metrics = RUN_METRICS + json.dumps({"step": 11, "loss": 2.4, "attempt": ATTACK}) + "\n"
    html = render_run_report(f"file:///r/runs/{ATTACK}/r/t/job.json", json.dumps(job).encode(), metrics)
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    attempts = table_with(html, "Attempt", skip=1)
    assert attempts[1][4:6] == [ATTACK, ATTACK]
    assert attempts[1][7] == f"node 0: {ATTACK}"
    assert dict(table_with(html, "Status"))["Status"] == ATTACK
    assert f"attempt {ATTACK}" in Svg(html).legend


def test_run_report_without_metrics_says_why_and_draws_nothing():
    job = json.dumps(run_job()).encode()
    missing = render_run_report(JOB_URI, job, None)
    assert "<svg" not in missing
    assert "No loss curve: no metrics were found next to job.json." in page_text(missing)
    assert table_with(missing, "Attempt")[1][0] == "1"  # the attempts table is still there
    assert "Throughput" not in page_text(missing)

    refused = render_run_report(JOB_URI, job, None, metrics_problem=f"refused {ATTACK}")
    assert f"No loss curve: refused {ATTACK}." in page_text(refused)

    for empty in ("", "\n", "not json\n", '{"loss": 1.0}\n'):
        html = render_run_report(JOB_URI, job, empty)
        assert "<svg" not in html and "Throughput" not in page_text(html)
        assert "No loss values have been logged yet." in page_text(html)
        assert "Preemptions 1" in page_text(html)
    assert "No loss values have been logged yet." in page_text(render_run_report(JOB_URI, job, []))


def test_run_report_from_merged_records_names_the_parts_folder():
    from trainer.contract import metrics_records

    html = render_run_report(JOB_URI, json.dumps(run_job()).encode(), metrics_records(RUN_METRICS))
    assert (
        svgs(html)["Training loss by step"].count("<polyline") == 2
        and dict(table_with(html, "Status"))["Last logged step"] == "10"
    )
    assert (
        dict(table_with(html, "Status"))["Metrics"] == "s3://bucket/root/runs/retrain/manual_1/train/metrics/"
    )


def test_non_finite_losses_are_reported_and_left_out_of_the_curve():
    metrics = metrics_jsonl(
        (1, 1, 3.0, 10.0),
        (1, 2, float("nan"), 10.0),
        (1, 3, 2.0, 10.0),
        (1, 4, float("inf"), 10.0),
        (1, 5, 1.0, 10.0),
    )
    assert "NaN" in metrics and "Infinity" in metrics  # as json.dumps writes them
    html = render_run_report(JOB_URI, json.dumps(run_job()).encode(), metrics)
    assert (
        "The loss was not a finite number (NaN or infinite) at 2 logged step(s), first at "
        "step 2 of attempt 1; those steps are not drawn."
    ) in page_text(html)
    chart = Svg(svgs(html)["Training loss by step"])
    assert [len(points) for _, points in chart.lines] == [3]
    assert (chart.ticks["y-min"], chart.ticks["y-max"]) == ("1", "3")

    only_nan = render_run_report(
        JOB_URI, json.dumps(run_job()).encode(), metrics_jsonl((1, 1, float("nan"), 10.0))
    )
    assert "Training loss by step" not in svgs(only_nan)
    assert "No loss values have been logged yet." in page_text(only_nan)


def test_a_single_logged_step_is_a_dot_on_a_widened_axis():
    job = run_job(status="running", preemptions=0)
    job["attempts"] = [{"attempt": 1, "capacity": "spot", "launched_at": "2026-01-01T00:00:00+00:00"}]
    html = render_run_report(JOB_URI, json.dumps(job).encode(), metrics_jsonl((1, 7, 2.5, 10.0)))
    chart = Svg(svgs(html)["Training loss by step"])
    assert [(name, len(points)) for name, points in chart.lines] == [("attempt 1", 1)]
    assert len(chart.dots) == 1
    assert chart.ticks == {"y-max": "2.75", "y-min": "2.25", "x-min": "6", "x-max": "8"}
    assert table_with(html, "Attempt", skip=1)[1][:5] == [
        "1",
        "spot",
        "2026-01-01T00:00:00+00:00",
        "running",
        "-",
    ]


def test_svg_line_chart_without_points_and_with_long_series():
    empty = svg_line_chart([("attempt 1", [])])
    assert "<polyline" not in empty and ">no data</text>" in empty
    assert svg_line_chart([]).count("<svg") == 1

    long = [(step, 1.0 / step) for step in range(1, 5001)]
    chart = Svg(svg_line_chart([("a", long), ("b", [(1, float("nan")), (2, 0.5)])]))
    (_, thinned), (_, short) = chart.lines
    assert len(thinned) <= MAX_CHART_POINTS + 1 and len(short) == 1
    assert (chart.ticks["x-min"], chart.ticks["x-max"]) == ("1", "5000")
    assert (chart.ticks["y-min"], chart.ticks["y-max"]) == ("0.0002", "1")


def test_job_json_that_is_not_a_run_record_is_a_page_naming_what_is_wrong():
    cut = page_text(render_run_report(JOB_URI, b'{"status": "run', None))
    assert f"{JOB_URI} is not valid JSON (Unterminated string" in cut
    assert cut.endswith('Its text {"status": "run')
    listed = page_text(render_run_report(JOB_URI, b"[1, 2]", None))
    assert listed.startswith("Training run: retrain / manual_1 / train")
    assert f"{JOB_URI} should hold a JSON object (a training run's record), got a list of 2 item(s)" in listed
    job = run_job()
    job["attempts"][1]["steps_lost"] = "4"
    wrong = render_run_report(JOB_URI, json.dumps(job).encode(), RUN_METRICS)
    assert (
        f"{JOB_URI}: field 'attempts[1].steps_lost' should be a whole number, got the text \"4\"; the "
        "run's record is damaged: restore it, or move it aside to start the run's bookkeeping afresh"
    ) in page_text(wrong)
    assert "Raw JSON" in page_text(wrong) and "SECRET-1" not in wrong  # what it holds, redacted


def _phases(html: str) -> list[tuple[str, str]]:
    """``(attempt, phase)`` of each segment the timeline draws."""
    return re.findall(r'<rect class="phase" data-attempt="([^"]*)" data-phase="([^"]*)"', html)


def test_a_live_run_mid_training_shows_its_progress_and_no_predates_or_shutdown():
    job, records, last = live_job(steps=40, every_s=2.0)  # 40 of 120 steps, 0.5 steps/s
    html = render_run_report(JOB_URI, json.dumps(job).encode(), records, now=last + 4, max_steps=120)
    text = page_text(html)
    # the first line says where it stands: 80 steps left at 0.5 steps/s, from a step 4 s old
    assert text.startswith(
        f"Training run: retrain / manual_1 / train {JOB_URI} RUNNING: step 40/120, about 3 min left Steps"
    )
    figures = table_with(html, "Steps")
    assert dict(zip(figures[0], figures[1], strict=True))["Steps"] == "40 / 120"
    assert "predates" not in text
    assert "This run is still running: the figures below are accounted up to now" in text
    phases = _phases(html)
    assert phases and {attempt for attempt, _ in phases} == {"1"}
    assert "shutdown" not in {phase for _, phase in phases}
    assert phases[-1][1] == "productive"  # up to now: steps trained, not logged yet
    assert re.search(r'<text class="running" data-attempt="1"[^>]*>running</text>', html)
    assert table_with(html, "Attempt", skip=1)[1][3] == "running"


def test_a_live_run_before_its_first_step_says_it_is_starting():
    job, _, _ = live_job(steps=1)
    html = render_run_report(JOB_URI, json.dumps(job).encode(), [], now=1_767_225_700.0, max_steps=120)
    text = page_text(html)
    assert f"{JOB_URI} RUNNING: no step logged yet Steps" in text
    assert "predates" not in text and "shutdown" not in {p for _, p in _phases(html)}


def test_the_raw_json_and_the_log_tails_are_folded_and_long_logs_cut_to_their_end():
    job = run_job()
    log = "\n".join(f"[node-0] line {i}" for i in range(1, 201))
    job["attempts"][1].update(
        logs_tail=log,
        state={"nodes": [{"index": 0, "log": "/var/trainops/local/jobs/train-a2/node-0.log"}]},
    )
    html = render_run_report(JOB_URI, json.dumps(job).encode(), RUN_METRICS)
    raw = re.search(r"<details[^>]*>(?:(?!</details>).)*Raw JSON.*?</details>", html, flags=re.S)
    assert raw is not None and " open" not in raw.group(0)[:40]  # closed until opened
    assert "&quot;run_uri&quot;" in raw.group(0)
    assert re.search(
        r"<summary>Raw JSON <span[^>]*>\(job\.json: [\d.]+ KB, \d+ lines\)</span></summary>", html
    )
    text = page_text(html)
    assert "Log tail of attempt 2 (succeeded) (last 60 of 200 lines, 3.5 KB kept in job.json)" in text
    tail = re.search(r"Log tail of attempt 2.*?</details>", html, flags=re.S).group(0)
    assert "line 141\n" in tail and "line 200" in tail and "line 140\n" not in tail
    assert "/var/trainops/local/jobs/train-a2/node-0.log" in tail  # where the whole log is
    assert text.index("Attempts Attempt") < text.index("Log tail of attempt 2") < text.index("Raw JSON")

    served = render_run_report(JOB_URI, json.dumps(job).encode(), RUN_METRICS, linkable=lambda uri: True)
    assert 'href="report?uri=file%3A%2F%2F%2Fvar%2Ftrainops%2Flocal%2Fjobs%2Ftrain-a2%2Fnode-0.log"' in served


def test_a_finished_runs_outcome_is_the_gates_verdict_or_what_became_of_it():
    job = json.dumps(run_job()).encode()
    check = {
        "name": "eval loss under max_eval_loss",
        "metric": "eval_loss",
        "observed": 4.2,
        "expected": "<= 3.5",
        "passed": False,
        "interval": ["not", "numbers"],  # a foreign decision: its words still cannot fail
        "confidence": 0.95,
    }
    gate = {"approved": False, "model_name": "lm", "checks": [check, {**check, "name": "no regression"}]}
    rejected = page_text(render_run_report(JOB_URI, job, RUN_METRICS, gate=gate))
    assert (
        f"{JOB_URI} REJECTED: eval loss under max_eval_loss: eval_loss (observed 4.2, expected <= 3.5) "
        "(+1 more) Steps"
    ) in rejected
    card = "s3://bucket/root/models/lm/versions/2/card.json"
    approved = {"approved": True, "model_name": "lm", "checks": [{**check, "observed": 3.0, "passed": True}]}
    promoted = render_run_report(JOB_URI, job, RUN_METRICS, gate=approved, promoted=[("lm", 2, card)])
    assert f"{JOB_URI} PROMOTED v2 Steps" in page_text(promoted) and 'class="outcome pass"' in promoted
    identical = {"format": "trainops.promotion-outcome/v1", "outcome": "identical", "version": 1}
    assert f"{JOB_URI} IDENTICAL to production v1 Steps" in page_text(
        render_run_report(JOB_URI, job, RUN_METRICS, gate=approved, promotion=identical)
    )
    assert f"{JOB_URI} APPROVED, not promoted Steps" in page_text(
        render_run_report(JOB_URI, job, RUN_METRICS, gate=approved)
    )
    failed = run_job(status="failed")
    failed["attempts"][1].update(classification="error", reason="CUDA out of memory in rank 3", decision=None)
    html = render_run_report(JOB_URI, json.dumps(failed).encode(), RUN_METRICS)
    assert f"{JOB_URI} FAILED at train: CUDA out of memory in rank 3 Steps" in page_text(html)
    assert 'class="outcome fail"' in html


def test_a_hung_attempt_shows_the_hang_timeout_and_the_rule_that_gave_it():
    beat = {
        "attempt": 1,
        "step": 12,
        "time": 1000.0,
        "steps": 12,
        "median_step_s": 0.2,
        "p99_step_s": 0.31,
        "max_gap_s": 0.25,
        "every_s": 10.0,
        "busy": None,
        "busy_since": None,
        "busy_ended": None,
    }
    why = hang_verdict(heartbeat=beat, watched_since=900.0, now=1036.0, setting=None)
    job = run_job()
    job["attempts"][0] |= {"classification": "hung", "reason": f"job retrain-train-1: {why}"}
    summary = dict(table_with(render_run_report(JOB_URI, json.dumps(job).encode(), RUN_METRICS), "Status"))
    assert summary["Hang timeout"] == (
        "30 s (hang_timeout 30s, derived: max(30s, 3 x heartbeat interval 10s, 10 x p99 step time 0.31s)), "
        "attempt 1"
    )
    no_hang = dict(
        table_with(render_run_report(JOB_URI, json.dumps(run_job()).encode(), RUN_METRICS), "Status")
    )
    assert "Hang timeout" not in no_hang


def test_an_attempt_restarted_in_place_shows_in_the_summary_and_its_row():
    job = run_job()
    finished = job["attempts"][1]
    restarts = [{"restart": 0, "outcome": "failed", "cause": "network", "steps_lost": 2}]
    finished["record"] = {"outcome": "completed", "last_step": 10, "restarts": restarts}
    finished["steps_lost"] = 2  # the restart replayed them
    finished["reason"] = (
        "the trainer completed every step; restarted in place 1× (network); resumed from the node-local "
        "tier: 4 of 4 files"
    )  # as the operator folds it (trainops.recovery.classify.classify_attempt)
    html = render_run_report(JOB_URI, json.dumps(job).encode(), RUN_METRICS)
    summary = dict(table_with(html, "Status"))
    assert (summary["Restarts in place"], summary["Steps lost to interruptions"]) == ("1", "3")
    row = table_with(html, "Attempt", skip=1)[2]
    assert row[5] == finished["reason"] and row[6] == "2"
    # a run without any says nothing of them
    assert "Restarts in place" not in dict(
        table_with(render_run_report(JOB_URI, json.dumps(run_job()).encode(), RUN_METRICS), "Status")
    )
