"""Does mid-run evaluation slow the training it scores?

Two runs of the same training on the same staged demo data (``bench/warm_start.py``'s
snapshot: byte tokens, the eval index by ``source``): the tiny preset, fp32, ``--steps`` steps, a
checkpoint every ``--every`` steps, one ``python -m trainer train`` process pinned to CPU core 0
with one thread.

1. ``baseline``: ``eval.every_checkpoints`` 0, nothing else running;
2. ``scored``: ``eval.every_checkpoints`` 1, while the real ``EvaluateCheckpointsOperator``
   looks at the run every ``--poll`` seconds (its ``poke``, as Airflow calls it in reschedule
   mode) and launches each checkpoint's evaluation job on the local cluster backend, pinned to
   core 1: on a cluster that job is a pod of its own on other hardware, so what this measures
   is what the training shares with it (storage, the trainer's check of which checkpoints are
   still due before it prunes, memory bandwidth), not two jobs fighting for one core.

Prints ``name=value`` lines: ``step_time_ratio`` (the scored run's median step time over the
baseline's, both after ``WARMUP`` steps; #28's bar is <= 1.05), ``scored_during_run`` (scores
written before training ended; the bar is >= 3), ``scored_total``, ``picked_step`` and each
run's median step seconds.

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

from bench._common import REPO, env  # noqa: E402
from bench.warm_start import write_snapshot  # noqa: E402

WARMUP = 5
TRAIN_CORE, EVAL_CORE = 0, 1


def write_config(root: str, run_uri: str, data_uri: str, steps: int, every: int, every_checkpoints: int) -> None:
    from trainer.config import config_from_mapping, dump_yaml
    from trainer.contract import RunLayout
    from trainer.storage import open_storage

    config = config_from_mapping(
        {
            "run_uri": run_uri,
            "data_uri": data_uri,
            "precision": "fp32",
            "model": {"preset": "tiny"},
            "train": {"max_steps": steps, "micro_batch_size": 8, "seq_len": 64, "lr": 3e-3, "warmup_steps": 10},
            "checkpoint": {"every_steps": every, "keep": 2},
            "metrics": {"flush_every": 1},
            "eval": {"every_checkpoints": every_checkpoints, "max_batches": 8},
        }
    )
    open_storage(root).put(RunLayout(run_uri).config, dump_yaml(config).encode())


def median_step(store, run_uri: str) -> float:
    from trainer.contract import MetricsReader, metrics_by_step

    by_step = metrics_by_step(MetricsReader(store, run_uri).records())
    times = [by_step[s]["time"] for s in sorted(by_step)][WARMUP:]
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False))


def run(tmp: Path, name: str, data_uri: str, steps: int, every: int, poll: float) -> dict:
    """One training run as ``name`` (``baseline`` or ``scored``); its figures."""
    from trainer.contract import RunLayout, run_prefix
    from trainer.storage import open_storage
    from trainops.operators import EvaluateCheckpointsOperator
    from trainops.operators.evaluate_checkpoints import scored_steps
    from trainops.recovery.record import start_record

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
        op = EvaluateCheckpointsOperator(task_id="evaluate_checkpoints", storage_root=root, poll_interval=poll)
        training = {"run_uri": layout.run_uri, "config_uri": layout.config, "export_uri": layout.export}
        ti = SimpleNamespace(
            dag_id="bench", run_id="r1", task_id="evaluate_checkpoints", map_index=-1, xcom_pull=lambda **_: training
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--poll", type=float, default=0.5)
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
        base = run(tmp, "baseline", data_uri, args.steps, args.every, args.poll)
        scored = run(tmp, "scored", data_uri, args.steps, args.every, args.poll)
    print(f"steps={args.steps}")
    print(f"checkpoint_every={args.every}")
    print(f"baseline_step_s={base['step_s']:.5f}")
    print(f"scored_step_s={scored['step_s']:.5f}")
    print(f"step_time_ratio={scored['step_s'] / base['step_s']:.3f}")
    for key in ("scored_during_run", "scored_total", "picked_step"):
        print(f"{key}={scored[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
