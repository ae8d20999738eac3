"""Rank 0's record of the steps read together (``trainer.runtime.step_log``): one pace for them
all with the time saves held the loop left out, MFU against every device's peak, and the
progress line of the last one when asked."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from tests.trainer.helpers import metrics_of
from trainer.contract import RunLayout
from trainer.runtime.heartbeat import NoHeartbeat
from trainer.runtime.metrics import MetricsLog
from trainer.runtime.step_log import log_steps
from trainer.runtime.training import StepResult
from trainer.storage import open_storage

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def logging_training(run_dir, flush_every: int, device_peak: float | None = None) -> SimpleNamespace:
    """What :func:`log_steps` reads of a ``Training``: micro batch 4 x seq_len 16, two ranks."""
    run_uri = run_dir.as_uri()
    return SimpleNamespace(
        config=SimpleNamespace(train=SimpleNamespace(seq_len=16, max_steps=10)),
        global_batch=4,
        env=SimpleNamespace(world_size=2, device=DEVICE),
        device_peak=device_peak,
        flops_per_token=1e6,
        metrics=MetricsLog(open_storage(run_uri), RunLayout(run_uri).metrics, 1, flush_every),
        pulse=NoHeartbeat(),
    )


def step(number: int, started: float, **extra: float) -> StepResult:
    return StepResult(number, torch.tensor(0.0), 1e-3, 0.0, 0.0, started, time.time(), extra=dict(extra))


def test_the_steps_read_together_share_one_pace_with_the_time_saves_held_the_loop_left_out(tmp_path):
    tr = logging_training(tmp_path / "run", flush_every=3)
    now = time.monotonic()
    steps = [step(1, now - 2.0), step(2, now - 1.5, checkpoint_blocked_s=1.0), step(3, now - 0.5)]
    log_steps(tr, tr.metrics, steps, [2.5, 2.25, 2.0], now - 2.0, 0, False)
    records = metrics_of(tmp_path / "run")
    assert sorted(records) == [1, 2, 3] and tr.metrics.parts_written == 1  # one part for the read
    assert [records[s]["loss"] for s in (1, 2, 3)] == [2.5, 2.25, 2.0]
    pace = {r["tokens_per_s"] for r in records.values()}
    assert len(pace) == 1
    # 3 steps x 4 samples x 16 tokens in the 2 s since the first began, less the 1 s a save held
    assert 192 / 1.5 < pace.pop() <= 192
    assert records[2]["checkpoint_blocked_s"] == 1.0 and "checkpoint_blocked_s" not in records[1]
    assert "mfu" not in records[1]  # no peak known


def test_the_progress_line_of_the_last_step_is_printed_only_when_asked(tmp_path, capsys):
    tr = logging_training(tmp_path / "run", flush_every=1, device_peak=1e12)
    now = time.monotonic()
    log_steps(tr, tr.metrics, [step(4, now - 1.0)], [2.0], now - 4.0, 3, False)
    assert capsys.readouterr().out == ""
    log_steps(tr, tr.metrics, [step(5, now - 1.0), step(6, now - 0.5)], [1.5, 1.75], now - 4.0, 3, True)
    out = capsys.readouterr().out
    assert out.startswith("step 6/10 loss 1.750 lr 1.0e-03 tok/s ") and " mfu " in out
    assert out.count("\n") == 1
    record = metrics_of(tmp_path / "run")[6]
    assert record["mfu"] == pytest.approx(record["tokens_per_s"] * 1e6 / 2e12)  # both devices' peak
