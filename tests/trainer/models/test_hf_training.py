"""A Hugging Face model from ``model.hf_config`` through the whole trainer: 2 CPU ranks under
torchrun, checkpoints, a SIGTERM and a SIGKILL, the export that ``transformers`` loads alone.

The model is a tiny Qwen2 with tied embeddings (the LM head is the embedding, as in Qwen2-0.5B),
so the tie survives sharding, checkpoints and the export.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch

from tests.trainer.helpers import (
    GLOBAL_BATCH,
    INSTRUMENTED,
    committed_steps,
    metrics_of,
    read_json,
    run_config,
    torchrun_argv,
    trainer_env,
)

pytestmark = pytest.mark.slow

TINY_QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": 257,  # the test dataset's byte tokenizer
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}
STEPS = 12
# A checkpoint every 4 steps; the export in fp32, the trained weights bit for bit.
OVERRIDES = (f"train.max_steps={STEPS}", "checkpoint.every_steps=4", "export.dtype=fp32")


def cursor_before(step: int) -> int:
    """The data cursor at the start of (1-based) ``step``."""
    return (step - 1) * GLOBAL_BATCH


def train(config, tmp_path, attempt: int, **instruments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        torchrun_argv(config, *OVERRIDES, module=INSTRUMENTED),
        env=trainer_env(tmp_path / "cache", attempt, **instruments),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, dataset_uri) -> dict:
    """An uninterrupted run of the tiny Qwen2."""
    tmp = tmp_path_factory.mktemp("hf-reference")
    config, run_uri = run_config(tmp, dataset_uri, "run", model={"hf_config": TINY_QWEN2})
    proc = train(config, tmp, 1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"run_dir": tmp / "run", "run_uri": run_uri, "config": config, "stdout": proc.stdout}


def test_a_qwen2_from_its_config_trains_and_its_export_loads_in_transformers_with_the_same_logits(hf_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.export.folder import load_model
    from trainer.storage import open_storage

    run = hf_run["run_dir"]
    assert "model: hf qwen2: 90,752 parameters, 2 blocks" in hf_run["stdout"]
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"], record["steps_lost"]) == ("completed", STEPS, 0)
    metrics = metrics_of(run)
    assert metrics[STEPS]["loss"] < metrics[1]["loss"] - 1.0  # it learned
    info = read_json(run / "export" / "export.json")
    assert (info["layout"], info["model"], info["param_count"], info["dtype"]) == (
        "hf",
        "qwen2",
        90_752,
        "fp32",
    )

    folder = run / "export"
    theirs = AutoModelForCausalLM.from_pretrained(folder)  # transformers alone, as a server would
    assert type(theirs).__name__ == "Qwen2ForCausalLM" and theirs.config.vocab_size == 257
    assert theirs.lm_head.weight.data_ptr() == theirs.model.embed_tokens.weight.data_ptr()  # still tied
    assert AutoTokenizer.from_pretrained(folder)("the cat eats")["input_ids"]
    ours, _ = load_model(open_storage(folder.as_uri()), folder.as_uri())
    tokens = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        difference = (ours(tokens) - theirs(input_ids=tokens).logits).abs().max().item()
    assert difference <= 1e-5


def test_an_hf_model_preempted_then_killed_resumes_bitwise_identical(tmp_path, dataset_uri, hf_run):
    """Attempt 1: SIGTERM inside step 2 (it stops after step 3, with an emergency checkpoint).
    Attempt 2: resumed from 3, killed (SIGKILL, the whole gang) while held in step 9, after the
    step-8 commit. Attempt 3: resumed from 8, to the end."""
    config, _ = run_config(tmp_path, dataset_uri, "run", model={"hf_config": TINY_QWEN2})
    run, held = tmp_path / "run", tmp_path / "held"
    held.mkdir()

    first = train(config, tmp_path, 1, sigterm_at=f"{cursor_before(2)}:1")
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]  # torchrun's, on SIGTERM
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"], record["checkpoint_step"], record["steps_lost"]) == (
        "preempted",
        3,
        3,
        0,
    )

    proc = subprocess.Popen(
        torchrun_argv(config, *OVERRIDES, module=INSTRUMENTED),
        env=trainer_env(tmp_path / "cache", 2, pause_at=f"{cursor_before(10)}:{held}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (len(list(held.glob("paused_a2_r*"))) == 2 and 8 in committed_steps(run)):
            assert proc.poll() is None, "attempt 2 ended before it was held"
            assert time.monotonic() < deadline, "attempt 2 was never held after the step-8 commit"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not (run / "attempts" / "2.json").exists()  # killed: no record

    third = train(config, tmp_path, 3)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    record = read_json(run / "attempts" / "3.json")
    assert (record["outcome"], record["resumed_from_step"], record["last_step"]) == ("completed", 8, STEPS)
    assert (run / "export" / "model.safetensors").read_bytes() == (
        hf_run["run_dir"] / "export" / "model.safetensors"
    ).read_bytes()
