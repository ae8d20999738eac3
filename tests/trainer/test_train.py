"""``trainer train``: setup, one step and the loop in this process (a world of one), then the whole
trainer under torchrun: 2 CPU ranks, uninterrupted, preempted (SIGTERM) and killed (SIGKILL)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.checkpoint.test_save import HeldSaves
from tests.trainer.helpers import (
    GLOBAL_BATCH,
    INSTRUMENTED,
    REPO,
    committed_steps,
    metrics_of,
    read_json,
    run_config,
    single_process_argv,
    torchrun_argv,
    trainer_env,
)
from trainer.config import ConfigError, load_config
from trainer.contract import RunLayout, attempt_record_in_log
from trainer.runtime.attempts import NODE_HINT, NON_FINITE_HINT, STORAGE_HINT, Attempt, now_iso
from trainer.runtime.preemption import StopFlag
from trainer.storage import open_storage
from trainer.train import setup, train_loop, train_step

MAX_STEPS = 40


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def children_of(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(status.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, proc: subprocess.Popen | None, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, (
            f"trainer exited early ({proc.returncode}):\n{log.read_text()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"timed out waiting:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)


def launch(config: Path, tmp: Path, attempt: int, log_name: str, **popen) -> tuple[subprocess.Popen, Path]:
    log = tmp / log_name
    with open(log, "w") as out:
        proc = subprocess.Popen(
            torchrun_argv(config),
            env=trainer_env(tmp / "cache", attempt),
            stdout=out,
            stderr=subprocess.STDOUT,
            **popen,
        )
    return proc, log


def relaunch_to_completion(config: Path, tmp: Path, attempt: int) -> str:
    proc = subprocess.run(
        torchrun_argv(config),
        env=trainer_env(tmp / "cache", attempt),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# --- in this process: setup, one step, the loop ------------------------------------------------
def start(tmp_path, dataset_uri, env, attempt_number, *overrides):
    """``setup`` for a small fp32 run (2 accumulation steps of 2 samples) in a world of one."""
    run_uri = (tmp_path / "run").as_uri()
    config = load_config(
        None,
        [
            f"run_uri={run_uri}",
            f"data_uri={dataset_uri}",
            "precision=fp32",
            "train.max_steps=3",
            "train.micro_batch_size=2",
            "train.global_batch_size=4",
            "train.seq_len=16",
            "train.warmup_steps=1",
            "checkpoint.every_steps=2",
            "metrics.flush_every=1",
            *overrides,
        ],
    )
    layout = RunLayout(run_uri)
    attempt = Attempt(open_storage(run_uri), layout, attempt_number, env.world_size, started_at=now_iso())
    return setup(config, env, attempt), attempt


@pytest.mark.slow
def test_train_step_does_one_optimizer_step_and_counts_the_stop_votes(world_of_one, tmp_path, dataset_uri):
    training, attempt = start(tmp_path, dataset_uri, world_of_one, 1)
    assert (training.accum, training.global_batch, training.state.step, training.state.cursor) == (2, 4, 0, 0)
    flag = StopFlag()  # not installed: the test sets it as its handler would
    first = train_step(training, flag)
    assert (training.state.step, training.state.cursor, attempt.last_step, first.step) == (1, 4, 1, 1)
    assert first.stop_votes == 0.0 and first.lr == pytest.approx(3e-3)
    assert first.loss.shape == () and math.isfinite(first.loss.item())  # on the device until read
    flag.signal_name = "SIGTERM"  # before the step: its votes count it
    second = train_step(training, flag)
    assert (second.stop_votes, training.state.cursor) == (1.0, 8)
    assert second.loss.item() != first.loss.item()  # other samples, updated weights


def events_of(training) -> list:
    """Record each micro-batch read ``(cursor, micro)`` and each optimizer step ``"step"``, in order."""
    events: list = []
    read = training.batches.micro_batch

    def micro_batch(cursor, micro):
        events.append((cursor, micro))
        return read(cursor, micro)

    training.batches.micro_batch = micro_batch
    training.optimizer.register_step_pre_hook(lambda *_: events.append("step"))
    return events


@pytest.mark.slow
def test_the_next_steps_first_micro_batch_is_read_while_the_step_computes_and_never_after_the_last(
    world_of_one, tmp_path, dataset_uri
):
    training, _ = start(tmp_path, dataset_uri, world_of_one, 1)
    events = events_of(training)
    assert train_loop(training, StopFlag()) == "completed"
    # each micro-batch is read once, in cursor order; the next step's first before this step's
    # optimizer step (its copy to a GPU then runs while the backward still computes)
    assert events == [(0, 0), (0, 1), (4, 0), "step", (4, 1), (8, 0), "step", (8, 1), "step"]


@pytest.mark.slow
def test_losses_are_read_every_log_every_steps_before_a_checkpoint_and_at_the_end(
    world_of_one, tmp_path, dataset_uri, monkeypatch
):
    from trainer.runtime import rollback

    reads: list[list[int]] = []
    read = rollback.read_losses  # looked up there, by read_step_losses

    def counted(losses, *args):
        reads.append([training.state.step - len(losses) + 1 + i for i in range(len(losses))])
        return read(losses, *args)

    monkeypatch.setattr(rollback, "read_losses", counted)
    training, _ = start(
        tmp_path,
        dataset_uri,
        world_of_one,
        1,
        "train.max_steps=8",
        "train.log_every=3",
        "checkpoint.every_steps=4",
    )
    assert train_loop(training, StopFlag()) == "completed"
    assert reads == [[1, 2, 3], [4], [5, 6], [7, 8]]  # log_every 3, the step-4 save, 6, the last
    metrics = metrics_of(tmp_path / "run")
    assert sorted(metrics) == list(range(1, 9)) and all(math.isfinite(r["loss"]) for r in metrics.values())
    assert len({metrics[s]["tokens_per_s"] for s in (1, 2, 3)}) == 1  # over the steps read together
    assert metrics[1]["time"] < metrics[2]["time"] < metrics[3]["time"]  # each step's own


@pytest.mark.slow
def test_a_signal_during_a_step_stops_every_rank_after_the_next_with_its_checkpoint(
    world_of_one, tmp_path, dataset_uri
):
    run = tmp_path / "run"
    training, _ = start(
        tmp_path, dataset_uri, world_of_one, 1, "train.max_steps=10", "checkpoint.every_steps=5"
    )
    flag, events = StopFlag(), events_of(training)
    read = training.batches.micro_batch

    def signalled_in_step_2(cursor, micro):
        if (cursor, micro) == (4, 1):  # inside step 2, after its vote started
            flag.signal_name, flag.at = "SIGTERM", time.monotonic()
        return read(cursor, micro)

    training.batches.micro_batch = signalled_in_step_2
    assert train_loop(training, flag) == "preempted"
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"], record["checkpoint_step"]) == ("preempted", 3, 3)
    assert committed_steps(run) == [3] and sorted(metrics_of(run)) == [1, 2, 3]
    assert events[-2:] == [(8, 1), "step"]  # step 3 was the last: nothing of step 4 was read


class StopAtStep(StopFlag):
    """Signalled as step ``step`` begins (the flag is read once per step, as it begins)."""

    def __init__(self, step: int):
        super().__init__()
        self.reads, self.step = 0, step

    @property
    def is_set(self) -> bool:
        self.reads += 1
        if self.reads >= self.step and self.signal_name is None:
            self.signal_name, self.at = "SIGTERM", time.monotonic()
        return self.signal_name is not None


@pytest.mark.slow
def test_a_bad_loss_read_as_the_ranks_stop_is_not_saved_nor_rolled_back(world_of_one, tmp_path, dataset_uri):
    """SIGTERM as step 2 begins, and the read of the stop finds step 2's gradients NaN (step 1's
    update left huge weights): there is no time for a rollback in a notice window, and the
    weights are bad, so the attempt ends preempted with nothing saved; its record points at the
    newest checkpoint (step 1) for the relaunch, which replays from there."""
    training, _ = start(
        tmp_path,
        dataset_uri,
        world_of_one,
        1,
        "train.max_steps=8",
        "train.log_every=100",
        "checkpoint.every_steps=1",
        "train.lr=1e30",
        "train.warmup_steps=0",
        "train.grad_clip=1e30",
    )
    assert train_loop(training, StopAtStep(2)) == "preempted"
    record = read_json(tmp_path / "run" / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"], record["checkpoint_step"], record["steps_lost"]) == (
        "preempted",
        2,
        1,
        1,
    )
    assert "rollbacks" not in record and committed_steps(tmp_path / "run") == [1]


@pytest.mark.slow
def test_a_checkpoint_steps_record_says_how_long_its_save_held_the_loop_the_wait_included(
    world_of_one, tmp_path, dataset_uri
):
    training, _ = start(tmp_path, dataset_uri, world_of_one, 1, "train.max_steps=5")
    HeldSaves(training.checkpointer)  # storage slower than every_steps=2: step 4 waits for step 2
    assert train_loop(training, StopFlag()) == "completed"
    metrics = metrics_of(tmp_path / "run")
    assert sorted(metrics) == [1, 2, 3, 4, 5]
    for step in (1, 3, 5):  # no async save (5 is the final, synchronous one)
        assert "checkpoint_blocked_s" not in metrics[step] and "checkpoint_waited_s" not in metrics[step]
    assert metrics[2]["checkpoint_waited_s"] == 0.0 < metrics[2]["checkpoint_blocked_s"]
    assert 0.0 < metrics[4]["checkpoint_waited_s"] < metrics[4]["checkpoint_blocked_s"]
    assert committed_steps(tmp_path / "run") == [4, 5]  # checkpoint.keep=2


def test_setup_builds_the_preset_sharded_from_the_seed_and_refuses_a_replicate_that_cannot_divide(
    world_of_one, tmp_path, dataset_uri
):
    training, _ = start(tmp_path, dataset_uri, world_of_one, 1, "seed=3")
    weights = {n: p.full_tensor() for n, p in training.model.named_parameters()}
    assert not any(w.is_meta for w in weights.values())
    again, _ = start(tmp_path / "again", dataset_uri, world_of_one, 1, "seed=3")
    assert all(torch.equal(p.full_tensor(), weights[n]) for n, p in again.model.named_parameters())
    other, _ = start(tmp_path / "other", dataset_uri, world_of_one, 1, "seed=4")
    assert not torch.equal(other.model.output.weight.full_tensor(), weights["output.weight"])

    with pytest.raises(ConfigError, match=r"parallel.replicate=2 does not divide the world size 1"):
        start(tmp_path / "bad", dataset_uri, world_of_one, 1, "parallel.replicate=2")
    assert not (tmp_path / "bad" / "run").exists()  # before the fence, the data, the checkpointer


# --- under torchrun ------------------------------------------------------------------------------
@pytest.mark.slow
def test_uninterrupted_run(reference_run):
    run = reference_run["run_dir"]
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"], record["checkpoint_step"], record["steps_lost"]) == (
        "completed",
        MAX_STEPS,
        MAX_STEPS,
        0,
    )
    assert (record["world_size"], record["resumed_from_step"]) == (2, None)

    metrics = metrics_of(run)
    assert sorted(metrics) == list(range(1, MAX_STEPS + 1))
    assert metrics[MAX_STEPS]["loss"] < metrics[1]["loss"] - 2.0  # it learned the templates
    assert re.search(
        r"^step 40/40 loss \d+\.\d{3} lr \d\.\de-\d\d tok/s [\d,]+ elapsed \d+s eta 0s$",
        reference_run["stdout"],
        re.M,
    )

    assert (
        "batch: 16 samples per step = micro batch 4 x 2 accumulation steps x 2 ranks"
        in reference_run["stdout"]
    )
    # regular checkpoints are written in the background; the log says what the loop waited for
    for step in (10, 20, 30):
        assert re.search(
            rf"^\[trainer\] checkpoint: step {step} staged in \d+\.\d\ds \(loop blocked\), after "
            rf"waiting \d+\.\d\ds for the previous save; committed in \d+\.\ds$",
            reference_run["stdout"],
            re.M,
        ), step
        # and its metrics record says how long it held the loop (the wait for the previous save included)
        assert metrics[step]["checkpoint_blocked_s"] >= metrics[step]["checkpoint_waited_s"] >= 0.0
    assert committed_steps(run) == [30, 40]  # checkpoint.keep=2
    assert read_json(run / "checkpoints" / "latest.json")["step"] == MAX_STEPS
    info = read_json(run / "export" / "export.json")
    assert (info["step"], info["param_count"], info["precision"]) == (MAX_STEPS, 139_712, "bf16")
    assert read_json(run / "export" / "model_config.json")["vocab_size"] == 257
    assert (run / "export" / "model.safetensors").stat().st_size > 139_712 * 2  # bf16 (export.dtype)


@pytest.mark.slow
def test_sigterm_saves_then_relaunch_ends_identical(tmp_path, dataset_uri, reference_run):
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run = tmp_path / "run"
    proc, log = launch(config, tmp_path, 1, "attempt1.log")
    try:
        wait_until(lambda: max(metrics_of(run), default=0) >= 13, proc, log)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    first = read_json(run / "attempts" / "1.json")
    assert (first["outcome"], first["signal"], first["steps_lost"]) == ("preempted", "SIGTERM", 0), (
        log.read_text()[-2000:]
    )
    assert first["checkpoint_step"] == first["last_step"]
    assert 13 <= first["last_step"] < MAX_STEPS
    assert first["last_step"] in committed_steps(run)

    relaunch_to_completion(config, tmp_path, attempt=2)
    second = read_json(run / "attempts" / "2.json")
    assert (second["outcome"], second["resumed_from_step"], second["last_step"]) == (
        "completed",
        first["last_step"],
        MAX_STEPS,
    )
    assert (run / "export" / "model.safetensors").read_bytes() == (
        reference_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()
    metrics = metrics_of(run)
    assert sorted(metrics) == list(range(1, MAX_STEPS + 1))
    assert {metrics[s]["attempt"] for s in range(first["last_step"] + 1, MAX_STEPS + 1)} == {2}


@pytest.mark.slow
def test_sigkill_relaunch_resumes_from_last_commit_and_ends_identical(tmp_path, dataset_uri, reference_run):
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run = tmp_path / "run"
    proc, log = launch(config, tmp_path, 1, "attempt1.log", start_new_session=True)
    try:
        wait_until(lambda: bool(committed_steps(run)) and max(metrics_of(run), default=0) >= 23, proc, log)
        workers = children_of(proc.pid)
        assert len(workers) == 2
        # torchrun's group only: its workers sit in sessions of their own and must die with it.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_until(lambda: not any(alive(w) for w in workers), proc=None, log=log, timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (run / "attempts" / "1.json").exists()
    newest_commit = committed_steps(run)[-1]
    assert newest_commit < MAX_STEPS

    relaunch_to_completion(config, tmp_path, attempt=2)
    second = read_json(run / "attempts" / "2.json")
    assert (second["outcome"], second["resumed_from_step"]) == ("completed", newest_commit)
    assert (run / "export" / "model.safetensors").read_bytes() == (
        reference_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()


@pytest.mark.slow
def test_a_non_finite_loss_no_rollback_cures_fails_with_a_hint_and_keeps_the_last_checkpoint(
    tmp_path, dataset_uri
):
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run = tmp_path / "run"
    # A single process (no torchrun); an absurd LR blows the weights up after the first step.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(config),
            "train.lr=1e30",
            "train.warmup_steps=0",
            "train.grad_clip=1e30",
            "checkpoint.every_steps=1",
        ],
        env=trainer_env(tmp_path / "cache", attempt=1),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 1
    record = read_json(run / "attempts" / "1.json")
    step = record["last_step"]
    assert record["outcome"] == "failed" and record["error"].startswith("NonFiniteLoss")
    # step 1's update leaves huge weights: the gradients after it are NaN while the loss is not
    assert re.fullmatch(
        rf"gradients became non-finite \(loss [\d.]+\) at step {step}: {re.escape(NON_FINITE_HINT)}",
        record["hint"],
    )
    # The weights diverged at once, before the newest checkpoint was saved: the rollback to it
    # met NaN gradients again at the very next step, so the attempt failed then, naming the
    # rollback, rather than spending its budget on the same checkpoint.
    committed = committed_steps(run)[-1]
    assert record["checkpoint_step"] == committed
    assert [
        (r["at_step"], r["to_step"], r["skipped_from"], r["skipped_to"]) for r in record["rollbacks"]
    ] == [(committed + 1, committed, committed + 1, committed + 1)]
    assert (
        "that checkpoint's weights are already bad" in record["error"]
        and "after 1 rollback(s)" in record["error"]
    )
    assert proc.stderr.strip().splitlines()[-1] == f"trainer: failed at step {step}: {record['hint']}"


@pytest.mark.slow
@pytest.mark.skipif(torch_cuda_available(), reason="needs a host without CUDA")
def test_gpus_the_node_was_given_but_cannot_see_fail_the_attempt_before_training(tmp_path, dataset_uri):
    """The launcher gave the node a GPU per rank (TRAINOPS_GPUS_PER_NODE, as the operator sets
    it), but this host has none: both ranks fail before any process group, the record names
    what was expected and seen, and its cause is the node's (the operator relaunches it as
    infra: tests/trainops/recovery/test_classify.py). Before, it trained on the CPU without a word."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run = tmp_path / "run"
    env = {**trainer_env(tmp_path / "cache", attempt=1), "TRAINOPS_GPUS_PER_NODE": "1"}
    env["CUDA_VISIBLE_DEVICES"] = "0"
    proc = subprocess.run(
        torchrun_argv(config), env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["cause"], record["hint"]) == ("failed", "node", NODE_HINT)
    assert (record["last_step"], record["checkpoint_step"], record["world_size"]) == (0, None, 2)
    assert record["error"] == (
        "GPUsMissing: TRAINOPS_GPUS_PER_NODE=1: this node's 2 rank(s) need 2 GPU(s), but this process sees "
        "no CUDA device (torch.cuda.is_available() is False), with CUDA_VISIBLE_DEVICES='0'; refusing to "
        "train on the CPU instead"
    )
    assert f"trainer: failed at step 0: {NODE_HINT}" in proc.stderr
    # nothing but the record in storage (file://'s lock beside a conditional write is its own)
    assert open_storage(run.as_uri()).list(run.as_uri()) == [(run / "attempts" / "1.json").as_uri()]


