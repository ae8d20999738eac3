"""How many steps does a warm-started retrain need to reach what a cold run reached?

CPU, one process (a world of one, as ``python -m trainer train`` runs without torchrun), the
tiny preset, fp32. Two snapshots of the demo data (``trainops.staging.demo_data.demo_rows``:
``--seed`` and ``--new-seed``, other records and other ids, so another train/eval split),
tokenized with the built-in byte tokenizer and split by id as staging does:

1. a cold run (``init.from: none``) trains ``--steps`` steps on the first snapshot; its final
   eval loss (on its own eval split) is the target;
2. its export is promoted by copying it to ``models/<name>/versions/1/`` (what promotion
   copies);
3. a run warm-started from that version (``init.from``: the version URI, its own fresh
   optimizer and schedule of ``--steps`` steps) trains on the new snapshot, its eval loss on
   the new eval split measured before the first step and every ``--eval-every`` steps.

The warm run matches at the first measured step from which every later measurement is at or
below the target (a spike in its learning-rate warm-up after a good start does not count).
``steps_to_match_ratio`` = those steps / the cold run's steps; the issue's bar is <= 0.5. ``cold_model_eval_loss_on_new`` says how the cold model does on the new
eval split before any step (the snapshots share a distribution, so warm start is expected to
start near the target; the ratio says how near). Prints ``name=value`` lines.

    .venv/bin/python bench/warm_start.py [--steps 150] [--eval-every 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

SEQ_LEN = 64
EVAL_BATCHES = 12  # windows of SEQ_LEN + 1 tokens, 8 a batch: ~6,000 eval tokens


def write_snapshot(folder: Path, *, rows: int, seed: int) -> str:
    """A staged dataset version of ``demo_rows(rows, seed)``: byte tokens, the id-hash split,
    one shard per split, the eval index by ``source``; its file:// URI."""
    import hashlib

    from trainops.staging.demo_data import demo_rows
    from trainops.staging.manifest import build_manifest
    from trainops.staging.tokenize import TOKEN_DTYPE, TOKENIZER, encode, index_line, split_of, split_rule

    cols = demo_rows(rows, seed=seed)
    streams: dict[str, bytearray] = {"train": bytearray(), "eval": bytearray()}
    index, counts = [], {"train": 0, "eval": 0}
    for record_id, text, source in zip(cols["id"], cols["text"], cols["source"], strict=True):
        split = split_of(record_id)
        start = len(streams[split]) // 2
        streams[split] += encode(text)
        counts[split] += 1
        if split == "eval":
            index.append(index_line(record_id, {"source": source}, start, len(streams["eval"]) // 2))
    splits = {}
    for split, data in streams.items():
        (folder / split).mkdir(parents=True, exist_ok=True)
        (folder / split / "00000.bin").write_bytes(bytes(data))
        shard = {
            "path": f"{split}/00000.bin",
            "tokens": len(data) // 2,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        splits[split] = {"tokens": shard["tokens"], "shards": [shard]}
    (folder / "eval" / "index.jsonl").write_text("".join(index))
    manifest = build_manifest(
        name="demo-text",
        version=f"seed{seed}",
        created_at="2026-01-01T00:00:00+00:00",
        source_uri=f"demo:seed={seed}",
        objects=[],
        tokenizer=dict(TOKENIZER),
        token_dtype=TOKEN_DTYPE,
        splits=splits,
        split_rule=split_rule(),
        eval_records=len(index),
        slice_columns=["source"],
        rows={"total": rows, "train": counts["train"], "eval": counts["eval"]},
        validation={"success": True},
    )
    import json

    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder.as_uri()


def eval_loss(model, data_uri: str) -> float:
    """Mean token loss of ``model`` over the first eval windows of ``data_uri`` (the trainer's own rule)."""
    import numpy as np

    from trainer import data
    from trainer.evaluate import token_losses
    from trainer.storage import open_storage

    storage = open_storage(data_uri)
    stream = data.open_split(storage, data_uri, data.read_manifest(storage, data_uri), "eval")
    losses = token_losses(model, stream, SEQ_LEN, 8, EVAL_BATCHES)
    return float(np.nanmean(losses))


def training(env, run_dir: Path, data_uri: str, steps: int, init_from: str, attempt: int = 1):
    from trainer.config import load_config
    from trainer.contract import RunLayout
    from trainer.runtime.attempts import Attempt, now_iso
    from trainer.storage import open_storage
    from trainer.train import setup

    run_uri = run_dir.as_uri()
    config = load_config(
        None,
        [
            f"run_uri={run_uri}",
            f"data_uri={data_uri}",
            "seed=5",
            "precision=fp32",
            f"train.max_steps={steps}",
            "train.micro_batch_size=8",
            f"train.seq_len={SEQ_LEN}",
            "train.lr=0.003",
            f"train.warmup_steps={max(1, steps // 10)}",
            "train.log_every=1000",
            f"checkpoint.every_steps={steps}",
            "metrics.flush_every=1000",
            f"init.from={init_from}",
        ],
    )
    attempt_record = Attempt(
        open_storage(run_uri), RunLayout(run_uri), attempt, env.world_size, started_at=now_iso()
    )
    return setup(config, env, attempt_record)


def main() -> None:
    import logging

    import torch

    from trainer import parallel
    from trainer.export.folder import load_model
    from trainer.runtime.preemption import StopFlag
    from trainer.storage import open_storage
    from trainer.train import train_loop, train_step

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150, help="the cold run's steps")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--new-seed", type=int, default=1)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        old = write_snapshot(root / "datasets" / "old", rows=a.rows, seed=a.seed)
        new = write_snapshot(root / "datasets" / "new", rows=a.rows, seed=a.new_seed)
        env = parallel.init_distributed()
        try:
            cold = training(env, root / "cold", old, a.steps, "none")
            train_loop(cold, StopFlag())
            storage = open_storage(root.as_uri())
            export = (root / "cold" / "export").as_uri()
            version = (root / "models" / "demo" / "versions" / "1").as_uri()
            for uri in storage.list(export):  # what promotion copies
                storage.copy(uri, version + uri[len(export) :])
            cold_model, _ = load_model(storage, version)
            target = eval_loss(cold_model, old)
            on_new = eval_loss(cold_model, new)

            warm = training(env, root / "warm", new, a.steps, version)
            losses = {0: eval_loss(warm.model, new)}
            flag = StopFlag()
            while warm.state.step < a.steps:
                train_step(warm, flag)
                if warm.state.step % a.eval_every == 0 or warm.state.step == a.steps:
                    losses[warm.state.step] = eval_loss(warm.model, new)
        finally:
            parallel.shutdown()
    # Reached: the first measured step from which every later measurement is at or below the
    # target, so a warm-up spike after a good start is not counted as a match.
    reached = None
    for step in sorted(losses, reverse=True):
        if losses[step] > target:
            break
        reached = step
    warm_steps = reached if reached is not None else a.steps
    print(f"cold_steps={a.steps}")
    print(f"cold_final_eval_loss={target:.4f}")
    print(f"cold_model_eval_loss_on_new={on_new:.4f}")
    print(f"warm_eval_loss_at_step_0={losses[0]:.4f}")
    print(f"warm_eval_losses={','.join(f'{s}:{v:.4f}' for s, v in sorted(losses.items()))}")
    print(f"warm_final_eval_loss={losses[max(losses)]:.4f}")
    print(f"warm_reached_target={reached is not None}")
    print(f"warm_steps_to_match={warm_steps}")
    print(f"steps_to_match_ratio={warm_steps / a.steps:.3f}")


if __name__ == "__main__":
    main()
