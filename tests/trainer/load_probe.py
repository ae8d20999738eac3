"""What a Checkpointer's resume fetches, rank by rank, for tests/trainer/checkpoint/test_reads.py.

    python -m torch.distributed.run --standalone --nproc-per-node=N tests/trainer/load_probe.py \\
        save|load RUN_URI OUT_DIR RANKS_PER_NODE

``save``: the tiny model, FSDP2-sharded over the ranks, one AdamW step, then a checkpoint at
step 1. ``load``: a fresh model (another seed) resumed from it. Each rank first takes the cache
of its simulated node (``$TRAINOPS_CACHE_DIR/node<rank // RANKS_PER_NODE>``) and counts the
bytes it downloads; it writes ``OUT_DIR/<mode>_<rank>.json`` (bytes, step) and rank 0 writes
``OUT_DIR/<mode>.pt``, the full (gathered) model and optimizer state.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    mode, run_uri, out, per_node = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    node = int(os.environ["RANK"]) // per_node
    os.environ["TRAINOPS_CACHE_DIR"] = str(Path(os.environ["TRAINOPS_CACHE_DIR"]) / f"node{node}")
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.fsdp import fully_shard

    from tests.trainer.helpers import ForwardingStorage
    from trainer import parallel
    from trainer.checkpoint.save import Checkpointer
    from trainer.models.llama import Transformer
    from trainer.optim import build_optimizer
    from trainer.presets import PRESETS
    from trainer.state import ModelState, OptimizerState, TrainState
    from trainer.storage import open_storage

    class Counting(ForwardingStorage):
        downloaded = 0

        def download_file_hashed(self, uri, local_path):
            got = self.inner.download_file_hashed(uri, local_path)
            self.downloaded += got[0]
            return got

    env = parallel.init_distributed()
    torch.manual_seed(0 if mode == "save" else 1)
    model = Transformer(PRESETS["tiny"].with_vocab(4096))  # a vocabulary big enough to shard unevenly
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    state = TrainState(env.device)
    states = {"model": ModelState(model), "optim": OptimizerState(model, optimizer), "train_state": state}
    storage = Counting(open_storage(run_uri))
    ckpt = Checkpointer(storage, run_uri, env.rank, env.world_size, keep=2, states=states)
    if mode == "save":
        tokens = torch.randint(0, 4096, (2, 9))
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        state.step, state.cursor = 1, 8
        ckpt.save(1)
    else:
        assert ckpt.load_latest() == 1
    full = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.rank == 0:
        torch.save(full, out / f"{mode}.pt")
    record = {"downloaded": storage.downloaded, "step": state.step, "cursor": state.cursor}
    (out / f"{mode}_{env.rank}.json").write_text(json.dumps(record))
    parallel.barrier()
    parallel.shutdown()


if __name__ == "__main__":
    main()
