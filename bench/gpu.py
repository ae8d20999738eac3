"""GPU figures for the trainer on one device (the lent H200), in one run, printed and saved as JSON.

1. ``matmul``: the bf16 matmul rate this device really reaches (a large GEMM).
2. ``throughput``: the ``1b`` preset at sequence length 2048 in bf16 (FSDP2 mixed precision,
   world of one), activation checkpointing off and full x ``torch.compile`` off and on:
   tokens/s, peak memory (allocated, and reserved: what ``nvidia-smi`` shows) and MFU against
   989 TFLOP/s (the H100/H200 SXM dense bf16 spec), against 790 (the bf16 matmul ceiling
   measured on an H200) and against this run's matmul; then the same shape as a Hugging Face
   Llama (``model.hf_config``, transformers' model on the trainer), uncompiled, and its ratio.
3. ``flops_check``: one step of the ``1b`` preset and of its Hugging Face twin counted by
   ``torch.utils.flop_counter`` against the FLOPs per token the MFU figures use
   (``trainer.flops``): the ratio says whether the MFU formula counts what the step does.
4. ``seed_claim``: the seed's own statement, ``bert-large-size`` (sequence 512) in fp32 with
   TF32 off at micro batch 8 against bf16 with full activation checkpointing at micro batch 16:
   peak memory (allocated and reserved), tokens/s (claimed: memory x0.5, throughput x1.7);
   fp32 with TF32 on at micro batch 8 beside them (what fp32 gives on defaults); and the
   largest micro batch that fits in fp32 and in bf16 + AC (doubling, then bisection,
   out-of-memory caught and freed; each probe a full training step).
5. ``checkpoint``: the ``1b`` training state (weights and AdamW moments) saved by the trainer's
   ``Checkpointer`` to file:// on local disk: the time the loop is blocked per asynchronous save
   (the wait for a previous save included), in seconds and in steps, and the time of the
   emergency (synchronous) save.
6. ``resume``: a fresh process that resumes from that committed checkpoint as an attempt does
   (fence, model built on the meta device, load) and takes one step: the time from its start
   to the end of that step, with its phases.

Every section has a time cap and the sections a total budget (``--budget-s``, default 440 s,
leaving 100 s of the 540 a run is given for start-up and a compile that outlasts its
section); a section or row that would overrun is skipped with its reason in the JSON, and one
that fails records its error (the exit status is then 1).

It runs on the device's own Python and torch as they are (3.12 / 2.11 tested for): it imports
torch, numpy, transformers (the Hugging Face rows; it brings safetensors and pyyaml) and this
checkout's ``trainer`` modules that need nothing else (no boto3, no Airflow). ``--smoke`` runs every section on the CPU with the ``tiny``
preset in seconds (``torch.compile`` with the eager backend there), so the script is checked
without a GPU (tests/bench/test_gpu.py)::

    python bench/gpu.py [--out FILE.json | --out DIR] [--smoke] [--budget-s 450]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STARTED = time.time()  # the resume child's own start, for its phases
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPEC_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (NVIDIA's datasheet)
MEASURED_BF16_TFLOPS = 790.0  # the bf16 matmul ceiling measured on an H200
SEED = 1234
VOCAB = 32000
CHILD_MARK = "resume-child: "


class OutOfTime(Exception):
    """A section's deadline came before it could measure anything."""


@dataclass(frozen=True)
class Plan:
    """What each section runs: the real sizes, or the CPU smoke test's."""

    big: str  # the throughput, checkpoint and resume preset
    claim: str  # the seed-claim preset
    seq: int
    claim_seq: int
    micro_batch: int
    claim_fp32_micro_batch: int  # the seed's fp32 run
    claim_bf16_micro_batch: int  # the seed's bf16 + activation checkpointing run
    ckpt_micro_batch: int
    steps: int
    warmup: int
    compile_warmup: int
    matmul_n: int
    matmul_iters: int
    search_start: int
    search_cap: int  # largest micro batch the search tries
    saves: int
    save_every: int  # steps between asynchronous saves
    caps: dict[str, float]  # seconds per section


