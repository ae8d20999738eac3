"""Does mid-run evaluation slow the training it scores?

Two runs of the demo's training (``trainops.recipes.demo.demo_trainer_config``: the tiny
preset, bf16, its optimizer and batch) made longer, ``--steps`` steps with a checkpoint every
``--every``, on the same staged demo data (``bench/warm_start.py``'s snapshot: byte tokens, the
eval index by ``source``); one ``python -m trainer train`` process pinned to CPU core 0 with one
thread. (The demo itself trains 120 steps in about 2 s of steps: too short for a job that
takes seconds to start to score anything before it ends.)

1. ``baseline``: ``eval.every_checkpoints`` 0, nothing else running;
2. ``scored``: ``eval.every_checkpoints`` 1, while the real ``EvaluateCheckpointsOperator``
   looks at the run every ``--poll`` seconds (its ``poke``, as Airflow calls it in reschedule
   mode) and launches each checkpoint's evaluation job on the local cluster backend, pinned to
   core 1: on a cluster that job is a pod of its own on other hardware, so what this measures
   is what the training shares with it (storage, the trainer's check of which checkpoints are
   still due before it prunes, memory bandwidth), not two jobs fighting for one core.

``--repeats`` pairs (baseline then scored) run interleaved. Prints ``name=value`` lines:
``step_time_ratio`` (the median over the pairs of the scored run's median step time over its
baseline's, both after ``WARMUP`` steps; #28's bar is <= 1.05) and each pair's, the median
step seconds, and the fewest over the pairs of ``scored_during_run`` (scores written before
training ended; the bar is >= 3) and ``scored_total``, and ``picked_step``.

    .venv/bin/python bench/checkpoint_eval.py [--steps 1600] [--every 200] [--poll 0.5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

from bench._common import REPO, env, median_interval
from bench.warm_start import write_snapshot

WARMUP = 5
TRAIN_CORE, EVAL_CORE = 0, 1


def write_config(
    root: str, run_uri: str, data_uri: str, steps: int, every: int, every_checkpoints: int
) -> None:
    from trainer.config import config_from_mapping, dump_yaml
    from trainer.contract import RunLayout
    from trainer.storage import open_storage
    from trainops.recipes.demo import demo_trainer_config

    demo = demo_trainer_config()  # the demo's training, made longer
    demo["train"]["max_steps"], demo["checkpoint"]["every_steps"] = steps, every
    config = config_from_mapping(
        {
            **demo,
            "seed": 1234,  # the demo DAG's default param
            "run_uri": run_uri,
            "data_uri": data_uri,
            "eval": {"every_checkpoints": every_checkpoints, "max_batches": 8},
        }
    )
    open_storage(root).put(RunLayout(run_uri).config, dump_yaml(config).encode())


def median_step(store, run_uri: str) -> float:
    from trainer.contract import MetricsReader, metrics_by_step

    by_step = metrics_by_step(MetricsReader(store, run_uri).records())
    return median_interval([by_step[s]["time"] for s in sorted(by_step)], skip=WARMUP)


def run(tmp: Path, name: str, data_uri: str, steps: int, every: int, poll: float) -> dict:
    """One training run as ``name`` (``baseline`` or ``scored``); its figures."""
    from trainer.contract import RunLayout, run_prefix
    from trainer.storage import open_storage
    from trainops.operators import EvaluateCheckpointsOperator
    from trainops.operators.evaluate_checkpoints import scored_steps
    from trainops.recovery.record import start_record

    (tmp / name).mkdir(parents=True, exist_ok=True)
    root = (tmp / name).as_uri()
    store = open_storage(root)
    layout = RunLayout(run_prefix(root, "bench", "r1", "train"))
    scored = name == "scored"
    write_config(root, layout.run_uri, data_uri, steps, every, 1 if scored else 0)
    owner = {"dag_id": "bench", "run_id": "r1", "task_id": "train", "map_index": -1}
    job = start_record(
        run_uri=layout.run_uri, config_uri=layout.config, cluster="local", capacity="spot", owner=owner
    )
    store.put_json(layout.job, job)
    environ = env(tmp / f"cache-{name}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--config", layout.config],
        env=environ,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {TRAIN_CORE}),
    )
    result, during = None, 0
    if scored:
        op = EvaluateCheckpointsOperator(
            task_id="evaluate_checkpoints", storage_root=root, poll_interval=poll
        )
        training = {"run_uri": layout.run_uri, "config_uri": layout.config, "export_uri": layout.export}
        ti = SimpleNamespace(
            dag_id="bench",
            run_id="r1",
            task_id="evaluate_checkpoints",
            map_index=-1,
            xcom_pull=lambda **_: training,
        )
        while result is None:
            if proc.poll() is not None and job["status"] == "running":
                job["status"] = "succeeded" if proc.returncode == 0 else "failed"
                store.put_json(layout.job, job)  # what the training task records when its job ends
                during = len(scored_steps(store.list(layout.checkpoint_scores), layout))
            looked = op.poke({"ti": ti})
            result = looked.xcom_value if not isinstance(looked, bool) else None
            if result is None:
                time.sleep(poll)
    if proc.wait() != 0:
        raise RuntimeError(f"{name}: training failed ({proc.returncode})")
    figures = {"step_s": median_step(store, layout.run_uri)}
    if result is not None:
        pick = result["checkpoint_pick"]
        figures.update(
            scored_during_run=during,
            scored_total=len([c for c in pick["checkpoints"] if c["value"] is not None]),
            picked_step=pick["step"],
        )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3, help="baseline/scored pairs, interleaved")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("error: needs 2 CPU cores (training on one, evaluation on the other)", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {EVAL_CORE})  # this process and the evaluation jobs it launches
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ["TRAINOPS_LOCAL_STATE"] = str(tmp / "local")
        data_uri = write_snapshot(tmp / "data", rows=4000, seed=0)
        pairs = []
        for n in range(args.repeats):  # interleaved: a drift in the machine's speed hits both
            base = run(tmp / f"{n}", "baseline", data_uri, args.steps, args.every, args.poll)
            scored = run(tmp / f"{n}", "scored", data_uri, args.steps, args.every, args.poll)
            pairs.append((base, scored))
    ratios = [scored["step_s"] / base["step_s"] for base, scored in pairs]
    print(f"steps={args.steps}")
    print(f"checkpoint_every={args.every}")
    print(f"baseline_step_s={statistics.median(b['step_s'] for b, _ in pairs):.5f}")
    print(f"scored_step_s={statistics.median(s['step_s'] for _, s in pairs):.5f}")
    print(f"step_time_ratios={','.join(f'{r:.3f}' for r in ratios)}")
    print(f"step_time_ratio={statistics.median(ratios):.3f}")
    for key in ("scored_during_run", "scored_total", "picked_step"):
        print(f"{key}={min(s[key] for _, s in pairs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
