"""Does the trainer's cost grow with a rank's share of the work, not with the whole model?

CPU, 2 processes (torchrun, gloo). Each figure is one function of :data:`FIGURES`; it runs
what it measures and returns ``name=value`` lines. Goals (issue #14):

- ``setup_peak_rss_ratio``: each rank's peak RSS during the trainer's ``setup`` (data, model
  built on the meta device and sharded, its shards materialised, optimizer, checkpointer),
  above the RSS it had before setup (the interpreter, torch and the process group: printed
  as ``setup_baseline_rss_mib``), over the bytes of its share of the model with AdamW's two
  moments (3 x fp32 x parameters / world size). The worst rank counts. Goal <= 1.5.
  ``setup_peak_rss_ratio_params`` divides by the parameters' share alone (the optimizer's
  moments do not exist yet after setup): a rank that held the whole model would show at least
  the world size here; ``setup_peak_rss_ratio_params_whole_model`` is that figure for a model
  built whole on every rank and then sharded (the path a user's ``model.builder`` takes).
- ``blocking_steps``: the longest the training loop waited for one async checkpoint, the wait
  for a previous save still in flight included (each checkpoint step's ``checkpoint_blocked_s``
  in ``metrics.jsonl``), over the median step time of the same run, for the real trainer
  saving to ``s3://`` on moto's server over HTTP every ``--every-steps`` steps. Goal <= 1.
  ``blocking_save_steps`` is a whole save (staging, writing, upload, commit) over the median
  step: below that many steps between saves the loop waits for the previous one, whatever the
  staging costs.

    .venv/bin/python bench/scale.py [--preset small] [--every-steps 16] [--only blocking_steps]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, torchrun, write_random_dataset
from checkpoint import moto_s3, save_blocking

NPROC = 2
MIB = 2**20


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def setup_worker(out_dir: Path, config_path: str) -> None:
    """One rank: the RSS before and after the trainer's setup, and its share of the model."""
    from trainer import parallel
    from trainer.attempts import Attempt, now_iso
    from trainer.config import load_config
    from trainer.contract import RunLayout
    from trainer.storage import open_storage
    from trainer.train import setup

    config = load_config(config_path)
    dist_env = parallel.init_distributed()
    storage, layout = open_storage(config.run_uri), RunLayout(config.run_uri)
    attempt = Attempt(storage, layout, 1, dist_env.world_size, started_at=now_iso())
    before = peak_rss_bytes()
    training = setup(config, dist_env, attempt)
    after = peak_rss_bytes()
    params = training.built.param_count
    (out_dir / f"setup_{dist_env.rank}.json").write_text(
        json.dumps({"before": before, "after": after, "params": params, "world": dist_env.world_size})
    )
    parallel.barrier()
    parallel.shutdown()


# The path a user's builder still takes (docs/models.md): the whole model on every rank's CPU.
WHOLE_MODEL_BUILDER = """
def build(vocab_size, seq_len):
    from trainer.model import Transformer
    from trainer.presets import PRESETS

    model = Transformer(PRESETS[{preset!r}].with_vocab(vocab_size))
    return model, list(model.layers)
"""


def measure_setup(tmp: Path, data_uri: str, name: str, model: dict) -> list[dict]:
    """Each rank's RSS before and after setup, for a run of ``model`` (config keys)."""
    config = tmp / f"{name}.json"  # JSON is YAML
    config.write_text(
        json.dumps(
            {
                "run_uri": (tmp / name).as_uri(),
                "data_uri": data_uri,
                "precision": "fp32",
                "model": model,
                "train": {"max_steps": 1, "micro_batch_size": 1, "seq_len": 64},
            }
        )
    )
    out = tmp / f"{name}_out"
    out.mkdir()
    environ = env(tmp / "cache")
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp), environ["PYTHONPATH"]])
    torchrun([__file__, "--worker", "setup", str(out), str(config)], NPROC, environ)
    return [json.loads((out / f"setup_{r}.json").read_text()) for r in range(NPROC)]


