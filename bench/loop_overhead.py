"""The trainer's loop against a hand-written step, interleaved in one job on the same model.

``trainer_overhead.py`` compares two whole programs, one after the other; on a shared 2-core
machine a round's ratio then spreads by +-10% or more, because the machine's speed drifts
between the runs. Here both loops run in the same torchrun job (2 ranks, CPU, bf16), on the
same sharded model, optimizer, schedule and data, in alternating blocks of ``--block`` steps
(which loop goes first alternates too), so a drift lasting longer than a block hits both alike.

"ours" is the trainer's own ``train_loop`` (the step with its prefetch and stop-flag vote, the
heartbeat, the loss reads and metrics records every ``train.log_every`` steps), run for one
block at a time; only the run's end (final checkpoint, export, attempt record) is left out. The
start of each of its blocks (a heartbeat writer, the block's last loss read) is counted against
it. "plain" is ``baseline_fsdp.plain_step``: forward, loss, backward, clip, optimizer and schedule
step, and a loss all-reduce read every step. Both advance the same cursor, so the data and the
arithmetic follow the trainer's own order.

It prints the median ratio of the two loops' time per step over the block pairs, wall
(``loop_overhead_ratio=``) and CPU (``loop_cpu_ratio=``, both ranks, all threads), each with a
90% bootstrap interval. Goal: loop_overhead_ratio <= 1.03.

    .venv/bin/python bench/loop_overhead.py [--pairs 12] [--block 8] [--micro-batch 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env, torchrun, write_random_dataset
from trainer_overhead import ci90_of_median, write_config

WARMUP_STEPS = 6  # of each loop, untimed: the first steps allocate and warm caches


def worker(config_path: str, pairs: int, block: int, out: str) -> None:
    """Under torchrun: both loops in alternating blocks; rank 0 writes the block times."""
    import torch
    import torch.distributed as dist
    from baseline_fsdp import plain_step

    import trainer.train as train
    from trainer import parallel
    from trainer.config import load_config
    from trainer.contract import RunLayout
    from trainer.runtime.attempts import Attempt
    from trainer.runtime.preemption import StopFlag
    from trainer.storage import open_storage

    config = load_config(config_path)
    env_ = parallel.init_distributed()
    storage = open_storage(config.run_uri)
    attempt = Attempt(storage, RunLayout(config.run_uri), 1, env_.world_size, started_at="bench")
    tr = train.setup(config, env_, attempt)
    train.finish = lambda tr: None  # blocks end mid-run: no final checkpoint, export or record
    flag = StopFlag()

    def ours(steps: int) -> None:
        tr.config.train.max_steps = tr.state.step + steps  # the schedule keeps the setup's length
        train.train_loop(tr, flag)

    def plain(steps: int) -> None:
        for _ in range(steps):
            plain_step(
                tr.model, tr.optimizer, tr.scheduler, tr.batches, tr.state.cursor, config.train.grad_clip
            )
            tr.state.step, tr.state.cursor = tr.state.step + 1, tr.state.cursor + tr.global_batch

    def timed(run, steps: int) -> tuple[float, float]:
        """Seconds and CPU seconds (both ranks) per step of ``run``."""
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        run(steps)
        cpu_used = torch.tensor([time.process_time() - cpu], dtype=torch.float64)
        dist.barrier()
        wall_used = time.perf_counter() - wall
        dist.all_reduce(cpu_used)
        return wall_used / steps, cpu_used.item() / steps

    timed(ours, WARMUP_STEPS)
    timed(plain, WARMUP_STEPS)
    blocks = []
    for pair in range(pairs):
        order = (("ours", ours), ("plain", plain)) if pair % 2 == 0 else (("plain", plain), ("ours", ours))
        blocks.append({name: timed(run, block) for name, run in order})
    if env_.is_main:
        Path(out).write_text(json.dumps(blocks))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=12, help="block pairs (one block of each loop)")
    p.add_argument("--block", type=int, default=8, help="steps per block")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--worker", nargs=4, metavar=("CONFIG", "PAIRS", "BLOCK", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        config, pairs, block, out = a.worker
        worker(config, int(pairs), int(block), out)
        return
    if a.block < 2 or a.pairs < 1:
        p.error(f"--block needs 2 or more steps and --pairs 1 or more (got {a.block} and {a.pairs})")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data_uri = write_random_dataset(tmp / "data")
        steps = 2 * (WARMUP_STEPS + a.pairs * a.block)
        config = write_config(tmp, data_uri, a.preset, steps, a.micro_batch, a.seq_len, "loop")
        out = tmp / "blocks.json"
        script = str(Path(__file__).resolve())
        torchrun(
            [script, "--worker", str(config), str(a.pairs), str(a.block), str(out)], 2, env(tmp / "cache")
        )
        blocks = json.loads(out.read_text())
    wall = [b["ours"][0] / b["plain"][0] for b in blocks]
    cpu = [b["ours"][1] / b["plain"][1] for b in blocks]
    for i, b in enumerate(blocks):
        print(
            f"pair {i + 1}: ours {b['ours'][0] * 1000:.1f} ms/step ({b['ours'][1] * 1000:.1f} CPU), "
            f"plain {b['plain'][0] * 1000:.1f} ms/step ({b['plain'][1] * 1000:.1f} CPU), ratio {wall[i]:.3f}",
            file=sys.stderr,
        )
    print(
        f"config: preset={a.preset} micro_batch={a.micro_batch} seq_len={a.seq_len} world=2 precision=bf16 cpu "
        f"pairs={a.pairs} block={a.block}"
    )
    print(f"loop_ratios={','.join(f'{x:.3f}' for x in wall)}")
    print(f"loop_overhead_ratio={statistics.median(wall):.3f}")
    print("loop_overhead_ratio_ci90={:.3f},{:.3f}".format(*ci90_of_median(wall)))
    print(f"loop_cpu_ratio={statistics.median(cpu):.3f}")
    print("loop_cpu_ratio_ci90={:.3f},{:.3f}".format(*ci90_of_median(cpu)))


if __name__ == "__main__":
    main()