@pytest.mark.slow
@pytest.mark.gpu
def test_single_process_bf16_training_on_cuda(tmp_path, dataset_uri):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    config, _ = run_config(tmp_path, dataset_uri, "run", precision="bf16")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "--config", str(config), "train.max_steps=20"],
        env=trainer_env(tmp_path / "cache", attempt=1),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = metrics_of(tmp_path / "run")
    assert read_json(tmp_path / "run" / "attempts" / "1.json")["outcome"] == "completed"
    assert metrics[20]["loss"] < metrics[1]["loss"] - 1.0


@pytest.mark.slow
def test_compiled_checkpointed_unsynced_run_follows_the_reference(tmp_path, dataset_uri, reference_run):
    # One process with every step option on: torch.compile per block (the slow part: inductor
    # builds C++ kernels), selective activation checkpointing, and gradient sync only on the
    # last of 4 micro-steps. Same global batch as the 2-rank reference, so the same losses.
    config, _ = run_config(tmp_path, dataset_uri, "run")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(config),
            "train.max_steps=3",
            "train.compile=true",
            "train.activation_checkpointing=selective",
            "train.skip_grad_sync_in_accum=true",
            "checkpoint.every_steps=2",
        ],
        env=trainer_env(tmp_path / "cache", attempt=1),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "batch: 16 samples per step = micro batch 4 x 4 accumulation steps x 1 ranks" in proc.stdout
    assert (
        "step options: activation checkpointing selective (blocks 1 of 2), torch.compile per block, "
        "gradient sync on the last micro-step only"
    ) in proc.stdout
    reference, run = metrics_of(reference_run["run_dir"]), metrics_of(tmp_path / "run")
    assert sorted(run) == [1, 2, 3]
    for step in (1, 2, 3):  # all in the warmup: the same LRs as the 40-step reference
        assert run[step]["loss"] == pytest.approx(reference[step]["loss"], abs=0.02)
    assert committed_steps(tmp_path / "run") == [2, 3]