REAL = Plan(
    big="1b",
    claim="bert-large-size",
    seq=2048,
    claim_seq=512,
    micro_batch=8,
    claim_fp32_micro_batch=8,
    claim_bf16_micro_batch=16,
    ckpt_micro_batch=2,
    steps=8,
    warmup=2,
    compile_warmup=2,
    matmul_n=8192,
    matmul_iters=50,
    search_start=16,
    search_cap=4096,
    saves=3,
    save_every=10,
    caps={
        "matmul": 10,
        "throughput": 160,
        "flops_check": 25,
        "seed_claim": 105,
        "checkpoint": 80,
        "resume": 60,
    },
)
SMOKE = Plan(
    big="tiny",
    claim="tiny",
    seq=32,
    claim_seq=32,
    micro_batch=2,
    claim_fp32_micro_batch=2,
    claim_bf16_micro_batch=4,
    ckpt_micro_batch=2,
    steps=1,
    warmup=1,
    compile_warmup=0,
    matmul_n=256,
    matmul_iters=2,
    search_start=2,
    search_cap=4,
    saves=2,
    save_every=1,
    caps={
        "matmul": 10,
        "throughput": 60,
        "flops_check": 30,
        "seed_claim": 40,
        "checkpoint": 40,
        "resume": 60,
    },
)


