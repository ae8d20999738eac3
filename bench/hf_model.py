"""A Hugging Face model on the trainer against our preset of the same shape, and against a
hand-written FSDP2 loop over the same Hugging Face model: step-time ratios from one run.

Three runners take the same steps (forward, loss, backward, clip, AdamW) on the same random
tokens, one process (a world of one, gloo) or every rank under torchrun:

- ``preset``: the trainer on ``--preset`` (our Llama), its own setup and step
  (``trainer.train.build_sharded_model``, ``trainer.optim``, ``trainer.step``);
- ``hf``: the trainer on ``model.hf_config`` = the preset's shape as a Hugging Face Llama
  config (``trainer.config.hf.llama_config_keys``): the same code path, transformers' model;
- ``handwritten``: ``LlamaForCausalLM.from_config`` sharded by hand (``fully_shard`` on each
  decoder layer, then the root, the same mixed precision), fused AdamW, the loss in fp32.

Runners are timed in interleaved rounds (a burst of load on a shared machine falls on all
alike); it prints median wall and CPU times and ``name=value`` ratios from the same run::

    .venv/bin/python bench/hf_model.py [--preset small] [--precision fp32] [--rounds 3]
    torchrun --standalone --nproc-per-node=2 bench/hf_model.py

``hf_step_time_ratio_vs_preset`` is the figure issue #27 bounds (at most 1.05).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_step import Runner, timed_phases


def trainer_runner(name: str, a, tokens, model_config) -> Runner:
    """The trainer's own setup and step on ``model_config``."""
    import torch

    from trainer import step as step_module
    from trainer.config import Config, TrainConfig
    from trainer.optim import build_optimizer, build_scheduler
    from trainer.train import build_sharded_model

    config = Config(
        precision=a.precision,
        seed=1234,
        model=model_config,
        train=TrainConfig(micro_batch_size=a.micro_batch, seq_len=a.seq_len),
    )
    built = build_sharded_model(config, a.env, a.vocab)
    model = built.model
    optimizer = build_optimizer(model, 1e-4, 0.1)
    scheduler = build_scheduler(optimizer, warmup_steps=10, max_steps=1000, min_lr_ratio=0.1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    batch = [(inputs, targets)]
    loss_box: list[torch.Tensor] = []

    def forward():
        loss_box.append(step_module.forward_backward(model, batch, 1))  # forward and backward in one
        return loss_box[-1]

    def backward(loss):
        pass  # done in forward: the trainer's step issues both together

    def optimize():
        step_module.apply_gradients(model, optimizer, scheduler, None, 1.0)

    out = print if a.env.is_main else (lambda *args, **kwargs: None)
    out(f"{name}: {built.describe()}", flush=True)
    return Runner(name, lambda: timed_phases(forward, backward, optimize))


def handwritten_runner(a, tokens, hf_config: dict) -> Runner:
    """transformers' Llama sharded by hand, as a team would write the loop."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = {k: v for k, v in hf_config.items() if k != "model_type"}
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("llama", **keys), attn_implementation="sdpa"
    ).to(a.env.device)
    if a.precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True
    )
    inputs, targets = tokens[:, :-1].to(a.env.device), tokens[:, 1:].to(a.env.device)

    def forward():
        logits = model(input_ids=inputs, use_cache=False).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def backward(loss):
        loss.backward()

    def optimize():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Runner("handwritten", lambda: timed_phases(forward, backward, optimize))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--precision", default="fp32", choices=("bf16", "fp32"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="timed steps per runner per round")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()

    import torch

    from trainer import parallel
    from trainer.config import ModelConfig
    from trainer.config.hf import llama_config_keys
    from trainer.presets import PRESETS

    torch.set_num_threads(a.threads)
    a.env = parallel.init_distributed()
    out = print if a.env.is_main else (lambda *args, **kwargs: None)
    args = PRESETS[a.preset].with_vocab(a.vocab)
    hf_config = {"model_type": "llama", **llama_config_keys(args), "max_position_embeddings": a.seq_len}
    tokens = torch.randint(
        0, a.vocab, (a.micro_batch, a.seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    runners = [
        trainer_runner("preset", a, tokens, ModelConfig(preset=a.preset)),
        trainer_runner("hf", a, tokens, ModelConfig(hf_config=hf_config)),
        handwritten_runner(a, tokens, hf_config),
    ]
    out(
        f"config: preset={a.preset} vocab={a.vocab} micro_batch={a.micro_batch} seq_len={a.seq_len} "
        f"precision={a.precision} threads={a.threads} world={a.env.world_size} torch={torch.__version__}",
        flush=True,
    )
    for runner in runners:  # warm-up: allocator, lazy optimizer state
        runner.step()
    for _ in range(a.rounds):
        for runner in runners:
            runner.times += [runner.step() for _ in range(a.steps)]
    medians = {
        r.name: {k: statistics.median(t[k] for t in r.times) for k in ("step", "step_cpu")} for r in runners
    }
    for name, m in medians.items():
        out(f"{name}: step {m['step'] * 1e3:.0f} ms wall, {m['step_cpu'] * 1e3:.0f} ms CPU (medians)")
    hf, preset, hand = medians["hf"], medians["preset"], medians["handwritten"]
    out(f"hf_step_time_ratio_vs_preset={hf['step'] / preset['step']:.3f}")
    out(f"hf_step_cpu_time_ratio_vs_preset={hf['step_cpu'] / preset['step_cpu']:.3f}")
    out(f"hf_step_time_ratio_vs_handwritten={hf['step'] / hand['step']:.3f}")
    out(f"hf_step_cpu_time_ratio_vs_handwritten={hf['step_cpu'] / hand['step_cpu']:.3f}")
    parallel.shutdown()


if __name__ == "__main__":
    main()
