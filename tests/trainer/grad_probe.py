"""Gradients and losses of the real training step on the FSDP-sharded model, for the correctness tests.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/trainer/grad_probe.py OUT_DIR [CASE ...]

For every case (a precision and the step options) rank 0 writes ``OUT_DIR/<case>.pt``: the full
(gathered, fp32, unscaled) gradients of the first step and the mean loss of each of ``STEPS``
steps. The test compares them with :func:`reference_gradients`, a plain single-process model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

VOCAB, SEQ_LEN, GLOBAL_BATCH, STEPS, LR = 257, 16, 8, 6, 1e-2
BLOCKS = ["layers.0", "layers.1"]  # the tiny preset's two blocks

CASES = {
    "fp32": {"precision": "fp32"},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "fp32_accum2": {"precision": "fp32", "micro_batch_size": 2},
    "fp32_accum2_nosync": {"precision": "fp32", "micro_batch_size": 2, "skip_grad_sync": True},
    "bf16_accum2_nosync": {"precision": "bf16", "micro_batch_size": 2, "skip_grad_sync": True},
    "fp32_ac_full": {"precision": "fp32", "activation_checkpointing": "full"},
    "fp32_ac_selective": {"precision": "fp32", "activation_checkpointing": "selective"},
}
# HSDP (parallel.replicate=2): run on 4 ranks by tests/trainer/test_parallel.py, 2 replicas x 2 shards.
HSDP_CASES = {
    "fp32_hsdp": {"precision": "fp32", "replicate": "2"},
    "fp32_hsdp_accum2_nosync": {
        "precision": "fp32",
        "replicate": "2",
        "micro_batch_size": 1,
        "skip_grad_sync": True,
    },
}


def batch(step: int) -> torch.Tensor:
    """``GLOBAL_BATCH`` windows of ``SEQ_LEN + 1`` tokens: counting patterns, quick to learn."""
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=g)
    strides = torch.randint(1, 4, (GLOBAL_BATCH, 1), generator=g)
    return (starts + strides * torch.arange(SEQ_LEN + 1)) % VOCAB


def new_model():
    from trainer.models.llama import Transformer
    from trainer.presets import PRESETS

    torch.manual_seed(0)
    return Transformer(PRESETS["tiny"].with_vocab(VOCAB))


def clean_name(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def reference_gradients() -> dict[str, torch.Tensor]:
    """First-step gradients of the unsharded fp32 model on the whole global batch, in one process."""
    model = new_model()
    windows = batch(0)
    logits = model(windows[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def run_case(name: str, case: dict, rank: int, world_size: int, out_dir: Path) -> None:
    import torch.distributed as dist

    from trainer import data, parallel
    from trainer.config import Config, ParallelConfig, TrainConfig
    from trainer.optim import build_optimizer, build_scheduler
    from trainer.step import apply_gradients, forward_backward

    micro = case.get("micro_batch_size", GLOBAL_BATCH // world_size)
    accum = GLOBAL_BATCH // (micro * world_size)
    model = new_model()
    checkpointing = case.get("activation_checkpointing", "none")
    config = Config(
        precision=case["precision"],
        train=TrainConfig(activation_checkpointing=checkpointing),
        parallel=ParallelConfig(replicate=case.get("replicate", "1")),
    )
    env = parallel.DistEnv(rank, world_size, rank, torch.device("cpu"))
    mesh = parallel.device_mesh(env, config.parallel.replicate, local_world_size=world_size)
    parallel.parallelize(model, BLOCKS, config, mesh)
    optimizer = build_optimizer(model, LR, weight_decay=0.1)
    scheduler = build_scheduler(optimizer, warmup_steps=0, max_steps=STEPS, min_lr_ratio=0.1)
    scaler = parallel.grad_scaler(case["precision"])
    grads, losses = {}, []
    for step in range(STEPS):
        windows = batch(step)

        def micro_batches(windows=windows):
            for m in range(accum):
                rows = list(data.micro_batch_positions(0, m, micro, world_size, rank))
                yield windows[rows, :-1], windows[rows, 1:]

        loss = forward_backward(model, micro_batches(), accum, scaler, case.get("skip_grad_sync", False))
        if step == 0:
            scale = scaler.get_scale() if scaler is not None else 1.0
            for pname, p in model.named_parameters():
                grads[clean_name(pname)] = p.grad.full_tensor().float() / scale
            grad_dtype = (
                str(model.layers[0].attention.wq.weight.grad.dtype)
                if case.get("activation_checkpointing", "none") == "none"
                else None
            )
        apply_gradients(model, optimizer, scheduler, scaler, grad_clip=1.0)
        total = loss.clone()
        dist.all_reduce(total)
        losses.append(total.item() / world_size)
    if rank == 0:
        torch.save(
            {
                "grads": grads,
                "losses": losses,
                "grad_dtype": grad_dtype,
                "accum": accum,
                "mesh": tuple(next(model.parameters()).device_mesh.shape),
            },
            out_dir / f"{name}.pt",
        )


def main() -> None:
    from trainer import parallel

    out_dir = Path(sys.argv[1])
    env = parallel.init_distributed()
    try:
        for name in sys.argv[2:] or list(CASES):
            run_case(name, {**CASES, **HSDP_CASES}[name], env.rank, env.world_size, out_dir)
    finally:
        parallel.shutdown()


if __name__ == "__main__":
    main()
