"""Writes tests/data/checkpoint_v1/run: a 3-step single-process run of the trainer with one committed
checkpoint (step 3; its export left out), and expected.json, what the checkpoint holds as read by torch alone (no
trainer code): the step, the data cursor and the sha256 of every model weight.

Run from the repository root: ``PYTHONPATH=$PWD python tests/data/checkpoint_v1/make.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.trainer.helpers import run_config, single_process_argv, trainer_env, write_dataset

HERE = Path(__file__).resolve().parent
TRAIN = {
    "max_steps": 3,
    "micro_batch_size": 4,
    "global_batch_size": 8,
    "seq_len": 32,
    "lr": 3.0e-3,
    "warmup_steps": 1,
    "log_every": 1,
}


def weight_hashes(step_dir: Path) -> dict[str, str]:
    """sha256 of each model weight (float32, C order) in the checkpoint, read by torch's DCP."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "full.pt"
        dcp_to_torch_save(str(step_dir), str(out))
        full = torch.load(out, weights_only=False)
    model = full["model"]
    return {
        name: hashlib.sha256(t.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()
        for name, t in sorted(model.items())
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset = write_dataset(work / "dataset" / "demo" / "v1")
        config, _ = run_config(
            work,
            dataset,
            "run",
            model={"builder": "tiny_llama:build"},
            train=TRAIN,
            checkpoint={"every_steps": 3, "keep": 1},
        )
        env = trainer_env(work / "cache", attempt=1)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
        proc = subprocess.run(single_process_argv(config), env=env, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])
        run = work / "run"
        marker = json.loads((run / "checkpoints" / "step_00000003" / "_COMMITTED").read_text())
        expected = {
            "step": marker["step"],
            "cursor": marker["cursor"],
            "weights": weight_hashes(run / "checkpoints" / "step_00000003" / marker["dir"]),
        }
        target = HERE / "run"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(run, target, ignore=shutil.ignore_patterns("*.trainops-lock", "export"))
        (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
