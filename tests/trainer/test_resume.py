"""Resume is exact: after SIGTERM anywhere in a step, and on another world size, no sample is lost or repeated.

The runs use the instrumented entry point (tests/trainer/instrumented.py): it delivers SIGTERM
inside a chosen micro-step and records which samples every rank read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter

import pytest

from tests.trainer.helpers import (
    GLOBAL_BATCH,
    INSTRUMENTED,
    REPO,
    TINY_QWEN2,
    metrics_of,
    read_json,
    run_config,
    samples_read,
    single_process_argv,
    torchrun_argv,
    trainer_env,
)

pytestmark = pytest.mark.slow

MAX_STEPS = 40


def cursor_before(step: int) -> int:
    """The data cursor at the start of (1-based) ``step``."""
    return (step - 1) * GLOBAL_BATCH


def positions(records: list[dict]) -> Counter:
    return Counter(p for r in records for p in r["positions"])


def ids(records: list[dict]) -> Counter:
    return Counter(i for r in records for i in r["ids"])


def test_sigterm_inside_steps_and_at_a_checkpoint_step_resumes_bitwise(tmp_path, dataset_uri, reference_run):
    """Three attempts: SIGTERM in step 7's second micro-step, then as step 20 (a checkpoint step)
    is read ahead, during step 19, then done."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run, samples = tmp_path / "run", tmp_path / "samples"
    samples.mkdir()
    plan = [(1, f"{cursor_before(7)}:1", 143), (2, f"{cursor_before(20)}:0", 143), (3, "", 0)]
    for attempt, sigterm_at, _ in plan:
        proc = subprocess.run(
            torchrun_argv(config, module=INSTRUMENTED),
            env=trainer_env(tmp_path / "cache", attempt, samples_dir=str(samples), sigterm_at=sigterm_at),
            capture_output=True,
            text=True,
            timeout=180,
        )
        # torchrun itself exits 1 when a worker exits 143 (preempted); the record says what happened
        assert proc.returncode == (1 if sigterm_at else 0), proc.stdout[-3000:] + proc.stderr[-3000:]

    first, second, third = (read_json(run / "attempts" / f"{n}.json") for n in (1, 2, 3))
    # The ranks agree on the flag as each step begins (train.train_step), so a signal during a
    # step stops them after the next one: step 7's stops after step 8. Step 20's first
    # micro-batch is read during step 19 (prefetched), so that signal stops after step 20.
    assert (first["outcome"], first["last_step"], first["checkpoint_step"], first["steps_lost"]) == (
        "preempted",
        8,
        8,
        0,
    )
    assert (
        second["outcome"],
        second["resumed_from_step"],
        second["last_step"],
        second["checkpoint_step"],
    ) == ("preempted", 8, 20, 20)
    assert (third["outcome"], third["resumed_from_step"], third["last_step"]) == ("completed", 20, MAX_STEPS)
    assert (run / "export" / "model.safetensors").read_bytes() == (
        reference_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()

    # every attempt starts exactly at its checkpoint's cursor; together they read each sample once
    # (nothing is read ahead for a step that is not trained)
    read = [samples_read(samples, n) for n in (1, 2, 3)]
    assert [r[0]["cursor"] for r in read] == [0, cursor_before(9), cursor_before(21)]
    assert positions(read[0] + read[1] + read[2]) == Counter(range(MAX_STEPS * GLOBAL_BATCH))
    assert ids(read[0] + read[1] + read[2]) == ids(samples_read(reference_run["samples"], 1))


def test_resume_on_another_world_size_continues_the_same_samples(tmp_path, dataset_uri, reference_run):
    # The 2-rank run's step-30 checkpoint, resumed by one process: train.global_batch_size=16 gives
    # 4 accumulation steps instead of 2, so the same samples, on a resharded model and optimizer.
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run, samples = tmp_path / "run", tmp_path / "samples"
    samples.mkdir()
    shutil.copytree(reference_run["run_dir"] / "checkpoints", run / "checkpoints")
    shutil.rmtree(run / "checkpoints" / "step_00000040")  # latest.json still says 40: a stale pointer
    proc = subprocess.run(
        single_process_argv(config, module=INSTRUMENTED),
        env=trainer_env(tmp_path / "cache", attempt=2, samples_dir=str(samples)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "checkpoint: picked step 30" in proc.stdout
    assert "batch: 16 samples per step = micro batch 4 x 4 accumulation steps x 1 ranks" in proc.stdout
    record = read_json(run / "attempts" / "2.json")
    assert (record["outcome"], record["resumed_from_step"], record["world_size"]) == ("completed", 30, 1)

    saved_cursor = read_json(run / "checkpoints" / "step_00000030" / "_COMMITTED")["cursor"]
    assert saved_cursor == 30 * GLOBAL_BATCH
    assert re.search(rf"resume: step 30, data cursor {saved_cursor}$", proc.stdout, re.M)
    resumed = samples_read(samples, 2)
    assert resumed[0]["cursor"] == saved_cursor
    reference = samples_read(reference_run["samples"], 1)
    before = [r for r in reference if r["cursor"] < saved_cursor]
    after = [r for r in reference if r["cursor"] >= saved_cursor]
    assert ids(resumed) == ids(after)  # nothing skipped, nothing read twice
    assert ids(before + resumed) == ids(reference)

    reference_metrics, resumed_metrics = metrics_of(reference_run["run_dir"]), metrics_of(run)
    assert sorted(resumed_metrics) == list(range(31, MAX_STEPS + 1))
    for step in (31, MAX_STEPS):  # not bitwise (other reduction order), but the same trajectory
        assert resumed_metrics[step]["loss"] == pytest.approx(reference_metrics[step]["loss"], abs=0.02)


def test_a_signal_to_one_rank_stops_both_after_the_same_step(tmp_path, dataset_uri):
    """Only rank 1 is signalled, in step 7: rank 0 learns it from the votes at step 8's start, and
    both stop after step 8, having read exactly the samples of steps 1 to 8."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run, samples = tmp_path / "run", tmp_path / "samples"
    samples.mkdir()
    proc = subprocess.run(
        torchrun_argv(config, module=INSTRUMENTED),
        env=trainer_env(
            tmp_path / "cache", 1, samples_dir=str(samples), sigterm_at=f"{cursor_before(7)}:1:1"
        ),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["signal"], record["last_step"], record["checkpoint_step"]) == (
        "preempted",
        "SIGTERM",
        8,
        8,
    )
    for rank in (0, 1):
        read = [r for r in samples_read(samples, 1) if r["positions"][0] // 4 % 2 == rank]
        assert max(r["cursor"] for r in read) == cursor_before(8), rank
    assert positions(samples_read(samples, 1)) == Counter(range(8 * GLOBAL_BATCH))


# --- a record task: sft --------------------------------------------------------------------------
SFT_STEPS = 12
SFT_OVERRIDES = (
    "task.kind=sft",
    f"train.max_steps={SFT_STEPS}",
    "train.seq_len=80",
    "checkpoint.every_steps=4",
)
# A Hugging Face model with tied embeddings (the tie, its rotary buffers and its names must
# survive the checkpoints too), with room for the records' 80 tokens.
SFT_MODEL = {**TINY_QWEN2, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def sft_dataset(tmp_path_factory) -> str:
    from tests.trainer.helpers import write_sft_dataset

    return write_sft_dataset(tmp_path_factory.mktemp("sft") / "datasets" / "instructions" / "v1")


def sft_train(config, tmp_path, attempt: int, **instruments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        torchrun_argv(config, *SFT_OVERRIDES, module=INSTRUMENTED),
        env=trainer_env(tmp_path / "cache", attempt, **instruments),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_an_sft_run_preempted_then_killed_resumes_bitwise_identical(tmp_path, sft_dataset):
    """Prompt/response records, the loss on the responses, a Hugging Face Qwen2 (tied embeddings):
    an uninterrupted run, and one stopped
    by SIGTERM inside step 2, then SIGKILL in step 9 after the step-8 commit, then run to the end
    (``tests.trainer.helpers.preempted_then_killed``): the same bytes."""
    from tests.trainer.helpers import preempted_then_killed

    (tmp_path / "reference").mkdir()
    reference, _ = run_config(tmp_path / "reference", sft_dataset, "run", model={"hf_config": SFT_MODEL})
    done = sft_train(reference, tmp_path / "reference", 1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    losses = metrics_of(tmp_path / "reference" / "run")
    assert losses[SFT_STEPS]["loss"] < losses[1]["loss"] - 1.0  # the answers are learnt

    config, _ = run_config(tmp_path, sft_dataset, "run", model={"hf_config": SFT_MODEL})
    records = preempted_then_killed(config, tmp_path / "run", tmp_path, SFT_OVERRIDES)
    assert (records[1]["outcome"], records[1]["last_step"], records[1]["steps_lost"]) == ("preempted", 3, 0)
    assert (records[3]["outcome"], records[3]["resumed_from_step"], records[3]["last_step"]) == (
        "completed",
        8,
        SFT_STEPS,
    )
    assert (tmp_path / "run" / "export" / "model.safetensors").read_bytes() == (
        tmp_path / "reference" / "run" / "export" / "model.safetensors"
    ).read_bytes()


def test_a_killed_worker_restarts_in_place_from_the_node_local_tier_and_ends_bitwise(
    tmp_path, dataset_uri, reference_run
):
    """One worker process is SIGKILLed inside step 25 (its node and torchrun live on): torchrun
    restarts the gang in place, under the same attempt, which resumes from step 20 read from the
    node-local tier alone; the attempt record shows both incarnations, and the run ends with the
    very weights of an uninterrupted one."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    run, kills, samples = tmp_path / "run", tmp_path / "kills", tmp_path / "samples"
    kills.mkdir()
    samples.mkdir()
    proc = subprocess.run(
        torchrun_argv(config, module=INSTRUMENTED, max_restarts=2),
        env=trainer_env(
            tmp_path / "cache", 1, kill_at=f"{cursor_before(25)}:1:{kills}", samples_dir=str(samples)
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    killed_at = float((kills / "killed_r1").read_text())
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["resumed_from_step"], record["last_step"]) == (
        "completed",
        20,
        MAX_STEPS,
    )
    [before] = record["restarts"]
    assert (before["restart"], before["outcome"], before["cause"]) == (0, "failed", "network")
    assert before["last_step"] in (23, 24)  # where rank 0 had got to when its peer died
    assert (before["checkpoint_step"], before["steps_lost"]) == (20, before["last_step"] - 20)
    assert record["restore_files"] == {"local": 5, "storage": 0}  # .metadata, 2 shards, 2 per-rank files
    assert (
        f"restart in place 1 of attempt 1: the incarnation before ended failed (network) at step "
        f"{before['last_step']}; resuming from the newest checkpoint" in proc.stdout
    )
    assert "step 20 restored with 5 of 5 file(s) from the node-local tier, 0 from storage" in proc.stdout
    print(f"\nkill -> first step of the restarted gang: {record['first_step_time'] - killed_at:.1f}s")
    assert record["first_step_time"] > killed_at
    assert (run / "export" / "model.safetensors").read_bytes() == (
        reference_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()
    # the restarted gang read steps 21 to 40, as the uninterrupted run did (21 to 24 a second time)
    again = positions(r for r in samples_read(samples, 1) if r["cursor"] >= cursor_before(21))
    reference = positions(
        r for r in samples_read(reference_run["samples"], 1) if r["cursor"] >= cursor_before(21)
    )
    assert set(again) == set(reference) and set(again.values()) <= {1, 2}


def test_one_ranks_program_error_is_the_attempts_cause_and_no_restart_in_place_repeats_it(
    tmp_path, dataset_uri
):
    """Rank 1 raises KeyError reading step 5's batch (bad data, a bug: every incarnation would); rank 0
    then fails in the collective with its dead peer, a network error. The record keeps rank 1's
    program error whichever rank wrote last, so the restarted workers exit at once instead of
    training into it again, and the operator will not relaunch it as an infrastructure failure."""
    config, _ = run_config(tmp_path, dataset_uri, "run")
    raised = tmp_path / "raised"
    raised.mkdir()
    proc = subprocess.run(
        torchrun_argv(config, module=INSTRUMENTED, max_restarts=2),
        env=trainer_env(tmp_path / "cache", 1, raise_at=f"{cursor_before(5)}:1:{raised}"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    record = read_json(tmp_path / "run" / "attempts" / "1.json")
    assert (record["outcome"], record["cause"]) == ("failed", "program"), record
    assert record["error"] == "KeyError: 'label of sample at cursor " + str(cursor_before(5)) + "'"
    assert record["last_step"] in (3, 4)  # step 5's batch is read ahead, during step 4
    assert [p.name for p in raised.iterdir()] == ["raised_r1_0"]  # trained once, never again
    assert "a restart would fail the same way" in proc.stderr
