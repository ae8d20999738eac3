"""How much faster does the trainer read a micro-batch than the per-sample loop it replaced?

CPU, one process, no torch.distributed: the same micro-batches (positions, sample ids and
windows, checked equal) read by ``TrainBatches.micro_batch`` (one numpy gather over the
memory-mapped shards) and by the loop it replaced (a sample id, a ``TokenStream.read`` and an
``astype`` per sample, then a stack), interleaved over several rounds; the median of the
per-round ratios, ours over theirs. The shards are small (a window crosses a boundary now and
then) and in the page cache: this is the host-side cost of the read, not disk speed.

    .venv/bin/python bench/input_path.py [--micro-batch 8] [--seq-len 2048] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_sample(batches, cursor: int, micro_step: int):
    """The reading ``TrainBatches.micro_batch`` did before: Python windowing, sample by sample."""
    import numpy as np
    import torch

    from trainer.data import micro_batch_positions

    positions = micro_batch_positions(
        cursor, micro_step, batches.micro_batch_size, batches.world_size, batches.rank
    )
    windows = []
    for p in positions:
        start = batches.order.sample_id(p) * batches.seq_len
        windows.append(batches.stream.read(start, start + batches.seq_len + 1))
    return torch.from_numpy(np.stack(windows))


def main() -> None:
    import numpy as np
    import torch

    from trainer.data import TokenStream, TrainBatches

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--shard-tokens", type=int, default=1_000_000)
    p.add_argument("--reads", type=int, default=200, help="micro-batches per round and way")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i in range(a.shards):
            path = Path(d) / f"{i:05d}.bin"
            rng.integers(0, 50_000, a.shard_tokens, dtype=np.uint16).tofile(path)
            paths.append(path)
        batches = TrainBatches(TokenStream(paths, "uint16"), a.seq_len, 1234, a.micro_batch, a.world_size, 0)
        global_batch = a.micro_batch * a.world_size
        steps = [(i * global_batch, 0) for i in range(a.reads)]
        for cursor, micro in steps[:20]:  # the same windows, bit for bit (and the pages cached)
            if not torch.equal(batches.micro_batch(cursor, micro), per_sample(batches, cursor, micro)):
                raise SystemExit(f"the two reads differ at cursor {cursor}")

        def timed(read) -> float:
            started = time.perf_counter()
            for cursor, micro in steps:
                read(cursor, micro)
            return (time.perf_counter() - started) / len(steps)

        ratios, ours_s, theirs_s = [], [], []
        for _ in range(a.rounds):
            ours_s.append(timed(batches.micro_batch))
            theirs_s.append(timed(lambda c, m: per_sample(batches, c, m)))
            ratios.append(ours_s[-1] / theirs_s[-1])
    print(
        f"config: micro_batch={a.micro_batch} seq_len={a.seq_len} world={a.world_size} "
        f"shards={a.shards}x{a.shard_tokens} cpu"
    )
    print(
        f"input_batch_us={statistics.median(ours_s) * 1e6:.0f} "
        f"per_sample_batch_us={statistics.median(theirs_s) * 1e6:.0f}"
    )
    print(f"input_batch_ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
