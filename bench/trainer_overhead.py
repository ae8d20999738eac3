"""How much slower is a step of our trainer than a minimal hand-written FSDP2 loop?

CPU, 2 processes (torchrun, gloo), bf16 mixed precision. Both read one config and build the
same parts from it (initial weights, optimizer, LR schedule, sample order), so they do the same
arithmetic and their losses must agree (checked; ``loss_max_abs_diff=``): only the loop differs.
Checkpoints off (the trainer's only checkpoint comes after the last timed step).
It first picks a micro-batch at which one baseline step takes at least 100 ms, so fixed costs
do not dominate, then alternates ours and the baseline several times (which one goes first
alternates too) and prints the median ratio of step times. Goal: overhead_ratio <= 1.03.

A round's ratio spreads by +-10% or more on a shared 2-core machine, even when nothing else
runs, so one round says little: the script also prints a 90% bootstrap interval of the median
(``overhead_ratio_ci90=``); pool rounds until it is narrow enough to decide.

``--cpu`` adds the CPU time per step of both loops, all ranks together (``cpu_step_ratio=``),
which another load on the machine disturbs much less than wall time. Each loop then also runs
``--steps / 4`` steps, and the difference of the two runs' CPU time is divided by the
difference of their steps, so the setup (imports, model build) cancels.

The probe's pick depends on the machine's speed (and its load): ``--micro-batch`` fixes it, so
that runs on different days compare. A fixed cost per step weighs more at a smaller one.

    .venv/bin/python bench/trainer_overhead.py [--rounds 3] [--steps 40] [--cpu] [--micro-batch 32]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, median_interval, torchrun, write_random_dataset

WARMUP = 5
LOSS_TOLERANCE = 1e-6  # the two loops do the same arithmetic: their losses must agree


def write_config(tmp: Path, data_uri: str, preset: str, steps: int, micro: int, seq: int, tag: str) -> Path:
    """The trainer config both runs read (the baseline ignores what it has no use for)."""
    config = tmp / f"config-{tag}.yaml"
    config.write_text(
        json.dumps(
            {
                "run_uri": f"file://{tmp / f'run-{tag}'}",
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
    return config


def baseline(tmp: Path, config: Path, tag: str) -> tuple[float, list[float]]:
    """The hand-written loop's median step time and its losses."""
    out = tmp / f"baseline-{tag}.json"
    script = str(REPO / "bench" / "baseline_fsdp.py")
    torchrun([script, "--config", str(config), "--out", str(out)], 2, env(tmp / f"cache-{tag}"))
    result = json.loads(out.read_text())
    return median_interval(result["times"], WARMUP), result["losses"]


def ours(tmp: Path, config: Path, tag: str) -> tuple[float, list[float]]:
    """The trainer's median step time (from its metrics records) and its losses."""
    torchrun(["-m", "trainer", "train", "--config", str(config)], 2, env(tmp / f"cache-{tag}"))
    from trainer.config import load_config
    from trainer.contract import MetricsReader, metrics_by_step
    from trainer.storage import open_storage

    run_uri = load_config(str(config)).run_uri
    by_step = metrics_by_step(MetricsReader(open_storage(run_uri), run_uri).records())
    steps = sorted(by_step)
    return median_interval([by_step[s]["time"] for s in steps], WARMUP), [by_step[s]["loss"] for s in steps]


