"""Where a training step's time goes: trainops' model and step against torchtitan's Llama, and
what each fp32 upcast of the model keeps in memory.

The step: the ``small`` preset's shapes by default, bf16 as the trainer runs it (FSDP2 mixed
precision: fp32 parameters, bf16 compute, fp32 reduction), forward, backward, clip and AdamW on
fixed random tokens; one process (a world of one, gloo), or every rank under torchrun. The
trainer's side is its own code: ``trainer.train.build_sharded_model`` (meta init,
``parallel.parallelize``), ``trainer.optim.build_optimizer`` and ``trainer.step``. torchtitan's
side, when its package is importable, is its ``Llama3Model`` on the same shapes (fused QKV,
complex RoPE, ``nn.RMSNorm``; SDPA, because its language-model registry insists on flex
attention, which on a CPU is not what a GPU runs), its default fused AdamW and its loss (fp32
logits, summed over tokens, divided by the tokens).

Runners are timed in interleaved rounds (ours, theirs, ours, ...) on a shared machine; it prints
median wall and CPU times (CPU time, this process's, is the steadier figure under others' load),
the phases' CPU shares (forward, backward, optimizer) and ``name=value`` ratios against the
trainer from the same run; ``--profile`` adds ``torch.profiler`` tables sorted by self CPU time
and, per runner, the ops whose time differs most from the trainer's::

    .venv/bin/python bench/profile_step.py [--rounds 5] [--variants old_adamw] [--profile]
    # torchtitan 0.3.0 from its unpacked wheel (and spmd_types, einops, tyro), not installed
    # into the project's virtualenv; its Triton-only MoE module is stubbed without Triton:
    PYTHONPATH=$PWD:/path/to/torchtitan-site .venv/bin/python bench/profile_step.py
    torchrun --standalone --nproc-per-node=2 bench/profile_step.py   # confirm on 2 ranks

``--variants`` adds the trainer with single parts as they were before #14 (``old_norm``:
RMSNorm written with autograd; ``old_rope``: two fp32 copies per rotation; ``old_adamw``:
foreach AdamW), so each part's cost is a ratio from the same run. ``--memory`` prints instead
the bytes autograd keeps per token with each upcast on and off (docs/models.md, "Precision and
memory").
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# How profiler rows are grouped into the parts the issue asks about (first match wins).
OP_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # foreach AdamW over DTensors dispatches one op per tensor: these are its.
    ("optimizer", ("adam", "_foreach", "optimizer.step", "lerp_", "addcdiv_", "addcmul_", "aten::sqrt")),
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "bmm")),
    ("norm", ("rms_norm", "rsqrt", "pow", "mean")),
    ("rope", ("view_as_complex", "view_as_real", "polar", "stack", "complex")),
    ("loss", ("cross_entropy", "log_softmax", "nll_loss")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear")),
    ("fsdp", ("fsdp", "all_gather", "reduce_scatter", "split_with_sizes_copy", "chunk_cat")),
    ("cast", ("aten::_to_copy", "aten::copy_", "aten::to")),
)


VARIANTS = ("old_norm", "old_rope", "old_adamw")


@dataclass
class Runner:
    """One model and optimizer, and how to take a step with them."""

    name: str
    step: Callable[[], dict[str, float]]  # one step; seconds per phase
    times: list[dict[str, float]] = field(default_factory=list)


def stub_torchtitan_triton() -> None:
    """torchtitan 0.3.0 imports its expert-parallel MoE kernels, written in Triton, whenever
    its models are imported. A dense Llama never runs them, so without Triton (a CPU-only
    machine) the module is replaced by names that refuse to run."""
    if importlib.util.find_spec("triton") is not None:
        return
    stub = types.ModuleType("torchtitan.distributed.minimal_async_ep")

    def refuse(*args, **kwargs):
        raise RuntimeError("torchtitan's minimal_async_ep needs Triton, which this machine lacks")

    class MinimalAsyncEPDispatchMetadata:
        pass

    stub.combine_op = stub.dispatch_op = stub.init_buffer = refuse  # type: ignore[attr-defined]
    stub.maybe_update_minimal_async_ep_config = refuse  # type: ignore[attr-defined]
    stub.MinimalAsyncEPDispatchMetadata = MinimalAsyncEPDispatchMetadata  # type: ignore[attr-defined]
    sys.modules[stub.__name__] = stub


def torchtitan_available() -> bool:
    return importlib.util.find_spec("torchtitan") is not None


def timed_phases(forward: Callable, backward: Callable, optimize: Callable) -> dict[str, float]:
    """Wall and CPU seconds (this process's, all threads) of each phase and of the step.

    CPU time is the steadier figure on a shared machine: other processes' load stretches the
    wall time of a single-threaded step, not its CPU time."""
    out: dict[str, float] = {}
    marks = [(time.perf_counter(), time.process_time())]
    loss = forward()
    marks.append((time.perf_counter(), time.process_time()))
    backward(loss)
    marks.append((time.perf_counter(), time.process_time()))
    optimize()
    marks.append((time.perf_counter(), time.process_time()))
    for i, phase in enumerate(("forward", "backward", "optimizer")):
        out[phase] = marks[i + 1][0] - marks[i][0]
        out[f"{phase}_cpu"] = marks[i + 1][1] - marks[i][1]
    out["step"] = marks[-1][0] - marks[0][0]
    out["step_cpu"] = marks[-1][1] - marks[0][1]
    return out


def trainops_runner(name: str, args, tokens, *, variant: str = "") -> Runner:
    """The trainer's own setup and step; ``variant`` swaps one part back to the old code."""
    import torch
    import torch.nn.functional as F

    from trainer import step as step_module
    from trainer.config import Config, ModelConfig, TrainConfig
    from trainer.models import llama as model_module
    from trainer.optim import build_optimizer, build_scheduler
    from trainer.train import build_sharded_model

    config = Config(
        precision=args.precision,
        seed=1234,
        model=ModelConfig(preset=args.preset),
        train=TrainConfig(micro_batch_size=args.micro_batch, seq_len=args.seq_len),
    )
    built = build_sharded_model(config, args.env, args.vocab)
    model = built.model
    optimizer = build_optimizer(model, 1e-4, 0.1)
    if variant == "old_adamw":  # the same groups, the default (foreach) implementation
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
        optimizer = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    scheduler = build_scheduler(optimizer, warmup_steps=10, max_steps=1000, min_lr_ratio=0.1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    patched = {"old_norm": "norm", "old_rope": "rope"}.get(variant)

    def forward():
        with swapped(model_module, patched):
            logits = model(inputs)
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def backward(loss):
        with swapped(model_module, patched):
            loss.backward()

    def optimize():
        step_module.apply_gradients(model, optimizer, scheduler, None, 1.0)

    # forward_backward is the trainer's: its loss is the one above (checked once here).
    with swapped(model_module, patched):
        check = step_module.forward_backward(model, [(inputs, targets)], 1)
    optimizer.zero_grad(set_to_none=True)
    if not torch.isfinite(check):
        raise RuntimeError(f"{name}: the trainer's first loss is {check.item()}")
    return Runner(name, lambda: timed_phases(forward, backward, optimize))


# ------------------------------------------------------------------ the parts before #14
_NEW: dict[str, object] = {}


def legacy_rms_norm_forward(self, x):
    out = x.float() * __import__("torch").rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
    return out.type_as(x) * self.weight


def legacy_apply_rope(x, cos, sin):
    import torch

    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def remember_model_module() -> None:
    from trainer.models import llama as model_module

    _NEW.update(norm=model_module.RMSNorm.forward, rope=model_module.apply_rope)


def restore_model_module(model_module) -> None:
    model_module.RMSNorm.forward = _NEW["norm"]
    model_module.apply_rope = _NEW["rope"]


class swapped:
    """Within the block, the model module runs the old part ``which`` (norm | rope | None)."""

    def __init__(self, model_module, which: str | None):
        self.module, self.which = model_module, which

    def __enter__(self):
        if self.which == "norm":
            self.module.RMSNorm.forward = legacy_rms_norm_forward
        elif self.which == "rope":
            self.module.apply_rope = legacy_apply_rope

    def __exit__(self, *exc):
        restore_model_module(self.module)


def torchtitan_runner(args, tokens) -> Runner:
    """torchtitan 0.3.0's Llama3 on the preset's shapes, sharded with the same FSDP2 policy."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    stub_torchtitan_triton()
    from torchtitan.models import llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention

    from trainer.presets import PRESETS

    preset = PRESETS[args.preset]
    dim, heads = preset.dim, preset.n_heads
    # Its registry refuses SDPA for language models (flex or varlen only); the shapes and the
    # causal mask are the same, and the comparison is then of everything around attention.
    llama3.get_attention_config = lambda backend: ScaledDotProductAttention.Config()
    config = llama3.Llama3Model.Config(
        dim=dim,
        vocab_size=args.vocab,
        tok_embeddings=Embedding.Config(
            num_embeddings=args.vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT
        ),
        norm=RMSNorm.Config(normalized_shape=dim, eps=preset.norm_eps, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(
            in_features=dim, out_features=args.vocab, param_init=llama3._output_linear_init(dim)
        ),
        layers=llama3._build_llama3_layers(
            fuse_qkv=True,
            n_layers=preset.n_layers,
            dim=dim,
            n_heads=heads,
            n_kv_heads=preset.n_kv_heads,
            hidden_dim=preset.hidden,
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=args.seq_len, theta=preset.rope_theta),
            attn_backend="sdpa",
        ),
    )
    torch.manual_seed(1234)
    model = config.build()
    model.init_states()
    if args.precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    # torchtitan's default implementation is "fused" (OptimizersContainer.Config).
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True
    )
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def forward():
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), targets.flatten(0, 1), reduction="sum"
        )
        return loss / targets.numel()

    def backward(loss):
        loss.backward()

    def optimize():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Runner("torchtitan", lambda: timed_phases(forward, backward, optimize))


def profile_steps(runners: list[Runner], steps: int) -> dict[str, object]:
    """``steps`` profiled steps of each runner, interleaved (one of each in turn), so that a
    burst of load on the shared machine falls on every runner alike."""
    from torch.profiler import ProfilerActivity, profile

    events: dict[str, list] = {r.name: [] for r in runners}
    for _ in range(steps):
        for runner in runners:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                runner.step()
            events[runner.name].append(prof)
    return events


def op_summary(profiles: list, rows: int) -> tuple[str, dict[str, float], dict[str, tuple[float, int]]]:
    """Profiled steps' table (the median step's, sorted by self CPU time), each op group's
    share, and each op's self CPU seconds and calls per step (medians over the steps)."""
    per_step = []
    for prof in profiles:
        per_step.append({e.key: (e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()})
    totals = [sum(t for t, _ in ops.values()) for ops in per_step]
    middle = sorted(range(len(totals)), key=totals.__getitem__)[len(totals) // 2]
    table = profiles[middle].key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    keys = set().union(*per_step)
    ops = {
        k: (statistics.median(s.get(k, (0.0, 0))[0] for s in per_step), per_step[middle].get(k, (0.0, 0))[1])
        for k in keys
    }
    total = sum(t for t, _ in ops.values()) or 1.0
    shares: dict[str, float] = {}
    for key, (seconds, _) in ops.items():
        low = key.lower()
        group = next((g for g, needles in OP_GROUPS if any(n.lower() in low for n in needles)), "other")
        shares[group] = shares.get(group, 0.0) + seconds / total
    return table, shares, ops


def gap_table(ours: dict[str, tuple[float, int]], theirs: dict[str, tuple[float, int]], rows: int) -> str:
    """The ops whose self CPU time differs most between two profiled steps, largest first."""
    keys = sorted(
        set(ours) | set(theirs), key=lambda k: -abs(ours.get(k, (0, 0))[0] - theirs.get(k, (0, 0))[0])
    )
    lines = [f"{'op':<60} {'ours ms':>9} {'calls':>6} {'theirs ms':>9} {'calls':>6} {'diff ms':>8}"]
    for key in keys[:rows]:
        (a, na), (b, nb) = ours.get(key, (0.0, 0)), theirs.get(key, (0.0, 0))
        lines.append(f"{key[:60]:<60} {a * 1e3:9.1f} {na:6d} {b * 1e3:9.1f} {nb:6d} {(a - b) * 1e3:8.1f}")
    return "\n".join(lines)


# ------------------------------------------------------------------ memory per upcast
def bf16_rms_norm_forward(self, x):
    """RMSNorm with its statistics in the compute dtype (no upcast), for the memory table."""
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def bf16_apply_rope(x, cos, sin):
    """RoPE in the compute dtype (no upcast), for the memory table."""
    import torch

    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


NORMS = {"fp32_stats": None, "fp32_autograd": legacy_rms_norm_forward, "bf16": bf16_rms_norm_forward}
ROPES = {"fp32": None, "bf16": bf16_apply_rope}


def saved_activation_bytes(
    args, tokens, *, norm: str, rope: str, logits: str, checkpointed: bool, dtype
) -> tuple[int, int]:
    """Bytes autograd keeps for backward after one forward and the loss, parameters excluded
    (each storage counted once), and the most one block re-materialises in backward when
    ``checkpointed``. Counted with ``saved_tensors_hooks``: exact, and free of any allocator."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from trainer.models import llama as model_module

    torch.manual_seed(0)
    model = model_module.Transformer(args).to(dtype)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    if checkpointed:
        for i, block in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    if NORMS[norm] is not None:
        model_module.RMSNorm.forward = NORMS[norm]
    if ROPES[rope] is not None:
        model_module.apply_rope = ROPES[rope]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(tokens[:, :-1])
            out = out.float() if logits == "fp32" else out
            F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten())
        total = sum(seen.values())
        block = 0
        if checkpointed:  # one block's own saved tensors, as its recomputation keeps them
            seen.clear()
            inner = model.layers[0]._checkpoint_wrapped_module
            h = torch.randn(tokens.shape[0], tokens.shape[1] - 1, args.dim, dtype=dtype, requires_grad=True)
            cos, sin = model_module.rope_tables(h.shape[1], args.head_dim, args.rope_theta, h.device)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                inner(h, cos, sin)
            block = sum(seen.values())
    finally:
        restore_model_module(model_module)
    return total, block


def memory_table(a) -> None:
    """Saved activation bytes per token for each upcast on and off, on ``--memory-preset``
    (per-block bytes from 1 and 2 blocks of its shape, scaled to its depth)."""
    import dataclasses

    import torch

    from trainer.presets import PRESETS

    preset = PRESETS[a.memory_preset].with_vocab(a.memory_vocab)
    tokens = torch.randint(
        0, preset.vocab_size, (1, a.memory_seq + 1), generator=torch.Generator().manual_seed(0)
    )
    n = a.memory_seq
    cases = [
        ("trainops (after #14)", {"norm": "fp32_stats", "rope": "fp32", "logits": "fp32"}),
        (
            "RMSNorm upcast by autograd (before #14)",
            {"norm": "fp32_autograd", "rope": "fp32", "logits": "fp32"},
        ),
        ("RMSNorm in bf16", {"norm": "bf16", "rope": "fp32", "logits": "fp32"}),
        ("RoPE in bf16", {"norm": "fp32_stats", "rope": "bf16", "logits": "fp32"}),
        ("loss on bf16 logits", {"norm": "fp32_stats", "rope": "fp32", "logits": "bf16"}),
        ("fp32 compute (no mixed precision)", {"norm": "fp32_stats", "rope": "fp32", "logits": "fp32"}),
    ]
    print(
        f"\n=== saved activations, {a.memory_preset} (vocab {preset.vocab_size}, seq {n}), bf16 compute, "
        "bytes per token (model state excluded)"
    )
    print(f"{'case':<42} {'no AC':>10} {'full AC':>10} {'per block':>10}")
    for label, case in cases:
        figures = []
        dtype = torch.float32 if label.startswith("fp32") else torch.bfloat16
        for checkpointed in (False, True):
            one, two = (
                saved_activation_bytes(
                    dataclasses.replace(preset, n_layers=layers),
                    tokens,
                    checkpointed=checkpointed,
                    dtype=dtype,
                    **case,
                )
                for layers in (1, 2)
            )
            per_block = two[0] - one[0]
            total = one[0] + per_block * (preset.n_layers - 1) + (one[1] if checkpointed else 0)
            figures.append(total / n)
            if not checkpointed:
                block_bytes = per_block / n
        print(f"{label:<42} {figures[0]:10,.0f} {figures[1]:10,.0f} {block_bytes:10,.0f}")
        key = label.split(" (")[0].lower().replace(" ", "_")
        print(f"saved_bytes_per_token_no_ac[{key}]={figures[0]:.0f}")
        print(f"saved_bytes_per_token_full_ac[{key}]={figures[1]:.0f}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--vocab", type=int, default=257, help="the bench datasets' byte vocabulary")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="timed steps per model per round")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (the machine is shared)")
    p.add_argument("--profile", action="store_true", help="print torch.profiler tables")
    p.add_argument("--rows", type=int, default=18)
    p.add_argument("--profile-steps", type=int, default=3, help="profiled steps per model")
    p.add_argument(
        "--variants",
        default="",
        help="also time the trainer with parts before #14, comma-separated: old_norm, old_rope, old_adamw",
    )
    p.add_argument("--no-torchtitan", action="store_true")
    p.add_argument("--memory", action="store_true", help="only the saved-activation table per upcast")
    p.add_argument("--memory-preset", default="bert-large-size")
    p.add_argument("--memory-vocab", type=int, default=32000)
    p.add_argument("--memory-seq", type=int, default=512)
    return p


def _print_ratios(runners: list, out) -> None:
    """The median step and phase times of each runner, and their ratios to trainops'."""
    medians = {
        r.name: {phase: statistics.median(t[phase] for t in r.times) for phase in r.times[0]} for r in runners
    }
    base = medians["trainops"]
    for name, m in medians.items():
        spread = [t["step"] for t in next(r for r in runners if r.name == name).times]
        out(
            f"{name}: step {m['step'] * 1e3:.0f} ms wall (min {min(spread) * 1e3:.0f}, max {max(spread) * 1e3:.0f}), "
            f"{m['step_cpu'] * 1e3:.0f} ms CPU; CPU shares "
            + ", ".join(
                f"{ph} {m[ph + '_cpu'] / m['step_cpu']:.0%}" for ph in ("forward", "backward", "optimizer")
            ),
            flush=True,
        )
    for name, m in medians.items():
        if name == "trainops":
            continue
        suffix = "torchtitan" if name == "torchtitan" else name.removeprefix("trainops_")
        out(f"step_time_ratio_vs_{suffix}={base['step'] / m['step']:.3f}")
        out(f"step_cpu_time_ratio_vs_{suffix}={base['step_cpu'] / m['step_cpu']:.3f}")
        for phase in ("forward", "backward", "optimizer"):
            out(f"{phase}_cpu_time_ratio_vs_{suffix}={base[phase + '_cpu'] / m[phase + '_cpu']:.3f}")
    for phase in ("forward", "backward", "optimizer"):
        out(f"{phase}_cpu_share={base[phase + '_cpu'] / base['step_cpu']:.3f}")


def _print_profiles(runners: list, a: argparse.Namespace, out) -> None:
    """torch.profiler tables per runner, and where trainops and each other runner differ."""
    profiled = {}
    for name, profiles in profile_steps(runners, a.profile_steps).items():
        table, shares, profiled[name] = op_summary(profiles, a.rows)
        out(f"\n=== {name}: the median of {a.profile_steps} profiled steps, by self CPU time\n{table}")
        for group, share in sorted(shares.items(), key=lambda kv: -kv[1]):
            out(f"{name}_self_cpu_share_{group}={share:.3f}")
    for name, ops in profiled.items():
        if name != "trainops":
            out(f"\n=== where trainops and {name} differ (self CPU per step, medians)")
            out(gap_table(profiled["trainops"], ops, a.rows))


def main() -> None:
    p = _parser()
    a = p.parse_args()

    import torch

    from trainer import parallel

    torch.set_num_threads(a.threads)
    if a.memory:
        remember_model_module()
        memory_table(a)
        return
    # Under torchrun, its ranks (FSDP over all of them); else a world of one (FSDP2 wants a group).
    a.env = parallel.init_distributed()
    out = print if a.env.is_main else (lambda *args, **kwargs: None)
    remember_model_module()
    tokens = torch.randint(
        0, a.vocab, (a.micro_batch, a.seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    runners = [trainops_runner("trainops", a, tokens)]
    for variant in filter(None, a.variants.split(",")):
        if variant not in VARIANTS:
            p.error(f"--variants: unknown {variant!r}; pick from {', '.join(VARIANTS)}")
        runners.append(trainops_runner(f"trainops_{variant}", a, tokens, variant=variant))
    has_titan = torchtitan_available() and not a.no_torchtitan
    if has_titan:
        runners.append(torchtitan_runner(a, tokens))
    out(
        f"config: preset={a.preset} vocab={a.vocab} micro_batch={a.micro_batch} seq_len={a.seq_len} "
        f"precision={a.precision} threads={a.threads} torch={torch.__version__} "
        f"torchtitan={'yes' if has_titan else 'not importable'}",
        flush=True,
    )
    for runner in runners:  # warm-up: allocator, lazy optimizer state
        runner.step()
    for _ in range(a.rounds):
        for runner in runners:
            runner.times += [runner.step() for _ in range(a.steps)]
    _print_ratios(runners, out)
    if a.profile:
        _print_profiles(runners, a, out)
    parallel.shutdown()


if __name__ == "__main__":
    main()
