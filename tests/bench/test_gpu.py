"""bench/gpu.py: its bounded micro-batch search, and every section run on the CPU (``--smoke``)
in a Python where boto3, Airflow and the other libraries a GPU box may lack cannot be imported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu.py"
# What the device's Python lacks: the run must import none of it. It has torch, transformers
# (the Hugging Face rows) and what transformers brings (safetensors, huggingface_hub, pyyaml).
ABSENT = ("boto3", "botocore", "s3transfer", "airflow", "moto")


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu = load_bench()


def test_the_search_doubles_then_bisects_to_within_a_sixteenth():
    tried = []

    def fits(b):
        tried.append(b)
        return b <= 300

    found = gpu.largest_fitting(fits, 16, 4096, lambda: 1e9)
    assert tried[:6] == [16, 32, 64, 128, 256, 512]  # doubling up to the first failure
    assert found["exact"] and found["largest_fitting"] <= 300 < found["smallest_failing"]
    assert found["smallest_failing"] - found["largest_fitting"] <= 256 // 16
    assert len(tried) <= 6 + 5  # then bisection: log2(256 / 16) more probes at most
    assert [p["micro_batch"] for p in found["probes"]] == tried


def test_the_search_stops_at_its_cap_and_its_time_and_says_so():
    at_cap = gpu.largest_fitting(lambda b: True, 2, 8, lambda: 1e9)
    assert (at_cap["largest_fitting"], at_cap["exact"], at_cap["stopped"]) == (
        8,
        False,
        "reached the cap of 8",
    )

    clock = iter([1e9, 1e9, 0.0])  # time for two probes, then none

    out_of_time = gpu.largest_fitting(lambda b: True, 16, 4096, lambda: next(clock, 0.0))
    assert out_of_time["largest_fitting"] == 32 and out_of_time["stopped"] == "time cap"
    assert not out_of_time["exact"] and len(out_of_time["probes"]) == 2


def test_mfu_is_given_against_989_790_and_the_measured_matmul():
    row = gpu.with_mfu({"tokens_per_s": 1000.0, "flops_per_token": 7.9e11}, 500.0, None)
    assert row["achieved_tflops"] == pytest.approx(790.0)
    assert row["mfu_vs_790"] == pytest.approx(1.0) and row["mfu_vs_989"] == pytest.approx(790 / 989)
    assert row["mfu_vs_measured_matmul"] == pytest.approx(790 / 500) and row["mfu_vs_spec"] is None


def test_out_is_a_json_file_or_a_folder():
    assert gpu.output_path("/r/x.json", "2026-12-01", "NVIDIA H200", False) == Path("/r/x.json")
    assert gpu.output_path("/r", "2026-12-01", "NVIDIA H200", True) == Path(
        "/r/gpu-2026-12-01-nvidia-h200-smoke.json"
    )


@pytest.mark.slow
def test_smoke_runs_every_section_on_the_cpu_without_boto3_or_airflow(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    # sitecustomize runs in every interpreter on this PYTHONPATH: the bench and its resume child.
    (shim / "sitecustomize.py").write_text(
        "import sys\n"
        f"ABSENT = {ABSENT!r}\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ABSENT:\n"
        "            raise ImportError(f'{name} is not installed on the device (test_gpu.py)')\n"
        "sys.meta_path.insert(0, Absent())\n"
    )
    out = tmp_path / "smoke.json"
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--scratch", str(tmp_path / "scratch")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    for section in ("matmul", "throughput", "flops_check", "seed_claim", "checkpoint", "resume"):
        assert "skipped" not in results[section] and "error" not in results[section], results[section]
    rows = results["throughput"]["rows"]
    assert results["throughput"]["rows_skipped"] == []
    assert {(r["activation_checkpointing"], r["compile"]) for r in rows} == {
        ("none", False),
        ("full", False),
        ("none", True),
        ("full", True),
    }
    assert all(r["mfu_vs_989"] > 0 and r["mfu_vs_790"] > 0 for r in rows)
    hf_row = results["throughput"]["hf_row"]  # the preset's shape as a Hugging Face Llama
    assert (hf_row["model"], hf_row["params"]) == ("hf llama", rows[0]["params"])
    assert hf_row["step_time_ratio_vs_preset"] > 0
    for model in ("preset", "hf"):  # the MFU formula against torch's own count of one step
        check = results["flops_check"][model]
        assert 0.5 < check["formula_over_counted"] < 2.0, check
    claim = results["seed_claim"]
    assert [
        (r["precision"], r["activation_checkpointing"], r["micro_batch"], r["tf32"]) for r in claim["rows"]
    ] == [
        ("fp32", "none", 2, False),
        ("bf16", "full", 4, None),
        ("fp32", "none", 2, True),
    ]
    assert set(claim["largest_micro_batch"]) == {"fp32_ac_none", "bf16_ac_full"}
    assert all(found["largest_fitting"] >= 2 for found in claim["largest_micro_batch"].values())
    ckpt = results["checkpoint"]
    assert len(ckpt["saves"]) == 2 and all(s["blocked_s"] > 0 for s in ckpt["saves"])
    assert ckpt["emergency_s"] > 0 and ckpt["state_bytes"] > 0
    resume = results["resume"]
    assert resume["resumed_step"] == ckpt["committed_step"]
    assert resume["process_start_to_first_step_s"] >= resume["load_s"] + resume["first_step_s"]