def children_cpu_s() -> float:
    """CPU seconds (user + system) of every child process waited for so far (torchrun's ranks too)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_per_step(run, tmp: Path, data_uri: str, a: argparse.Namespace, micro: int, tag: str) -> float:
    """``run``'s CPU seconds per step over all ranks: two runs of different lengths, so that what
    does not grow with the steps (imports, setup, the first steps' warm-up) cancels."""
    short, long = max(a.steps // 4, WARMUP + 2), a.steps
    used = {}
    for steps in (short, long):
        config = write_config(tmp, data_uri, a.preset, steps, micro, a.seq_len, f"{tag}-{steps}")
        before = children_cpu_s()
        run(tmp, config, f"{tag}-{steps}")
        used[steps] = children_cpu_s() - before
    return (used[long] - used[short]) / (long - short)


def ci90_of_median(values: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 90% bootstrap interval of the median of ``values`` (seeded: the same rounds, the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.05 * resamples)], medians[int(0.95 * resamples) - 1]


def check_same_work(ours_losses: list[float], base_losses: list[float]) -> float:
    """The largest loss difference; raises when the loops did not do the same work."""
    if len(ours_losses) != len(base_losses):
        raise SystemExit(f"the trainer logged {len(ours_losses)} steps, the baseline {len(base_losses)}")
    worst = max(abs(a - b) for a, b in zip(ours_losses, base_losses, strict=True))
    if worst > LOSS_TOLERANCE:
        raise SystemExit(
            f"the trainer's and the baseline's losses differ by up to {worst:.3g} (> {LOSS_TOLERANCE}): "
            "they no longer do the same work, so their step times are not comparable"
        )
    return worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--min-step-s", type=float, default=0.1)
    p.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="use this micro-batch instead of probing for one (compare runs on one footing)",
    )
    p.add_argument("--cpu", action="store_true", help="also the CPU time per step (two more runs each round)")
    a = p.parse_args()
    if a.cpu and a.steps < 40:
        p.error(
            f"--cpu needs --steps 40 or more (got {a.steps}): below that the setup's spread swamps the steps"
        )
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data_uri = write_random_dataset(tmp / "data")
        micro = a.micro_batch or 4
        while not a.micro_batch:  # the smallest power-of-two micro-batch whose step takes >= min_step_s
            probe = write_config(tmp, data_uri, a.preset, 12, micro, a.seq_len, f"probe{micro}")
            step = baseline(tmp, probe, f"probe{micro}")[0]
            print(
                f"probe: preset {a.preset}, micro-batch {micro}, seq {a.seq_len}: {step * 1000:.0f} ms/step",
                file=sys.stderr,
                flush=True,
            )
            if step >= a.min_step_s or micro >= 512:
                break
            micro *= 2
        ratios, cpu_ratios, worst = [], [], 0.0
        for r in range(a.rounds):
            config = write_config(tmp, data_uri, a.preset, a.steps, micro, a.seq_len, f"r{r}")
            order = (ours, baseline) if r % 2 == 0 else (baseline, ours)  # a drift in speed cancels
            runs = {run.__name__: run(tmp, config, f"r{r}") for run in order}
            (t_ours, l_ours), (t_base, l_base) = runs["ours"], runs["baseline"]
            worst = max(worst, check_same_work(l_ours, l_base))
            ratios.append(t_ours / t_base)
            print(
                f"round {r + 1}: ours {t_ours * 1000:.1f} ms/step, baseline {t_base * 1000:.1f} ms/step, "
                f"ratio {ratios[-1]:.3f}, losses agree to {worst:.1g}",
                file=sys.stderr,
                flush=True,
            )
            if a.cpu:
                cpu = {run.__name__: cpu_per_step(run, tmp, data_uri, a, micro, f"c{r}") for run in order}
                cpu_ratios.append(cpu["ours"] / cpu["baseline"])
                print(
                    f"round {r + 1}: CPU per step (all ranks) ours {cpu['ours'] * 1000:.1f} ms, "
                    f"baseline {cpu['baseline'] * 1000:.1f} ms, ratio {cpu_ratios[-1]:.3f}",
                    file=sys.stderr,
                    flush=True,
                )
    print(f"config: preset={a.preset} micro_batch={micro} seq_len={a.seq_len} world=2 precision=bf16 cpu")
    print(f"loss_max_abs_diff={worst:.3g}")
    print(f"ratios={','.join(f'{x:.3f}' for x in ratios)}")
    print(f"overhead_ratio={statistics.median(ratios):.3f}")
    low, high = ci90_of_median(ratios)
    print(f"overhead_ratio_ci90={low:.3f},{high:.3f}")
    if cpu_ratios:
        print(f"cpu_step_ratios={','.join(f'{x:.3f}' for x in cpu_ratios)}")
        print(f"cpu_step_ratio={statistics.median(cpu_ratios):.3f}")


if __name__ == "__main__":
    main()
