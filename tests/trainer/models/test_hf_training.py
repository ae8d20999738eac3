"""A Hugging Face model from ``model.hf_config`` through the whole trainer: 2 CPU ranks under
torchrun, checkpoints, the export that ``transformers`` loads alone. (Its resume after a SIGTERM
and a SIGKILL is the sft test's, tests/trainer/test_resume.py, which trains the same model.)

The model is a tiny Qwen2 with tied embeddings (the LM head is the embedding, as in Qwen2-0.5B),
so the tie survives sharding, checkpoints and the export.
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.trainer.helpers import (
    INSTRUMENTED,
    TINY_QWEN2,
    metrics_of,
    read_json,
    run_config,
    torchrun_argv,
    trainer_env,
)

pytestmark = pytest.mark.slow

STEPS = 12
# A checkpoint every 4 steps; the export in fp32, the trained weights bit for bit.
OVERRIDES = (f"train.max_steps={STEPS}", "checkpoint.every_steps=4", "export.dtype=fp32")


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