@pytest.mark.slow
def test_user_model_from_a_builder_trains_under_torchrun_and_exports(tmp_path, dataset_uri):
    config, _ = run_config(tmp_path, dataset_uri, "run", model={"builder": "examples.custom_model:build"})
    env = trainer_env(tmp_path / "cache", attempt=1)
    proc = subprocess.run(
        torchrun_argv(config, "train.max_steps=6", "checkpoint.every_steps=3", module="trainer"),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "model: builder examples.custom_model:build" in proc.stdout
    run = tmp_path / "run"
    assert read_json(run / "attempts" / "1.json")["outcome"] == "completed"
    assert committed_steps(run) == [3, 6]
    exported = read_json(run / "export" / "export.json")
    assert exported["step"] == 6 and "builder" in json.dumps(exported)
    assert (run / "export" / "model.safetensors").stat().st_size > 0


@pytest.mark.slow
def test_a_storage_outage_fails_the_attempt_as_storage_and_the_relaunch_ends_identical(
    tmp_path, dataset_uri, reference_run
):
    """Storage goes dark as step 25 is read ahead (during step 24), after the step-20 commit, for
    the rest of the attempt: an outage that outlasts the storage client's retries (their
    tolerance is the client's own test; this storage refuses outright,
    tests/trainer/instrumented.py). Training goes on without its metrics, the step-30 save
    fails, and the attempt ends as a storage failure: its record, which storage refuses too, is
    rank 0's marked line. The relaunch resumes bitwise."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run = tmp_path / "run"
    proc = subprocess.run(
        torchrun_argv(config, module=INSTRUMENTED),
        env=trainer_env(tmp_path / "cache", 1, blackout_at=f"{24 * GLOBAL_BATCH}:20"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = attempt_record_in_log(proc.stderr, 1)
    assert record is not None, proc.stderr[-3000:]
    assert (record["outcome"], record["cause"], record["hint"]) == ("failed", "storage", STORAGE_HINT)
    assert (record["last_step"], record["checkpoint_step"], record["steps_lost"]) == (MAX_STEPS, 20, 20)
    # steps 21..40 never reached the file: 21..24 were still unread (log_every=10) when it went dark
    assert record["metrics_unwritten"] == MAX_STEPS - 20
    assert record["error"].startswith("CheckpointError: the checkpoint of step 30 failed in the background")
    assert not (run / "attempts" / "1.json").exists()
    output = proc.stdout + proc.stderr
    assert output.count("metrics: could not write") == 1  # once for the whole outage
    assert "metrics: 20 records of attempt 1 could not be written" in output
    assert sorted(metrics_of(run)) == list(range(1, 21))
    assert committed_steps(run) == [10, 20]  # the last commit is intact

    relaunch_to_completion(config, tmp_path, attempt=2)
    second = read_json(run / "attempts" / "2.json")
    assert (second["outcome"], second["resumed_from_step"], second["last_step"]) == (
        "completed",
        20,
        MAX_STEPS,
    )
    assert (run / "export" / "model.safetensors").read_bytes() == (
        reference_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()


@pytest.mark.slow
def test_when_every_checkpoint_is_corrupt_the_attempt_fails_with_the_reasons_and_never_starts_over(
    tmp_path, dataset_uri, reference_run
):
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run = tmp_path / "run"
    shutil.copytree(reference_run["run_dir"] / "checkpoints", run / "checkpoints")
    shard_40 = run / "checkpoints" / "step_00000040" / "attempt_1" / "__0_0.distcp"
    shard_40.write_bytes(shard_40.read_bytes()[:100])  # truncated
    shard_30 = run / "checkpoints" / "step_00000030" / "attempt_1" / "__1_0.distcp"
    damaged = bytearray(shard_30.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # same size, other bytes: only the checksum sees it
    shard_30.write_bytes(bytes(damaged))
    before = {
        p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file() and p.name != "latest.json"
    }

    proc = subprocess.run(
        single_process_argv(config),
        env=trainer_env(tmp_path / "cache", attempt=2),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = read_json(run / "attempts" / "2.json")
    assert (record["outcome"], record["cause"], record["last_step"], record["resumed_from_step"]) == (
        "failed",
        "program",
        0,
        None,
    )
    error = record["error"]
    assert error.startswith(
        f"NothingToResume: checkpoints were committed under {RunLayout(run.as_uri()).checkpoints} but none can be resumed"
    )
    assert re.search(r"step 40: file __0_0\.distcp has 100 bytes, _COMMITTED says \d+", error)
    assert re.search(
        r"step 30: checkpoint file \S+/step_00000030/attempt_1/__1_0\.distcp has sha256 \w+", error
    )
    assert "refusing to start over from step 0" in error
    assert proc.stderr.strip().splitlines()[-1] == f"trainer: failed at step 0: {error}"
    # no step-0 restart: nothing trained, no checkpoint written or removed
    assert not (run / "metrics").exists() and not (run / "export").exists()
    after = {
        p: p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file() and p.name != "latest.json"
    }
    assert after == before


def resumed_run(tmp_path, dataset_uri, name, source, step, replicate, **extra) -> tuple[Path, str]:
    """A run folder holding ``source``'s checkpoints up to ``step``, relaunched to completion
    with ``parallel.replicate=replicate``; (run folder, stdout)."""
    config, _ = run_config(tmp_path, dataset_uri, name, parallel={"replicate": replicate}, **extra)
    run = tmp_path / name
    shutil.copytree(source / "checkpoints", run / "checkpoints")
    for path in (run / "checkpoints").glob("step_*"):
        if int(path.name[5:]) > step:  # latest.json still names a later step: passed over
            shutil.rmtree(path)
    stdout = relaunch_to_completion(config, tmp_path, attempt=2)
    assert read_json(run / "attempts" / "2.json")["resumed_from_step"] == step
    return run, stdout


@pytest.mark.slow
def test_a_run_resumes_from_flat_fsdp_into_hsdp_and_back(tmp_path, dataset_uri, reference_run):
    # HSDP on the reference's 2 ranks: 2 replicas of 1 rank (parallel.replicate=2). Its steps are
    # not the flat run's bit for bit (the gradient norm sums other partial sums), so as on another
    # world size the trajectories are compared by loss: the flat step-30 checkpoint resumed as
    # HSDP, then that run's own step-35 checkpoint resumed flat. What a checkpoint holds moves
    # between the meshes exactly: the flat step-40 checkpoint re-exported under HSDP is the
    # reference's own export, byte for byte.
    flat_run = reference_run["run_dir"]
    hsdp, hsdp_out = resumed_run(
        tmp_path, dataset_uri, "to_hsdp", flat_run, 30, 2, checkpoint={"every_steps": 5, "keep": 4}
    )
    assert "sharding: HSDP: 2 replicas x 1 ranks sharding each" in hsdp_out
    flat, flat_out = resumed_run(tmp_path, dataset_uri, "to_flat", hsdp, 35, 1)
    assert "FSDP over all 2 ranks" in flat_out
    for run, source, step in ((hsdp, flat_run, 30), (flat, hsdp, 35)):
        resumed, uninterrupted = metrics_of(run), metrics_of(source)
        assert sorted(resumed) == list(range(step + 1, MAX_STEPS + 1))
        for later in (step + 1, MAX_STEPS):
            assert resumed[later]["loss"] == pytest.approx(uninterrupted[later]["loss"], abs=0.02), run.name

    # Nothing left to train: the step-40 checkpoint is only re-exported, under HSDP.
    reexport, _ = resumed_run(tmp_path, dataset_uri, "reexport", flat_run, MAX_STEPS, 2)
    exported = (reexport / "export" / "model.safetensors").read_bytes()
    assert exported == (flat_run / "export" / "model.safetensors").read_bytes()


def poisoned_run(
    tmp_path: Path, dataset_uri: str, nan_at_step: str
) -> tuple[Path, subprocess.CompletedProcess]:
    """The 40-step run under torchrun, reading losses every 5 steps, with step ``nan_at_step``
    poisoned (tests/trainer/instrumented.py); it must complete. Its run folder and process."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    proc = subprocess.run(
        torchrun_argv(config, "train.log_every=5", module=INSTRUMENTED),
        env=trainer_env(tmp_path / "cache", 1, nan_at_step=nan_at_step),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp_path / "run", proc


@pytest.mark.slow
def test_an_injected_nan_rolls_back_to_the_last_checkpoint_skips_the_window_and_completes(
    tmp_path, dataset_uri
):
    """Step 14's loss and gradients are NaN on both ranks (the weights after it too). Read at step
    15, it rolls the gang back to the step-10 checkpoint, skipping steps 11-15; the run completes
    its 40 steps from there with finite losses, and the record says what was skipped."""
    run, proc = poisoned_run(tmp_path, dataset_uri, "14")
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"]) == ("completed", MAX_STEPS)
    [rollback] = record["rollbacks"]
    assert rollback.pop("restore_s") > 0  # the load, timed for the cost accounting's restore
    assert rollback == {
        "at_step": 14,
        "loss": "nan",
        "why": "non-finite loss nan",
        "to_step": 10,
        "skipped_from": 11,
        "skipped_to": 15,
        # the step-10 checkpoint read back from this node's own tier (both ranks' shards and
        # per-rank state, and rank 0's .metadata), none from storage
        "restore_files": {"local": 5, "storage": 0},
    }
    assert (
        "bad loss: non-finite loss nan at step 14: rolled back to step 10, skipping steps 11-15 (rollback 1 of at most 3)"
        in proc.stdout + proc.stderr
    )
    logged = metrics_of(run)
    assert 14 not in logged and all(math.isfinite(logged[s]["loss"]) for s in range(16, MAX_STEPS + 1))
    weights = load_file(run / "export" / "model.safetensors")
    assert weights and all(torch.isfinite(t.float()).all() for t in weights.values())  # the NaN is gone


@pytest.mark.slow
def test_nan_gradients_under_a_finite_loss_at_a_checkpoint_step_are_never_saved(tmp_path, dataset_uri):
    """Step 20's gradients are NaN, its loss is not, and step 20 is a checkpoint step: its update
    leaves NaN weights. The gradient norm is read with the loss, before the save, so step 20 is
    never saved: the gang rolls back to step 10, skips 11-20 and completes. (Read by the loss
    alone, the save of step 20 would hold NaN weights, and the rollback to it would fail.)"""
    run, proc = poisoned_run(tmp_path, dataset_uri, "20:grads")
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"]) == ("completed", MAX_STEPS)
    [rollback] = record["rollbacks"]
    assert (rollback["at_step"], rollback["to_step"], rollback["skipped_from"], rollback["skipped_to"]) == (
        20,
        10,
        11,
        20,
    )
    assert rollback["why"].startswith("non-finite gradient norm nan (loss ")
    assert "committed step 20 " not in proc.stdout  # the step-20 save never happened
    assert "checkpoint: committed step 10 " in proc.stdout
    weights = load_file(run / "export" / "model.safetensors")
    assert weights and all(torch.isfinite(t.float()).all() for t in weights.values())