# ------------------------------------------------------------------------------ pure parts
def largest_fitting(
    fits: Callable[[int], bool], start: int, cap: int, time_left: Callable[[], float], probe_s: float = 0.0
) -> dict[str, Any]:
    """The largest micro batch ``b <= cap`` with ``fits(b)``: doubling from ``start`` to the first
    failure, then bisection between the last fit and it, to within 1/16 of the answer.

    :param time_left: seconds the search may still spend; a probe that would not fit in it
        (estimated from the last one, scaled by the batch) is not started, and the answer is
        then a lower bound (``exact`` False, ``stopped`` says why).
    :param probe_s: an estimate of the first probe's seconds.
    """
    probes: list[dict[str, Any]] = []
    last: tuple[int, float] = (start, probe_s)

    def attempt(b: int) -> bool | None:
        nonlocal last
        estimate = last[1] * b / max(last[0], 1)
        if estimate > time_left():
            return None
        t = time.monotonic()
        ok = fits(b)
        last = (b, time.monotonic() - t)
        probes.append({"micro_batch": b, "fits": ok, "s": round(last[1], 3)})
        return ok

    fit, fail, stopped = 0, None, ""
    b = start
    while b <= cap:
        ok = attempt(b)
        if ok is None:
            stopped = "time cap"
            break
        if not ok:
            fail = b
            break
        fit, b = b, b * 2
    else:
        stopped = f"reached the cap of {cap}"
    while not stopped and fail is not None and fail - fit > max(1, fit // 16):
        mid = (fit + fail) // 2
        ok = attempt(mid)
        if ok is None:
            stopped = "time cap"
        elif ok:
            fit = mid
        else:
            fail = mid
    return {
        "largest_fitting": fit,
        "smallest_failing": fail,
        "exact": not stopped,
        "stopped": stopped or None,
        "probes": probes,
    }


def with_mfu(row: dict[str, Any], measured_tflops: float | None, spec_tflops: float | None) -> dict[str, Any]:
    """``row`` with achieved TFLOP/s and MFU against 989, 790, this device's spec and this run's matmul."""
    achieved = row["tokens_per_s"] * row["flops_per_token"] / 1e12
    return {
        **row,
        "achieved_tflops": achieved,
        "mfu_vs_989": achieved / SPEC_BF16_TFLOPS,
        "mfu_vs_790": achieved / MEASURED_BF16_TFLOPS,
        "mfu_vs_spec": achieved / spec_tflops if spec_tflops else None,
        "mfu_vs_measured_matmul": achieved / measured_tflops if measured_tflops else None,
    }


def output_path(out: str, date: str, device_name: str, smoke: bool) -> Path:
    """``--out``: a ``.json`` file as given, else a folder for ``gpu-<date>-<device>[-smoke].json``."""
    if out.endswith(".json"):
        return Path(out)
    slug = "".join(c if c.isalnum() else "-" for c in device_name.lower()).strip("-")
    return Path(out) / f"gpu-{date}-{slug}{'-smoke' if smoke else ''}.json"


class Budget:
    """The run's time budget, and each section's share of it."""

    def __init__(self, total_s: float):
        self.total_s, self.started = total_s, time.monotonic()

    def left(self) -> float:
        return self.total_s - (time.monotonic() - self.started)

    def deadline(self, cap_s: float) -> float:
        return time.monotonic() + min(cap_s, self.left())


# ------------------------------------------------------------------------------ torch parts
def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def matmul_tflops(device, n: int, iters: int) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


class Trainee:
    """A preset built as the trainer builds it (meta device, sharded, then this rank's shards
    materialised and initialised on ``device``), its optimizer and LR schedule, and its step."""

    def __init__(
        self, preset: str, precision: str, ac: str, compiled: bool, seq_len: int, device, hf: bool = False
    ):
        import torch

        from trainer import parallel
        from trainer.config import Config, ModelConfig, TrainConfig
        from trainer.models.builder import build_model
        from trainer.optim import build_optimizer, build_scheduler

        hf_config = hf_twin(preset, seq_len) if hf else None
        config = Config(
            precision=precision,
            seed=SEED,
            model=ModelConfig(preset=preset, hf_config=hf_config),
            train=TrainConfig(seq_len=seq_len, activation_checkpointing=ac, compile=compiled),
        )
        with torch.device("meta"):
            self.built = build_model(preset, None, VOCAB, seq_len, hf_config=hf_config)
        self.model = self.built.model
        parallel.parallelize(self.model, self.built.block_names, config)
        init = self.built.meta_init  # the model's own rule: the preset's, or transformers'
        assert init is not None
        parallel.init_sharded(
            self.model, device, SEED, init.std, fill_buffers=init.fill_buffers, zero_rows=init.zero_rows
        )
        self.optimizer = build_optimizer(self.model, 1e-4, 0.1)
        self.scheduler = build_scheduler(self.optimizer, warmup_steps=10, max_steps=1000, min_lr_ratio=0.1)
        self.device, self.seq_len = device, seq_len

    def step(self, micro_batch: int) -> None:
        """One training step, the trainer's own (``trainer.step``), on random tokens."""
        import torch

        from trainer.step import apply_gradients, forward_backward

        tokens = torch.randint(0, VOCAB, (micro_batch, self.seq_len + 1), device=self.device)
        forward_backward(self.model, [(tokens[:, :-1], tokens[:, 1:])], 1)
        apply_gradients(self.model, self.optimizer, self.scheduler, None, 1.0)

    def timed_steps(self, micro_batch: int, warmup: int, steps: int, deadline: float) -> list[float]:
        """Seconds of each of up to ``steps`` steps after ``warmup`` untimed ones; stops at the
        deadline (OutOfTime when not one step was timed)."""
        times: list[float] = []
        for i in range(warmup + steps):
            if time.monotonic() > deadline:
                if times:
                    break
                raise OutOfTime(f"deadline reached after {i} of {warmup} warm-up steps")
            sync(self.device)
            start = time.perf_counter()
            self.step(micro_batch)
            sync(self.device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return times


def hf_twin(preset: str, seq_len: int) -> dict[str, Any]:
    """The preset's shape as a Hugging Face Llama ``config.json`` (``model.hf_config``)."""
    from trainer.config.hf import llama_config_keys
    from trainer.presets import PRESETS

    args = PRESETS[preset].with_vocab(VOCAB)
    return {"model_type": "llama", **llama_config_keys(args), "max_position_embeddings": seq_len}


def peak_gib(device) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def peak_reserved_gib(device) -> float | None:
    """The caching allocator's peak reservation: what ``nvidia-smi`` shows the process using."""
    import torch

    return torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None


class tf32:
    """Within the block, fp32 matmuls and convolutions run on TF32 tensor cores or not."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        import torch

        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.enabled

    def __exit__(self, *exc):
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


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
    deadline: float,
    hf: bool = False,
) -> dict[str, Any]:
    """Tokens/s, FLOPs/token and peak memory of the trainer's step (weights, moments included);
    ``hf``: the preset's Hugging Face twin (:func:`hf_twin`)."""
    import torch

    reset_peak(device)
    trainee = Trainee(preset, precision, ac, compiled, seq_len, device, hf=hf)
    try:
        times = trainee.timed_steps(micro_batch, warmup, steps, deadline)
        step_s = statistics.median(times)
        return {
            "preset": preset,
            "model": trainee.built.source,
            "precision": precision,
            "activation_checkpointing": ac,
            "compile": compiled,
            "micro_batch": micro_batch,
            "seq_len": seq_len,
            "params": trainee.built.param_count,
            "timed_steps": len(times),
            "step_s": step_s,
            "tokens_per_s": micro_batch * seq_len / step_s,
            "flops_per_token": trainee.built.flops_per_token(seq_len),
            "peak_mem_gib": peak_gib(device),
            "peak_reserved_gib": peak_reserved_gib(device),
        }
    finally:
        del trainee
        if compiled:
            torch._dynamo.reset()
        free_memory(device)


def fits_in_memory(preset: str, precision: str, ac: str, seq_len: int, device) -> Callable[[int], bool]:
    """``fits(b)``: whether a training step at micro batch ``b`` runs without running out of
    device memory. The model is kept between probes that fit and rebuilt after one that did
    not (a step cut short leaves FSDP's state half way)."""
    import torch

    box: dict[str, Any] = {}

    def fits(b: int) -> bool:
        if "trainee" not in box:
            box["trainee"] = Trainee(preset, precision, ac, False, seq_len, device)
            box["trainee"].step(1)  # the AdamW moments exist before any probe
        try:
            box["trainee"].step(b)
            sync(device)
            return True
        except torch.cuda.OutOfMemoryError:
            pass  # freed below: inside the handler its traceback still holds the step's tensors
        box.clear()
        free_memory(device)
        return False

    fits.release = lambda: (box.clear(), free_memory(device))  # type: ignore[attr-defined]
    return fits


# ------------------------------------------------------------------------------ sections
def section_matmul(plan: Plan, device, deadline: float) -> dict[str, Any]:
    import torch

    return {
        "bf16_tflops": matmul_tflops(device, plan.matmul_n, plan.matmul_iters),
        "dtype": str(torch.bfloat16),
    }


def section_throughput(
    plan: Plan, device, deadline: float, measured: float | None, spec: float | None
) -> dict:
    rows, skipped = [], []
    for compiled in (False, True):
        for ac in ("none", "full"):
            # A compiled row needs its compile time too: start it only with a minute in hand.
            reserve = 60 if compiled and device.type == "cuda" else 0
            if time.monotonic() + reserve > deadline:
                skipped.append(
                    {"compile": compiled, "activation_checkpointing": ac, "why": "section time cap"}
                )
                continue
            warmup = plan.warmup + (plan.compile_warmup if compiled else 0)
            row = measure(
                plan.big,
                "bf16",
                ac,
                compiled,
                plan.micro_batch,
                plan.seq,
                plan.steps,
                warmup,
                device,
                deadline,
            )
            rows.append(with_mfu(row, measured, spec))
            r = rows[-1]
            print(
                f"{plan.big} bf16 seq {plan.seq} ac={ac} compile={compiled}: {r['tokens_per_s']:,.0f} tok/s, "
                f"MFU {r['mfu_vs_989']:.1%} of 989, {r['mfu_vs_790']:.1%} of 790, "
                f"peak {r['peak_mem_gib'] or 0:.1f} GiB",
                flush=True,
            )
    hf_row = None
    if time.monotonic() + (20 if device.type == "cuda" else 0) > deadline:
        skipped.append({"model": "hf", "why": "section time cap"})
    else:
        hf_row = with_mfu(
            measure(
                plan.big,
                "bf16",
                "none",
                False,
                plan.micro_batch,
                plan.seq,
                plan.steps,
                plan.warmup,
                device,
                deadline,
                hf=True,
            ),
            measured,
            spec,
        )
        preset_row = next(
            (r for r in rows if (r["activation_checkpointing"], r["compile"]) == ("none", False)), None
        )
        if preset_row is not None:
            hf_row["step_time_ratio_vs_preset"] = hf_row["step_s"] / preset_row["step_s"]
        print(
            f"{plan.big} as a Hugging Face Llama, bf16 seq {plan.seq}: {hf_row['tokens_per_s']:,.0f} tok/s, "
            f"MFU {hf_row['mfu_vs_989']:.1%} of 989; step time x{hf_row.get('step_time_ratio_vs_preset', float('nan')):.3f} "
            "of the preset's",
            flush=True,
        )
    return {"rows": rows, "hf_row": hf_row, "rows_skipped": skipped}


def counted_flops_per_token(preset: str, seq_len: int, device, hf: bool) -> tuple[float, float]:
    """(FLOPs per token ``torch.utils.flop_counter`` counts in one training step at micro batch 1,
    the trainer's formula for the same model)."""
    from torch.utils.flop_counter import FlopCounterMode

    trainee = Trainee(preset, "bf16", "none", False, seq_len, device, hf=hf)
    try:
        trainee.step(1)  # outside the count: the optimizer's lazy state, the first-call setup
        with FlopCounterMode(display=False) as counter:
            trainee.step(1)
        return counter.get_total_flops() / seq_len, trainee.built.flops_per_token(seq_len)
    finally:
        del trainee
        free_memory(device)


def section_flops_check(plan: Plan, device, deadline: float) -> dict:
    out: dict[str, Any] = {}
    for name, hf in (("preset", False), ("hf", True)):
        if time.monotonic() > deadline:
            out[name] = {"skipped": "section time cap"}
            continue
        counted, formula = counted_flops_per_token(plan.big, plan.seq, device, hf)
        out[name] = {
            "counted_per_token": counted,
            "formula_per_token": formula,
            "formula_over_counted": formula / counted,
        }
        print(
            f"{plan.big} ({name}) seq {plan.seq}: flop_counter {counted:.4g} FLOPs/token, the MFU formula "
            f"{formula:.4g}: x{formula / counted:.3f}",
            flush=True,
        )
    return out


def section_seed_claim(
    plan: Plan, device, deadline: float, measured: float | None, spec: float | None
) -> dict:
    """The seed's statement: fp32 (TF32 off) at micro batch 8 against bf16 + full activation
    checkpointing at micro batch 16; fp32 with TF32 on at 8 beside them."""
    runs = (
        ("fp32", "none", plan.claim_fp32_micro_batch, False),
        ("bf16", "full", plan.claim_bf16_micro_batch, False),
        ("fp32", "none", plan.claim_fp32_micro_batch, True),
    )
    rows = []
    for precision, ac, micro_batch, use_tf32 in runs:
        if rows and time.monotonic() > deadline:
            break
        with tf32(use_tf32):
            row = measure(
                plan.claim,
                precision,
                ac,
                False,
                micro_batch,
                plan.claim_seq,
                plan.steps,
                plan.warmup,
                device,
                deadline,
            )
        rows.append({**with_mfu(row, measured, spec), "tf32": use_tf32 if precision == "fp32" else None})
    fp32, bf16 = rows[0], rows[1]

    def ratio(key: str) -> float | None:
        return bf16[key] / fp32[key] if fp32.get(key) else None

    memory, reserved = ratio("peak_mem_gib"), ratio("peak_reserved_gib")
    speedup = bf16["tokens_per_s"] / fp32["tokens_per_s"]
    print(
        f"{plan.claim} seq {plan.claim_seq}: fp32 (TF32 off) micro batch {plan.claim_fp32_micro_batch} -> bf16 + "
        f"full AC micro batch {plan.claim_bf16_micro_batch}: memory x{memory or float('nan'):.2f} allocated, "
        f"x{reserved or float('nan'):.2f} reserved; throughput x{speedup:.2f} (claimed: x0.5 and x1.7)",
        flush=True,
    )
    largest = {}
    modes = (("fp32", "none"), ("bf16", "full"))
    for i, (precision, ac) in enumerate(modes):
        share_end = time.monotonic() + (deadline - time.monotonic()) / (len(modes) - i)
        fits = fits_in_memory(plan.claim, precision, ac, plan.claim_seq, device)
        try:
            with tf32(False):
                found = largest_fitting(
                    fits,
                    plan.search_start,
                    plan.search_cap,
                    lambda end=share_end: end - time.monotonic(),
                    probe_s=rows[i]["step_s"] * 2,  # a rebuild and a step
                )
        finally:
            fits.release()  # type: ignore[attr-defined]
        largest[f"{precision}_ac_{ac}"] = found
        print(
            f"{plan.claim} {precision} ac={ac}: largest micro batch that fits {found['largest_fitting']}"
            + ("" if found["exact"] else f" or more ({found['stopped']})"),
            flush=True,
        )
    return {
        "rows": rows,
        "memory_ratio_bf16_ac_over_fp32": memory,
        "reserved_ratio_bf16_ac_over_fp32": reserved,
        "throughput_ratio_bf16_ac_over_fp32": speedup,
        "largest_micro_batch": largest,
    }


def _checkpoint_states(trainee: Trainee, device):
    from trainer.state import TrainState, checkpoint_states

    state = TrainState(device)
    return state, checkpoint_states(trainee.model, trainee.optimizer, trainee.scheduler, None, state)


def state_bytes(trainee: Trainee) -> int:
    """Bytes of the weights and the optimizer's tensors, this rank's shards (the checkpoint's size)."""
    import torch

    total = 0
    for p in trainee.model.parameters():
        total += p.numel() * p.element_size()
        for value in trainee.optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def section_checkpoint(plan: Plan, device, deadline: float, scratch: Path) -> dict[str, Any]:
    """Async saves every ``save_every`` steps (blocked time per save), then an emergency save."""
    from trainer.checkpoint.save import Checkpointer
    from trainer.storage import open_storage

    run_uri = f"file://{scratch / 'run'}"
    trainee = Trainee(plan.big, "bf16", "none", False, plan.seq, device)
    try:
        trainee.step(plan.ckpt_micro_batch)  # the AdamW moments exist from here on
        size = state_bytes(trainee)
        free = shutil.disk_usage(scratch).free
        # Two checkpoints at a time at most (keep 1: a new one commits before the old one is
        # pruned; the resume's copy of the last one), and some room.
        if free < 2.2 * size:
            return {
                "skipped": f"needs {2.2 * size / 2**30:.0f} GiB free in {scratch}, has {free / 2**30:.0f}"
            }
        state, states = _checkpoint_states(trainee, device)
        meta = {"model": trainee.built.spec, "data_uri": "bench", "precision": "bf16"}
        ckpt = Checkpointer(open_storage(run_uri), run_uri, 0, 1, keep=1, states=states, meta=meta, attempt=1)
        step_times, saves = [], []
        for _ in range(plan.saves):
            if time.monotonic() > deadline:
                break
            for _ in range(plan.save_every):
                sync(device)
                start = time.perf_counter()
                trainee.step(plan.ckpt_micro_batch)
                sync(device)
                step_times.append(time.perf_counter() - start)
                state.step += 1
            blocked = ckpt.save_async(state.step)  # the wait for the previous save included
            saves.append(
                {
                    "step": state.step,
                    "blocked_s": blocked.total_s,
                    "waited_s": blocked.waited_s,
                    "staged_s": blocked.staged_s,
                }
            )
        if not saves:
            raise OutOfTime("no save started before the section's deadline")
        drained = time.monotonic()
        ckpt.wait()
        drain_s = time.monotonic() - drained
        step_s = statistics.median(step_times)
        for save in saves:
            save["blocking_steps"] = save["blocked_s"] / step_s
        emergency_s: float | None = None
        emergency_skipped = None
        # An emergency save writes what an async one does, unhidden: about its staging plus the drain.
        if time.monotonic() + 2 * (max(s["blocked_s"] for s in saves) + drain_s) > deadline:
            emergency_skipped = f"section time cap of the checkpoint section, after {len(saves)} async saves"
        else:
            state.step += 1
            started = time.monotonic()
            ckpt.save(state.step)  # the emergency save: synchronous, as on a preemption notice
            emergency_s = time.monotonic() - started
        print(
            f"checkpoint of {plan.big} ({size / 2**30:.1f} GiB): blocked "
            + ", ".join(f"{s['blocked_s']:.2f}s" for s in saves)
            + f" per async save (step {step_s:.2f}s); emergency save "
            + (f"{emergency_s:.1f}s" if emergency_s is not None else f"skipped ({emergency_skipped})"),
            flush=True,
        )
        return {
            "preset": plan.big,
            "micro_batch": plan.ckpt_micro_batch,
            "seq_len": plan.seq,
            "state_bytes": size,
            "run_uri": run_uri,
            "step_s": step_s,
            "save_every_steps": plan.save_every,
            "saves": saves,
            "blocking_steps_max": max(s["blocking_steps"] for s in saves),
            "last_save_drain_s": drain_s,
            "emergency_s": emergency_s,
            "emergency_gb_s": size / emergency_s / 1e9 if emergency_s else None,
            "emergency_skipped": emergency_skipped,
            "committed_step": state.step,
        }
    finally:
        del trainee
        free_memory(device)


def section_resume(plan: Plan, deadline: float, scratch: Path, checkpoint: dict) -> dict[str, Any]:
    """A new process resumes from the committed checkpoint and takes one step."""
    if not checkpoint.get("committed_step"):
        return {"skipped": "no committed checkpoint: the checkpoint section did not finish"}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--resume-child",
        checkpoint["run_uri"],
        "--child-preset",
        plan.big,
        "--child-seq",
        str(plan.seq),
        "--child-micro-batch",
        str(plan.ckpt_micro_batch),
    ]
    environ = {**os.environ, "TRAINOPS_CACHE_DIR": str(scratch / "resume-cache")}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    report, tail = None, []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith(CHILD_MARK):
                total = time.monotonic() - started
                report = {**json.loads(line[len(CHILD_MARK) :]), "process_start_to_first_step_s": total}
                break
            tail = [*tail[-30:], line.rstrip()]
            if time.monotonic() > deadline:
                break
        proc.wait(timeout=max(5.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if report is None:
        raise RuntimeError(f"the resume child gave no report (exit {proc.returncode}):\n" + "\n".join(tail))
    if report.get("resumed_step") != checkpoint["committed_step"]:
        raise RuntimeError(
            f"the resume child resumed step {report.get('resumed_step')}, not the committed "
            f"{checkpoint['committed_step']}"
        )
    print(
        f"resume: {report['process_start_to_first_step_s']:.1f}s from process start to the end of the first "
        f"step (load {report['load_s']:.1f}s)",
        flush=True,
    )
    return report


def resume_child(run_uri: str, preset: str, seq_len: int, micro_batch: int) -> None:
    """The resume section's process: what an attempt does before its first step, timed."""
    phases: dict[str, float] = {}
    mark = STARTED  # imports_s: from this module's first line, torch and the trainer included

    def lap(name: str) -> None:
        nonlocal mark
        now = time.time()
        phases[name] = now - mark
        mark = now

    from trainer import parallel  # torch with it: its import is part of what a resume costs
    from trainer.checkpoint.fence import raise_fence
    from trainer.checkpoint.save import Checkpointer
    from trainer.contract import RunLayout
    from trainer.storage import open_storage

    lap("imports_s")
    env = parallel.init_distributed()
    lap("process_group_s")
    storage = open_storage(run_uri)
    raise_fence(storage, RunLayout(run_uri), 2)  # a new attempt fences off the old one first
    trainee = Trainee(preset, "bf16", "none", False, seq_len, env.device)
    sync(env.device)
    lap("build_s")
    _, states = _checkpoint_states(trainee, env.device)
    ckpt = Checkpointer(storage, run_uri, 0, 1, keep=1, states=states, attempt=2)
    step = ckpt.load_latest()
    sync(env.device)
    lap("load_s")
    trainee.step(micro_batch)
    sync(env.device)
    lap("first_step_s")
    print(
        CHILD_MARK
        + json.dumps({"resumed_step": step, **phases, "since_module_start_s": time.time() - STARTED})
    )
    sys.stdout.flush()
    parallel.shutdown()


def run_section(results: dict, name: str, budget: Budget, cap: float, work: Callable[[float], Any]) -> Any:
    """``work(deadline)`` within ``cap`` seconds and the run's budget; its result, or a
    ``skipped`` / ``error`` entry in ``results``."""
    if budget.left() < min(cap, 10.0):
        results[name] = {"skipped": f"the run's budget is spent ({budget.left():.0f}s left)"}
        return None
    started = time.monotonic()
    try:
        out = work(budget.deadline(cap))
    except OutOfTime as exc:
        out = {"skipped": f"section time cap of {cap:.0f}s: {exc}"}
    except Exception as exc:
        import traceback

        traceback.print_exc()
        out = {"error": f"{type(exc).__name__}: {exc}"}
    out = dict(out) if isinstance(out, dict) else {"value": out}
    out["section_s"] = time.monotonic() - started
    results[name] = out
    return out


def use_eager_compile() -> None:
    """On a CPU (``--smoke``) compile with the eager backend: Dynamo traces every block as on a
    GPU, without minutes of C++ code generation."""
    import functools

    from torch import nn

    nn.Module.compile = functools.partialmethod(nn.Module.compile, backend="eager")  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or str(Path(__file__).parent / "results"))
    p.add_argument("--smoke", action="store_true", help="CPU, tiny preset, few steps: check the script")
    p.add_argument(
        "--budget-s", type=float, default=None, help="the sections' seconds in all (default 440; smoke 200)"
    )
    p.add_argument("--scratch", default=None, help="local-disk folder for checkpoints (default: a temp dir)")
    p.add_argument("--sections", default="matmul,throughput,flops_check,seed_claim,checkpoint,resume")
    p.add_argument("--resume-child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-preset", default="1b", help=argparse.SUPPRESS)
    p.add_argument("--child-seq", type=int, default=2048, help=argparse.SUPPRESS)
    p.add_argument("--child-micro-batch", type=int, default=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.resume_child:
        resume_child(a.resume_child, a.child_preset, a.child_seq, a.child_micro_batch)
        return

    import torch

    from trainer import parallel
    from trainer.flops import peak_flops

    if not a.smoke and not torch.cuda.is_available():
        sys.exit("bench/gpu.py needs CUDA (use --smoke to check it on the CPU)")
    plan = SMOKE if a.smoke else REAL
    budget = Budget(a.budget_s or (200.0 if a.smoke else 440.0))
    wanted = set(a.sections.split(","))
    if a.smoke:
        torch.set_num_threads(min(2, torch.get_num_threads()))
        use_eager_compile()
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 runs on TF32 unless a row says otherwise
    torch.backends.cudnn.allow_tf32 = True
    env = parallel.init_distributed()  # a world of one, as FSDP2 wants a process group
    device = env.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    spec = peak_flops(name if device.type == "cuda" else None, "bf16")
    spec_tflops = spec / 1e12 if spec else None
    scratch = Path(a.scratch or tempfile.mkdtemp(prefix="trainops-gpu-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    os.environ["TRAINOPS_CACHE_DIR"] = str(scratch / "cache")
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": name,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "smoke": a.smoke,
        "compile_backend": "eager" if a.smoke else "inductor",
        "budget_s": budget.total_s,
        "bf16_spec_peak_tflops": spec_tflops,
        "mfu_references_tflops": {"spec": SPEC_BF16_TFLOPS, "measured_h200_ceiling": MEASURED_BF16_TFLOPS},
    }
    sections: dict[str, Callable[[float], Any]] = {
        "matmul": lambda d: section_matmul(plan, device, d),
        "throughput": lambda d: section_throughput(plan, device, d, measured(), spec_tflops),
        "flops_check": lambda d: section_flops_check(plan, device, d),
        "seed_claim": lambda d: section_seed_claim(plan, device, d, measured(), spec_tflops),
        "checkpoint": lambda d: section_checkpoint(plan, device, d, scratch),
        "resume": lambda d: section_resume(plan, d, scratch, results.get("checkpoint") or {}),
    }

    def measured() -> float | None:
        return (results.get("matmul") or {}).get("bf16_tflops")

    try:
        for section, work in sections.items():
            if section in wanted:
                run_section(results, section, budget, plan.caps[section], work)
            else:
                results[section] = {"skipped": "not in --sections"}
    finally:
        if not a.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        parallel.shutdown()
    results["total_s"] = time.monotonic() - budget.started
    path = output_path(a.out, results["date"][:10], name, a.smoke)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"results: {path}")
    rows = (results.get("throughput") or {}).get("rows") or []
    if rows:
        best = max(rows, key=lambda r: r["tokens_per_s"])
        print(f"mfu_{plan.big}_vs_989={best['mfu_vs_989']:.3f}")
        print(f"mfu_{plan.big}_vs_790={best['mfu_vs_790']:.3f}")
    failed = [s for s in sections if "error" in (results.get(s) or {})]
    if failed:
        sys.exit(f"bench/gpu.py: sections failed: {', '.join(failed)} (see {path})")


if __name__ == "__main__":
    main()
