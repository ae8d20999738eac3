"""The run page's training charts: loss with eval points, learning rate, tokens/s, memory."""

from __future__ import annotations

import json
import re

from tests.trainops.reports.helpers import JOB_URI, RUN_METRICS, Svg, page_text, run_job, svgs
from trainer.contract import metrics_records
from trainops.reports.run_page import render_run_report
from trainops.reports.training_charts import attempt_markers, baseline_point, eval_points, training_charts

EVALUATION = {
    "format": "trainops-eval/1",
    "candidate": {"eval_loss": 2.7, "perplexity": 14.9, "tokens": 2000},
}


def _groups(records):
    out: dict = {}
    for r in records:
        out.setdefault(r.get("attempt"), []).append(r)
    return out


def _gpu_records():
    """Two attempts on a GPU: lr warms up, memory and tokens/s logged, a periodic eval at step 4."""
    rows = []
    for attempt, steps in ((1, range(1, 7)), (2, range(6, 11))):
        for step in steps:
            rows.append(
                {
                    "step": step,
                    "attempt": attempt,
                    "loss": 4.0 - 0.15 * step,
                    "lr": 1e-4 * min(step, 5),
                    "tokens_per_s": 3000.0 + step,
                    "peak_mem_gib": 10.0 + attempt,
                }
            )
    rows[3]["eval_loss"] = 3.5
    return rows


def test_the_run_page_draws_loss_with_eval_points_lr_tokens_and_memory_with_attempts_marked():
    metrics = "".join(json.dumps(r) + "\n" for r in _gpu_records())
    html = render_run_report(JOB_URI, json.dumps(run_job()).encode(), metrics, evaluation=EVALUATION)
    charts = svgs(html)
    assert [name for name in charts if not name.endswith("(log)")] == [
        "Training loss by step",
        "Learning rate by step",
        "Tokens per second by step",
        "Peak GPU memory by step",
    ]
    assert all(f"{name} (log)" in charts for name in list(charts) if not name.endswith("(log)"))
    # four switches, each its own (a shared id would tick the wrong chart's box)
    ids = re.findall(r'class="log-switch" id="([^"]+)"><label for="\1">', html)
    assert len(ids) == len(set(ids)) == 4
    loss = charts["Training loss by step"]
    # the periodic eval at step 4 and the evaluate task's at the last step, 10
    assert "<title>eval loss (held-out split) at 4: 3.5</title>" in loss
    assert "<title>eval loss (held-out split) at 10: 2.7</title>" in loss
    assert "eval/metrics.json" in page_text(html)
    assert "production's eval loss" not in loss  # this evaluation compared with nothing
    # with production scored too, its loss is a dot beside the candidate's
    compared = {**EVALUATION, "baseline": {"eval_loss": 2.9, "tokens": 2000}}
    html = render_run_report(JOB_URI, json.dumps(run_job()).encode(), metrics, evaluation=compared)
    assert "<title>production&#x27;s eval loss at 10: 2.9</title>" in svgs(html)["Training loss by step"]
    assert "The ring is the model it was compared with" in page_text(html)
    assert re.search(r'<circle data-series="production&#x27;s eval loss" [^>]*r="8" fill="none"', html)
    for name in ("Training loss by step", "Learning rate by step", "Peak GPU memory by step"):
        assert re.findall(r'class="attempt-marker" data-x="(\d+)"', charts[name]) == ["6"]
        assert ">attempt 2 (after preempted)</text>" in charts[name]  # run_job's attempt 1
    memory = Svg(charts["Peak GPU memory by step"])
    assert [name for name, _ in memory.lines] == ["attempt 1", "attempt 2"]
    assert memory.ticks["y-min"] == "0"  # an amount: the axis starts at zero
    lr = Svg(charts["Learning rate by step"])
    assert (lr.ticks["y-min"], lr.ticks["y-max"]) == ("0.0001", "0.0005")


def test_missing_fields_are_said_not_drawn():
    # the records the trainer writes on a CPU: no peak_mem_gib; these also have no lr
    records = [{k: v for k, v in r.items() if k != "lr"} for r in metrics_records(RUN_METRICS)]
    html = training_charts(_groups(records))
    text = page_text(html)
    assert "No learning rate was logged: the records hold no lr field." in text
    assert "the trainer records peak_mem_gib" in text and "only when it trains on a GPU" in text
    assert "No evaluation yet: the evaluate task writes eval/metrics.json after training." in text
    assert list(svgs(html)) == [
        "Training loss by step",
        "Training loss by step (log)",
        "Tokens per second by step",
        "Tokens per second by step (log)",
    ]


def test_unreadable_metrics_and_an_unusable_evaluation_do_not_break_the_page():
    assert "No loss curve: the parts are 40 MB." in page_text(
        training_charts({}, metrics_read=False, metrics_problem="the parts are 40 MB")
    )
    assert "No loss values have been logged yet." in page_text(training_charts({}))
    records = metrics_records(RUN_METRICS)
    for evaluation in (None, {}, {"candidate": None}, {"candidate": {"eval_loss": None}}, [1], "text"):
        assert eval_points(records, evaluation) == []  # type: ignore[arg-type]
    assert eval_points([], EVALUATION) == []  # no step to put it at
    for evaluation in (EVALUATION, {"baseline": None}, {"baseline": {"eval_loss": "2"}}):
        assert baseline_point(records, evaluation) == []
    assert baseline_point(records, {"baseline": {"eval_loss": 3}}) == [(10, 3.0)]
    assert eval_points(records, {"candidate": {"eval_loss": float("nan")}}) == []


def test_markers_start_at_each_later_attempts_first_step():
    records = metrics_records(RUN_METRICS)
    assert [(m.x, m.label) for m in attempt_markers(_groups(records))] == [(6, "attempt 2")]
    outcomes = {1: "preempted", 2: "succeeded"}
    assert [m.label for m in attempt_markers(_groups(records), outcomes)] == ["attempt 2 (after preempted)"]
    assert attempt_markers(_groups([r for r in records if r["attempt"] == 1])) == []
