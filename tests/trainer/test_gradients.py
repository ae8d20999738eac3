"""The sharded training step computes the right gradients: FSDP2 on 2 gloo ranks vs one plain process.

FSDP on gloo has had silent gradient-averaging bugs (a sum where a mean belongs, a rank's
shard missing), which train on and merely converge worse; only a comparison shows them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.trainer import grad_probe
from tests.trainer.helpers import REPO, trainer_env

pytestmark = pytest.mark.slow

# Worst per-tensor relative error (||g - g_ref|| / ||g_ref||) of the first step's gradients
# against the fp32 single-process reference: summation order only for fp32; fp16 and bf16
# compute in 11- and 8-bit mantissas (gradients are reduced in fp32).
TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("grad_probe")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(REPO / "tests" / "trainer" / "grad_probe.py"),
            str(out),
        ],
        env=trainer_env(out / "cache"),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {name: torch.load(out / f"{name}.pt") for name in grad_probe.CASES}


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return grad_probe.reference_gradients()


def worst_relative_error(grads: dict, reference: dict) -> float:
    assert set(grads) == set(reference)  # every parameter has a gradient, under its plain name
    return max(((grads[name] - ref).norm() / ref.norm()).item() for name, ref in reference.items())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_sharded_gradients_match_one_unsharded_process(probe, reference, precision):
    error = worst_relative_error(probe[precision]["grads"], reference)
    assert error < TOLERANCE[precision]
    if precision != "fp32":  # the low precision really was used: it costs accuracy
        assert error > 10 * worst_relative_error(probe["fp32"]["grads"], reference)
    assert probe[precision]["grad_dtype"] == "torch.float32"  # sharded gradients stay fp32 (master)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_precision_trains(probe, precision):
    losses = probe[precision]["losses"]
    assert losses[-1] < losses[0] - 0.25
    assert losses == pytest.approx(probe["fp32"]["losses"], abs=0.02)


@pytest.mark.parametrize(
    "case, same_as, tolerance",
    [
        ("fp32_accum2", "fp32", 1e-4),  # 2 micro-steps of 2 samples = 1 of 4
        ("fp32_accum2_nosync", "fp32", 1e-4),  # one gradient sync per step instead of per micro-step
        ("bf16_accum2_nosync", "bf16", 5e-3),  # unsharded bf16 grads are accumulated in fp32
        ("fp32_ac_full", "fp32", 1e-5),  # recomputed activations are the same activations
        ("fp32_ac_selective", "fp32", 1e-5),
    ],
)
def test_step_options_keep_gradients_and_losses(probe, reference, case, same_as, tolerance):
    assert probe[case]["accum"] == (2 if "accum2" in case else 1)
    assert worst_relative_error(probe[case]["grads"], reference) < max(tolerance, TOLERANCE[same_as])
    assert probe[case]["losses"] == pytest.approx(probe[same_as]["losses"], abs=tolerance * 10)