def setup_peak_rss_ratio(tmp: Path, args: argparse.Namespace) -> list[str]:
    data_uri = write_random_dataset(tmp / "data", tokens=200_000)
    (tmp / "scale_whole_model.py").write_text(WHOLE_MODEL_BUILDER.format(preset=args.preset))
    sharded = measure_setup(tmp, data_uri, "sharded", {"preset": args.preset})
    whole = measure_setup(tmp, data_uri, "whole", {"builder": "scale_whole_model:build"})
    share_params = max(r["params"] * 4 / r["world"] for r in sharded)

    def grown(ranks: list[dict]) -> int:
        return max(r["after"] - r["before"] for r in ranks)

    return [
        f"setup_preset={args.preset} params={sharded[0]['params']} world_size={NPROC}",
        f"setup_baseline_rss_mib={max(r['before'] for r in sharded) / MIB:.0f}",
        f"setup_grown_rss_mib={grown(sharded) / MIB:.0f}",
        f"setup_share_mib={3 * share_params / MIB:.0f}",
        f"setup_peak_rss_ratio={grown(sharded) / (3 * share_params):.2f}",
        f"setup_peak_rss_ratio_params={grown(sharded) / share_params:.2f}",
        f"setup_peak_rss_ratio_params_whole_model={grown(whole) / share_params:.2f}",
    ]


SAVED = re.compile(r"checkpoint: step (\d+) staged in [0-9.]+s .*; committed in ([0-9.]+)s$", re.M)


def blocking_steps(tmp: Path, args: argparse.Namespace) -> list[str]:
    """The trainer on 2 ranks, 2 async saves to S3 (moto over HTTP), then its final one."""
    from trainer.storage import open_storage

    data_uri = write_random_dataset(tmp / "data", tokens=200_000)
    every, saves = args.every_steps, 2
    with moto_s3() as (root, creds):
        run_uri = f"{root}/runs/blocking"
        config = tmp / "blocking.json"  # JSON is YAML
        config.write_text(
            json.dumps(
                {
                    "run_uri": run_uri,
                    "data_uri": data_uri,
                    "seed": 1,
                    "precision": "fp32",
                    "resume": "never",
                    "model": {"preset": args.preset},
                    "train": {"max_steps": every * saves + 1, "micro_batch_size": 1, "seq_len": 64},
                    "checkpoint": {"every_steps": every, "keep": 2},
                    # metrics reach storage at the end: the loop's steps time training and saves
                    "metrics": {"flush_every": every * saves + 1},
                }
            )
        )
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}"]
        proc = subprocess.run(
            [*cmd, "-m", "trainer", "train", "--config", str(config)],
            env={**env(tmp / "cache"), **creds},
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=REPO,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"the trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        records = [
            json.loads(line) for line in open_storage(run_uri).get(f"{run_uri}/metrics.jsonl").splitlines()
        ]
    blocking = save_blocking(sorted(records, key=lambda r: r["step"]))
    whole = [float(s) for _, s in SAVED.findall(proc.stdout + proc.stderr)]
    save_s = statistics.median(whole)
    return [
        f"blocking_preset={args.preset} world_size={NPROC} every_steps={every} saves={len(blocking['blocked_s'])} "
        "storage=s3 (moto over HTTP)",
        f"blocking_step_s={blocking['step_s']:.3f}",
        f"blocking_worst_blocked_s={max(blocking['blocked_s']):.3f}",
        f"blocking_worst_waited_s={max(blocking['waited_for_previous_s']):.3f}",
        f"blocking_worst_staged_s={max(blocking['staged_s']):.3f}",
        f"blocking_staged_s={' '.join(f'{s:.3f}' for s in blocking['staged_s'])}",
        f"blocking_save_s={save_s:.2f}",
        f"blocking_save_steps={save_s / blocking['step_s']:.2f}",
        f"blocking_steps={blocking['blocking_steps']:.3f}",
    ]


FIGURES: dict[str, Callable[[Path, argparse.Namespace], list[str]]] = {
    "setup_peak_rss_ratio": setup_peak_rss_ratio,
    "blocking_steps": blocking_steps,
}
WORKERS: dict[str, Callable[[Path, str], None]] = {"setup": setup_worker}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        WORKERS[sys.argv[2]](Path(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="model preset (default small: ~85M parameters)")
    parser.add_argument("--only", choices=sorted(FIGURES), action="append", help="figures to measure")
    parser.add_argument(
        "--every-steps",
        type=int,
        default=16,
        help="checkpoint.every_steps for blocking_steps (default 16: moto takes a `small` checkpoint in "
        "about 8 steps of 2 CPU ranks)",
    )
    args = parser.parse_args()
    for name in args.only or list(FIGURES):
        with tempfile.TemporaryDirectory(prefix=f"scale-{name}-") as tmp:
            for line in FIGURES[name](Path(tmp), args):
                print(line, flush=True)


if __name__ == "__main__":
    main()
