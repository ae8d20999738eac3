"""bench/checkpoint_auto.py: its figures from metrics records and log lines made up by hand, and
its ``--smoke`` run, which trains with the real trainer (tiny preset) on moto S3 and prints them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "checkpoint_auto.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_checkpoint_auto", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = load_bench()


def records(saves: dict[int, tuple[float, float, int | None]], steps: int = 40) -> list[dict]:
    """A metrics record a second from step 1, those of ``saves`` with (blocked, waited, every)."""
    out = []
    for step in range(1, steps + 1):
        record: dict = {"step": step, "time": 1000.0 + step}
        if step in saves:
            blocked, waited, every = saves[step]
            record |= {"checkpoint_blocked_s": blocked, "checkpoint_waited_s": waited}
            if every is not None:
                record["checkpoint_every_steps"] = every
        out.append(record)
    return out


LOG = "".join(
    f"[trainer] checkpoint: step {step} staged in 0.10s (loop blocked), after waiting 0.00s for the "
    f"previous save; committed in {commit}s\n"
    for step, commit in ((10, 9.0), (20, 8.0), (30, 6.0), (40, 4.0))
)


def test_saves_pair_each_record_with_its_commit_from_the_log():
    saves = bench.saves_of(records({10: (0.5, 0.0, None), 20: (0.5, 0.0, 10), 30: (0.2, 0.0, 10)}), LOG)
    assert [(s.step, s.commit_s, s.every_steps) for s in saves] == [
        (10, 9.0, None),
        (20, 8.0, 10),
        (30, 6.0, 10),
    ]


def test_figures_leave_the_measuring_saves_out_and_count_commit_time_in_lost_work():
    saved = {10: (3.0, 2.0, None), 20: (2.0, 1.0, 10), 30: (0.5, 0.0, 10), 40: (0.25, 0.25, 10)}
    recs = records(saved)
    out = bench.figures("auto", recs, bench.saves_of(recs, LOG), skip=2)
    assert out["auto_step_s"] == 1.0  # a record a second
    assert out["auto_saves_counted"] == 2
    assert out["auto_stall_steps_max"] == 0.5 and out["auto_stall_steps_mean"] == 0.375
    assert out["auto_waited_saves"] == 1  # step 40's; steps 10 and 20 are left out
    # step 30's save: 10 s since step 20's, plus its own 6 s to commit; step 40's: 10 + 4
    assert out["auto_lost_intervals_max"] == 1.6 and out["auto_lost_s_max"] == 16.0


def test_no_counted_save_is_an_error_not_a_figure():
    recs = records({10: (0.5, 0.0, None), 20: (0.5, 0.0, 10)})
    with pytest.raises(RuntimeError, match="no save after the first 2"):
        bench.figures("auto", recs, bench.saves_of(recs, LOG), skip=2)


@pytest.mark.slow
def test_smoke_trains_both_cadences_on_moto_and_prints_every_figure():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert figures["assumed_preset"] == "tiny"
    for name in ("auto_stall_steps_max", "auto_lost_intervals_max", "every4_stall_steps_mean"):
        assert float(figures[name]) >= 0, name
    assert int(figures["auto_interval_steps"]) >= 1
    assert float(figures["stall_ratio_auto_vs_every4"]) >= 0
    assert "checkpoint: every " in proc.stderr  # the trainer's own choice, passed on
