"""How much slower is a step of our trainer than a minimal hand-written FSDP2 loop?

CPU, 2 processes (torchrun, gloo), bf16 mixed precision, the same model, data and per-step
work in both; checkpoints off (the trainer's only checkpoint comes after the last timed step).
It first picks a micro-batch at which one baseline step takes at least 100 ms, so fixed costs
do not dominate, then alternates ours and the baseline several times and prints the median
ratio of step times. Goal: overhead_ratio <= 1.03.

    .venv/bin/python bench/trainer_overhead.py [--rounds 3] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, median_interval, torchrun, write_random_dataset

WARMUP = 5


def baseline(tmp: Path, data_uri: str, preset: str, steps: int, micro: int, seq: int, tag: str) -> float:
    out = tmp / f"baseline-{tag}.json"
    torchrun(
        [
            str(REPO / "bench" / "baseline_fsdp.py"),
            "--data-uri",
            data_uri,
            "--preset",
            preset,
            "--steps",
            str(steps),
            "--micro-batch",
            str(micro),
            "--seq-len",
            str(seq),
            "--out",
            str(out),
        ],
        2,
        env(tmp / f"cache-{tag}"),
    )
    return median_interval(json.loads(out.read_text())["times"], WARMUP)


def ours(tmp: Path, data_uri: str, preset: str, steps: int, micro: int, seq: int, tag: str) -> float:
    run = tmp / f"run-{tag}"
    config = tmp / f"config-{tag}.yaml"
    config.write_text(
        json.dumps(
            {
                "run_uri": f"file://{run}",
                "data_uri": data_uri,
                "seed": 1234,
                "precision": "bf16",
                "resume": "never",
                "model": {"preset": preset},
                "train": {
                    "max_steps": steps,
                    "micro_batch_size": micro,
                    "grad_accum_steps": 1,
                    "seq_len": seq,
                    "lr": 3e-3,
                    "log_every": 10,
                },
                "checkpoint": {"every_steps": 10**9, "keep": 1},
            }
        )
    )
    torchrun(["-m", "trainer", "train", "--config", str(config)], 2, env(tmp / f"cache-{tag}"))
    from trainer.contract import MetricsReader, metrics_by_step
    from trainer.storage import open_storage

    by_step = metrics_by_step(MetricsReader(open_storage(run.as_uri()), run.as_uri()).records())
    return median_interval([by_step[step]["time"] for step in sorted(by_step)], WARMUP)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--min-step-s", type=float, default=0.1)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data_uri = write_random_dataset(tmp / "data")
        micro = 4
        while True:  # the smallest power-of-two micro-batch whose step takes >= min_step_s
            step = baseline(tmp, data_uri, a.preset, 12, micro, a.seq_len, f"probe{micro}")
            print(
                f"probe: preset {a.preset}, micro-batch {micro}, seq {a.seq_len}: {step * 1000:.0f} ms/step",
                file=sys.stderr,
                flush=True,
            )
            if step >= a.min_step_s or micro >= 512:
                break
            micro *= 2
        ratios = []
        for r in range(a.rounds):
            t_ours = ours(tmp, data_uri, a.preset, a.steps, micro, a.seq_len, f"r{r}")
            t_base = baseline(tmp, data_uri, a.preset, a.steps, micro, a.seq_len, f"r{r}")
            ratios.append(t_ours / t_base)
            print(
                f"round {r + 1}: ours {t_ours * 1000:.1f} ms/step, baseline {t_base * 1000:.1f} ms/step, "
                f"ratio {ratios[-1]:.3f}",
                file=sys.stderr,
                flush=True,
            )
    print(f"config: preset={a.preset} micro_batch={micro} seq_len={a.seq_len} world=2 precision=bf16 cpu")
    print(f"ratios={','.join(f'{x:.3f}' for x in ratios)}")
    print(f"overhead_ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
