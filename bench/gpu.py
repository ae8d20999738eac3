"""GPU figures for the trainer's step on one device (the lent H200), printed and saved as JSON.

1. The bf16 matmul rate this device really reaches (a large GEMM), the practical ceiling.
2. The ``1b`` preset at sequence length 2048 in bf16 (FSDP2 mixed precision, world of one),
   without and with ``torch.compile`` per block: tokens/s, MFU and peak memory. MFU is counted
   against the dense bf16 spec peak (989 TFLOP/s for H100/H200) and against the measured rate.
3. A claim checked as a table: ``bert-large-size`` in fp32 without activation checkpointing
   against bf16 with full activation checkpointing, same batch: memory and throughput (claimed:
   memory halves, throughput x1.7; ``seed_claim`` in the JSON). TF32 matmuls are on for fp32,
   and the table says so.

It runs on the device's own Python and torch as it is: only torch and this checkout's
``trainer`` model, parallelism and config dataclasses (torch and the standard library alone)
are imported. ``--smoke`` runs every path on
the CPU with the tiny preset, to check the script without a GPU.

    python bench/gpu.py [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def matmul_tflops(device, dtype, n: int, iters: int) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    preset: str,
    precision: str,
    ac: str,
    compiled: bool,
    micro_batch: int,
    seq_len: int,
    steps: int,
    warmup: int,
    device,
) -> dict:
    """Train ``steps`` timed steps after ``warmup`` ones; tokens/s, FLOPs/token and peak memory."""
    import torch
    import torch.nn.functional as F

    from trainer import parallel
    from trainer.builder import build_model
    from trainer.config import Config, TrainConfig
    from trainer.optim import build_optimizer

    torch.manual_seed(0)
    built = build_model(preset, None, 32000, seq_len)
    model = built.model.to(device)
    config = Config(precision=precision, train=TrainConfig(activation_checkpointing=ac, compile=compiled))
    parallel.parallelize(model, built.block_names, config)
    optimizer = build_optimizer(model, 1e-4, 0.1)
    tokens = torch.randint(0, 32000, (micro_batch, seq_len + 1), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(warmup + steps):
        sync(device)
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    result = {
        "preset": preset,
        "precision": precision,
        "activation_checkpointing": ac,
        "compile": compiled,
        "micro_batch": micro_batch,
        "seq_len": seq_len,
        "params": built.param_count,
        "step_s": step_s,
        "tokens_per_s": micro_batch * seq_len / step_s,
        "flops_per_token": built.flops_per_token(seq_len),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def with_mfu(r: dict, spec_peak: float | None, measured_peak: float) -> dict:
    achieved = r["tokens_per_s"] * r["flops_per_token"]
    return {
        **r,
        "achieved_tflops": achieved / 1e12,
        "mfu_vs_spec": achieved / spec_peak if spec_peak else None,
        "mfu_vs_measured_matmul": achieved / (measured_peak * 1e12),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).parent / "results"))
    p.add_argument("--smoke", action="store_true", help="CPU, tiny preset, few steps: check the script")
    a = p.parse_args()

    import torch

    from trainer import parallel
    from trainer.flops import peak_flops

    if not a.smoke and not torch.cuda.is_available():
        sys.exit("bench/gpu.py needs CUDA (use --smoke to check it on the CPU)")
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 rows below run on TF32 tensor cores
    torch.backends.cudnn.allow_tf32 = True
    env = parallel.init_distributed()  # a world of one, as FSDP2 wants a process group
    device = env.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    spec_peak = peak_flops(name if device.type == "cuda" else None, "bf16")
    big, tiny = ("tiny", "tiny") if a.smoke else ("1b", "bert-large-size")
    seq, steps, warmup = (64, 2, 1) if a.smoke else (2048, 10, 3)
    measured = matmul_tflops(device, torch.bfloat16, 512 if a.smoke else 8192, 2 if a.smoke else 50)
    print(
        f"device {name}: bf16 matmul {measured:.0f} TFLOP/s measured, spec {spec_peak and spec_peak / 1e12}",
        flush=True,
    )

    runs = []
    for compiled in (False, True):
        r = with_mfu(
            measure(
                big,
                "bf16",
                "none",
                compiled,
                2 if a.smoke else 8,
                seq,
                steps,
                warmup + (2 if compiled else 0),
                device,
            ),
            spec_peak,
            measured,
        )
        runs.append(r)
        print(
            f"{big} bf16 seq {seq} compile={compiled}: {r['tokens_per_s']:,.0f} tok/s, "
            f"MFU {r['mfu_vs_spec'] or 0:.1%} of spec, {r['mfu_vs_measured_matmul']:.1%} of measured, "
            f"peak {r['peak_mem_gib'] or 0:.1f} GiB",
            flush=True,
        )

    claim = []
    for precision, ac in (("fp32", "none"), ("bf16", "full")):
        r = with_mfu(
            measure(
                tiny,
                precision,
                ac,
                False,
                2 if a.smoke else 16,
                64 if a.smoke else 512,
                steps,
                warmup,
                device,
            ),
            spec_peak,
            measured,
        )
        claim.append(r)
    memory_ratio = (claim[1]["peak_mem_gib"] / claim[0]["peak_mem_gib"]) if claim[0]["peak_mem_gib"] else None
    speedup = claim[1]["tokens_per_s"] / claim[0]["tokens_per_s"]
    print(
        f"{tiny}: fp32 (TF32 matmuls), no AC -> bf16, full AC: memory x{memory_ratio or float('nan'):.2f}, "
        f"throughput x{speedup:.2f} (claimed: x0.5 and x1.7)",
        flush=True,
    )

    results = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": name,
        "torch": torch.__version__,
        "smoke": a.smoke,
        "bf16_matmul_tflops_measured": measured,
        "bf16_spec_peak_tflops": spec_peak / 1e12 if spec_peak else None,
        "tf32_for_fp32": True,
        "throughput": runs,
        "seed_claim": {
            "rows": claim,
            "memory_ratio_bf16_ac_over_fp32": memory_ratio,
            "throughput_ratio_bf16_ac_over_fp32": speedup,
        },
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    path = out / f"gpu-{results['date'][:10]}-{slug}{'-smoke' if a.smoke else ''}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"results: {path}")
    best = max(runs, key=lambda r: r["tokens_per_s"])
    print(f"mfu_1b={best['mfu_vs_spec'] or 0:.3f}")
    parallel.shutdown()


if __name__ == "__main__":
    main()
