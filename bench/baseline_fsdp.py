"""A minimal hand-written FSDP2 training loop: the baseline our trainer is measured against.

It reads the same config file as ``python -m trainer train`` and builds the same parts from it:
the sharded model with the trainer's initial weights, the optimizer (fused AdamW), the LR
schedule and the data windows in the trainer's sample order. Only the loop is hand-written
(forward, loss, backward, clip, optimizer and schedule step, one all-reduce of the loss), with
nothing else: no checkpoints, no metrics files, no preemption flag, no heartbeat, no prefetch.

Both runs therefore do the same arithmetic on the same numbers, step for step, and their losses
agree (``trainer_overhead.py`` checks it). That matters on a CPU more than it seems: there,
denormal floats cost microcode assists, so two loops that start from different weights or
follow different LR schedules can differ in speed by several percent for reasons that have
nothing to do with the loop. Run under torchrun:

    torchrun --standalone --nproc-per-node=2 bench/baseline_fsdp.py --config config.yaml --out out.json
"""

from __future__ import annotations

import argparse
import json
import time


def plain_step(model, opt, scheduler, batches, cursor: int, grad_clip: float) -> float:
    """One hand-written step on the micro-batch at ``cursor``; the loss, averaged over the ranks
    (read every step, as a plain loop does). ``bench/loop_overhead.py`` interleaves it with the
    trainer's own loop."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from trainer import data

    inputs, targets = data.inputs_and_targets(batches.micro_batch(cursor, 0))
    logits = model(inputs)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    scheduler.step()
    opt.zero_grad(set_to_none=True)
    total = torch.tensor([loss.item()], dtype=torch.float64)
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def main() -> None:
    import torch.distributed as dist

    from trainer import data, parallel
    from trainer.config import load_config
    from trainer.optim import build_optimizer, build_scheduler
    from trainer.storage import open_storage
    from trainer.train import build_sharded_model

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, help="the trainer config file both runs read")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    config = load_config(a.config)
    t = config.train
    if t.grad_accum_steps != 1 or t.global_batch_size:
        raise SystemExit(
            f"the baseline runs one micro-batch per step; set train.grad_accum_steps: 1 and no "
            f"train.global_batch_size (got {t.grad_accum_steps} and {t.global_batch_size})"
        )
    env = parallel.init_distributed()
    storage = open_storage(config.data_uri)
    manifest = data.read_manifest(storage, config.data_uri)
    vocab = config.model.vocab_size or int(manifest["tokenizer"]["vocab_size"])
    batches = data.TrainBatches(
        data.open_split(storage, config.data_uri, manifest, "train"),
        t.seq_len,
        config.seed,
        t.micro_batch_size,
        env.world_size,
        env.rank,
    )
    model = build_sharded_model(
        config, env, vocab, parallel.device_mesh(env, config.parallel.replicate)
    ).model
    opt = build_optimizer(model, t.lr, t.weight_decay)
    scheduler = build_scheduler(
        opt, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio
    )
    global_batch = t.micro_batch_size * env.world_size

    times, losses = [], []
    for step in range(t.max_steps):
        losses.append(plain_step(model, opt, scheduler, batches, step * global_batch, t.grad_clip))
        times.append(time.time())
    if env.is_main:
        with open(a.out, "w") as f:
            json.dump({"times": times, "losses": losses}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
