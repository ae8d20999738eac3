"""A minimal hand-written FSDP2 training loop: the baseline our trainer is measured against.

Same model class, data windows, precision policy, optimizer and per-step work (forward,
backward, clip, step, one all-reduce of the loss) as ``python -m trainer train``, and nothing
else: no checkpoints, no metrics files, no preemption flag. Run under torchrun:

    torchrun --standalone --nproc-per-node=2 bench/baseline_fsdp.py --data-uri file:///... \
        --preset tiny --steps 40 --micro-batch 8 --seq-len 64 --out times.json
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainer.model import Transformer
    from trainer.presets import PRESETS

    p = argparse.ArgumentParser()
    p.add_argument("--data-uri", required=True)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", required=True)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = a.data_uri.removeprefix("file://")
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    tokens = np.fromfile(
        os.path.join(folder, manifest["splits"]["train"]["shards"][0]["path"]), dtype=np.uint16
    )
    n_samples = (len(tokens) - 1) // a.seq_len
    order = torch.randperm(n_samples, generator=torch.Generator().manual_seed(1234))

    torch.manual_seed(1234)
    model = Transformer(PRESETS[a.preset].with_vocab(manifest["tokenizer"]["vocab_size"]))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    from trainer.optim import build_optimizer

    opt = build_optimizer(model, a.lr, 0.1)  # the trainer's AdamW (fused), so only the loop differs

    times = []
    cursor = 0
    for _ in range(a.steps):
        ids = order[(cursor + rank * a.micro_batch) % n_samples :][: a.micro_batch].tolist()
        cursor += a.micro_batch * world
        batch = torch.from_numpy(
            np.stack([tokens[i * a.seq_len : i * a.seq_len + a.seq_len + 1] for i in ids]).astype(np.int64)
        )
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = torch.tensor([loss.item()])
        dist.all_reduce(total)
        times.append(time.time())
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"times": times}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
