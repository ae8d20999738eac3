"""Plain parts of the loop: LR schedule, progress line, metrics file, attempt bookkeeping."""

import json

import pytest
import torch

from trainer.attempts import (
    NETWORK_HINT,
    NON_FINITE_HINT,
    OOM_HINT,
    NonFiniteLoss,
    attempt_number,
    classify_failure,
    failure_hint,
    next_attempt_number,
)
from trainer.contract import RunLayout, metrics_by_step, metrics_records
from trainer.metrics import MetricsLog
from trainer.optim import lr_multiplier
from trainer.preemption import stop_decision
from trainer.progress import format_duration, progress_line
from trainer.storage import open_storage


def test_lr_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    kw = {"warmup_steps": 4, "max_steps": 14, "min_lr_ratio": 0.1}
    assert [lr_multiplier(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_multiplier(4, **kw) == 1.0
    assert lr_multiplier(9, **kw) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_multiplier(14, **kw) == pytest.approx(0.1)
    assert lr_multiplier(20, **kw) == pytest.approx(0.1)
    assert lr_multiplier(0, warmup_steps=0, max_steps=10, min_lr_ratio=0.0) == 1.0


def test_progress_line_format():
    line = progress_line(40, 100, 2.3141, 2.1e-3, 12345.4, 12.2, 40)
    assert line == "step 40/100 loss 2.314 lr 2.1e-03 tok/s 12,345 elapsed 12s eta 18s"
    # a resumed attempt extrapolates from its own steps only
    assert progress_line(90, 100, 1.0, 1e-4, 10, 20, 10).endswith("elapsed 20s eta 20s")
    assert [format_duration(s) for s in (0, 59.6, 61, 3725)] == ["0s", "1m00s", "1m01s", "1h02m"]


def test_metrics_keep_earlier_attempts_and_readers_take_the_last(tmp_path):
    uri = (tmp_path / "metrics.jsonl").as_uri()
    storage = open_storage(uri)
    first = MetricsLog(storage, uri, attempt=1, flush_every=2)
    for step in (1, 2, 3):
        first.add(step=step, loss=5.0 - step, lr=1e-3, tokens_per_s=10.0, time=0.0)
    assert [r["step"] for r in metrics_records((tmp_path / "metrics.jsonl").read_text())] == [
        1,
        2,
    ]  # step 3 not flushed
    first.flush()
    second = MetricsLog(storage, uri, attempt=2, flush_every=1)  # resumed from step 2
    second.add(step=3, loss=0.5, lr=1e-3, tokens_per_s=10.0, time=0.0)
    records = metrics_records(
        (tmp_path / "metrics.jsonl").read_text() + '{"step": 9, "lo'
    )  # a torn tail is skipped
    assert [(r["step"], r["attempt"]) for r in records] == [(1, 1), (2, 1), (3, 1), (3, 2)]
    by_step = metrics_by_step(records)
    assert (by_step[3]["attempt"], by_step[3]["loss"], by_step[2]["attempt"]) == (2, 0.5, 1)
    assert set(json.loads(json.dumps(records[0]))) == {
        "step",
        "loss",
        "lr",
        "tokens_per_s",
        "attempt",
        "time",
    }


def test_attempt_number_from_env_or_next_free(tmp_path, monkeypatch):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = open_storage(layout.run_uri)
    assert next_attempt_number([]) == 1
    assert (
        next_attempt_number(
            ["file:///r/attempts/1.json", "file:///r/attempts/12.json", "file:///r/attempts/x.json"]
        )
        == 13
    )
    monkeypatch.delenv("TRAINOPS_ATTEMPT", raising=False)
    storage.put_json(layout.attempt(2), {})
    assert attempt_number(storage, layout) == 3
    monkeypatch.setenv("TRAINOPS_ATTEMPT", "7")
    assert attempt_number(storage, layout) == 7
    monkeypatch.setenv("TRAINOPS_ATTEMPT", "zero")
    with pytest.raises(ValueError, match="TRAINOPS_ATTEMPT='zero' is not a positive integer"):
        attempt_number(storage, layout)


def test_failure_hints():
    assert failure_hint(NonFiniteLoss(12, float("nan"))) == f"loss became nan at step 12: {NON_FINITE_HINT}"
    assert (
        NON_FINITE_HINT
        == "lower train.lr (e.g. halve it) or scale it linearly with the global batch (linear scaling rule)"
    )
    assert (
        failure_hint(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        == f"out of memory: {OOM_HINT}"
    )
    assert (
        OOM_HINT
        == "reduce train.micro_batch_size (keep train.global_batch_size) or set train.activation_checkpointing=full"
    )
    assert "NCCL_SOCKET_IFNAME" in NETWORK_HINT and "firewall" in NETWORK_HINT
    assert failure_hint(KeyError("x")) is None


@pytest.mark.parametrize(
    "exc, kind",
    [
        (NonFiniteLoss(3, float("inf")), "non_finite_loss"),
        (
            torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                "79.15 GiB of which 1.19 GiB is free."
            ),
            "out_of_memory",
        ),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
                "tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"
            ),
            "out_of_memory",
        ),
        (MemoryError(), "out_of_memory"),
        (
            torch.distributed.DistBackendError(
                "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there "
                "was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error "
                "or a remote process exiting prematurely."
            ),
            "network",
        ),
        (
            torch.distributed.DistBackendError(
                "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=2, "
                "NumelOut=2, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
            ),
            "network",
        ),
        (torch.distributed.DistNetworkError("Connection reset by peer"), "network"),
        (
            RuntimeError(
                "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                "[10.0.0.2]:3456"
            ),
            "network",
        ),
        (
            RuntimeError(
                "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms "
                "for recv operation to complete"
            ),
            "network",
        ),
        # a storage timeout is not a collective's, and an unknown bug gets no made-up hint
        (
            RuntimeError('Read timeout on endpoint URL: "http://minio:9000/bucket/runs/r1/metrics.jsonl"'),
            "error",
        ),
        (ValueError("shapes (4, 8) and (4, 9) do not match"), "error"),
    ],
)
def test_failures_are_classified_from_their_type_and_message(exc, kind):
    got, hint = classify_failure(exc)
    assert got == kind
    expected = {"non_finite_loss": NON_FINITE_HINT, "out_of_memory": OOM_HINT, "network": NETWORK_HINT}.get(
        kind
    )
    assert (hint is None) if expected is None else hint.endswith(expected)


def test_any_rank_signal_stops_all():
    assert stop_decision(0.0, None) == (False, None)
    assert stop_decision(1.0, None) == (True, "SIGTERM")  # this rank saw nothing; a peer did
    assert stop_decision(2.0, "SIGINT") == (True, "SIGINT")
