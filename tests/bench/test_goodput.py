"""bench/goodput.py: its projection against figures computed by hand, and its ``--smoke`` run,
which measures the components with the real trainer (tiny preset) and prints every figure."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "goodput.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_goodput", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


goodput = load_bench()
# round figures: a 1 s step, 2 s of save blocking, 10 s uploads, 5 s restores, 60 s relaunches
COMPONENTS = {"step_s": 1.0, "save_blocking_s": 2.0, "upload_s": 10.0, "emergency_save_s": 10.0}
COMPONENTS |= {"restore_s": 5.0, "relaunch_s": 60.0}


def test_one_preemption_an_hour_without_notice_as_computed_by_hand():
    out = goodput.project(COMPONENTS, 3600.0, 24.0, notice=False)
    assert out["young_daly_interval_s"] == pytest.approx(math.sqrt(2 * 2 * 3600))  # 120 s
    assert out["interval_s"] == 120 and out["every_steps"] == 120
    assert out["lost_progress_s"] == pytest.approx(60 + 10)  # half an interval and one upload
    assert out["per_preemption_s"] == pytest.approx(60 + 5 + 70)
    # 24 preemptions and the first launch, then 2 s of blocking per 120 s trained
    assert out["goodput"] == pytest.approx((86400 - 60 - 24 * 135) / (1 + 2 / 120) / 86400)


def test_the_notice_loses_no_progress_and_pays_one_synchronous_save():
    out = goodput.project(COMPONENTS, 3 * 3600.0, 24.0, notice=True)
    assert out["lost_progress_s"] == 0
    assert out["per_preemption_s"] == pytest.approx(60 + 5 + 10)
    assert out["preemptions"] == pytest.approx(8)
    assert out["goodput"] > goodput.project(COMPONENTS, 3 * 3600.0, 24.0, notice=False)["goodput"]


def test_the_interval_is_never_shorter_than_an_upload():
    slow = {**COMPONENTS, "save_blocking_s": 0.01, "upload_s": 30.0}
    assert goodput.project(slow, 3600.0, 24.0, notice=False)["interval_s"] == 30


def test_the_relaunch_budget_is_the_relaunch_that_gives_the_goal_exactly():
    budget = goodput.relaunch_budget(COMPONENTS, 3600.0, 24.0, 0.95)
    at_budget = goodput.project({**COMPONENTS, "relaunch_s": budget}, 3600.0, 24.0, notice=False)
    assert at_budget["goodput"] == pytest.approx(0.95)


def test_the_1b_step_time_is_its_flops_at_the_assumed_mfu():
    # 6 N + 12 L d T FLOPs a token, 2M tokens a step, 64 H100 at 989 TFLOP/s x 0.4
    assert goodput.step_1b_s(goodput.Assumptions()) == pytest.approx(0.6, abs=0.02)


@pytest.mark.slow
def test_smoke_measures_with_the_trainer_and_prints_both_goodputs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    for name in ("goodput_1ph", "goodput_3ph", "goodput_1ph_notice", "goodput_3ph_notice"):
        assert 0 <= float(figures[name]) <= 1, name
    assert figures["measured_preset"] == "tiny"
    assert float(figures["measured_restore_s"]) > 0  # attempt 2's record has restore_s
    assert float(figures["measured_checkpoint_bytes"]) > 0
    assert "interval_s_1ph" in figures and "assumed_mfu" in figures
