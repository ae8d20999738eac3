"""Goodput of a 24-hour, 8-node run of the ``1b`` preset under spot preemptions (one an hour,
one every 3 hours), projected from components measured in this same run.

Measured here, by the real trainer (one CPU process, as an attempt runs it; ``--preset``,
``small`` by default: about 85M parameters and a 1 GB training state), on file:// (default) or
moto's S3 over HTTP (``--storage s3``):

1. attempt 1 trains with an async checkpoint every 4 steps and is sent SIGTERM: ``step_s``
   (median step, its first left out), each save's blocking as the metrics record it
   (``checkpoint_blocked_s``, and the staging part without the wait for the previous save),
   and its emergency save (``emergency_save_s`` of its attempt record: the full synchronous
   save, so the upload rate);
2. attempt 2 resumes from that checkpoint: its record's ``restore_s`` (the trainer times
   ``Checkpointer.load_latest``, the restore rate) and ``first_step_time``, from which
   ``relaunch_local_s`` = its process launch to its first step, less the restore (interpreter,
   imports, process group, model build, data).

Rates are the checkpoint's bytes (its committed files) over those seconds. The projection
scales them to ``1b`` with the assumptions below, each printed with its value (and each a
command-line option):

- the run: 8 nodes x 8 H100 (989 TFLOP/s dense bf16, ``trainer.flops``), the ``1b`` preset with
  a 32,000-token vocabulary, 1,024 sequences of 2,048 tokens a step (TinyLlama-1.1B's 2M-token
  batch), at 40% MFU, the estimate's documented default (docs/cost.md): ``step_1b_s``;
- its checkpoint: 12 bytes a parameter (fp32 weights and two fp32 AdamW moments), each node
  saving and reading its 1/8 share;
- save blocking: a node's share over the staging rate measured here (a GPU's copy to host
  memory over PCIe is faster than this CPU's copy: conservative); the save's upload over the
  emergency save's rate, done in the background (it only delays the commit);
- restore: a node's share over the restore rate measured here x ``--restore-factor`` (1);
- relaunch: ``relaunch_local_s`` + ``--cluster-relaunch-s`` (60 s: the operator seeing the end
  (5 s polls), the new pods scheduled on ready capacity with the image cached, containers
  started, the rendezvous); no wait for capacity (a spot pool with room, or the on-demand
  fallback). ``relaunch_budget_1ph_s`` prints the longest relaunch that still meets 0.95;
- the checkpoint interval: Young/Daly's optimum ``sqrt(2 x save blocking x MTBF)``, no shorter
  than one upload (a save must commit before the next starts) nor one step, in whole steps;
- each preemption costs relaunch + restore + lost progress. Without notice (the default, the
  goal's case: nothing saved at the signal), lost progress is the work since the last committed
  checkpoint, on average half an interval plus one upload. With the notice watcher
  (``*_notice``), the emergency save commits before the node goes: 0 lost, the gang stalled for
  one synchronous save. The first launch costs one relaunch without restore.

goodput = productive seconds / 24 h of 64 GPUs billed = (1 - (first launch + preemptions x
their cost) / 24 h) / (1 + save blocking / interval). Goals: goodput_1ph >= 0.95,
goodput_3ph >= 0.97. ``--smoke`` measures with the ``tiny`` preset in a few seconds, to check
the script. Prints ``name=value`` lines::

    .venv/bin/python bench/goodput.py [--storage file|s3] [--preset small] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
from _common import REPO, env, median_interval, write_random_dataset
from checkpoint import config as checkpoint_config

from trainer import flops
from trainer.presets import PRESETS, non_embedding_params, param_count

DAY_S = 24 * 3600.0
SAVE_EVERY = 4  # attempt 1's async saves: 2 of them before the signal


@dataclass(frozen=True)
class Measured:
    """What this run measured (seconds, bytes, bytes per second)."""

    preset: str
    storage: str
    step_s: float
    checkpoint_bytes: int
    save_blocked_s: list[float]
    save_staged_s: list[float]
    emergency_save_s: float
    restore_s: float
    relaunch_local_s: float

    @property
    def staging_bytes_per_s(self) -> float:
        return self.checkpoint_bytes / statistics.median(self.save_staged_s)

    @property
    def upload_bytes_per_s(self) -> float:
        return self.checkpoint_bytes / self.emergency_save_s

    @property
    def restore_bytes_per_s(self) -> float:
        return self.checkpoint_bytes / self.restore_s


@dataclass(frozen=True)
class Assumptions:
    """The projected run; every field is printed and is a command-line option."""

    hours: float = 24.0
    nodes: int = 8
    gpus_per_node: int = 8
    gpu: str = "NVIDIA H100"
    mfu: float = 0.4
    seq_len: int = 2048
    sequences_per_step: int = 1024
    vocab_size: int = 32000
    bytes_per_param: int = 12
    restore_factor: float = 1.0
    cluster_relaunch_s: float = 60.0


def config(folder: Path, run_uri: str, data_uri: str, preset: str) -> Path:
    """One config for both attempts: ``resume: auto`` (attempt 1 finds nothing and starts
    fresh), far more steps than either attempt trains before it is stopped."""
    return checkpoint_config(folder, run_uri, data_uri, 100_000, SAVE_EVERY, preset=preset, resume="auto")


def _records(store, run_uri: str, attempt: int) -> list[dict]:
    from trainer.contract import MetricsReader
    from trainer.storage import NotFound

    try:
        found = MetricsReader(store, run_uri).records()
    except NotFound:
        return []
    by_step = {r["step"]: r for r in found if r.get("attempt") == attempt}
    return [by_step[s] for s in sorted(by_step)]


def attempt_until(
    cfg: Path, environ: dict, store, run_uri: str, attempt: int, steps: int
) -> tuple[float, dict]:
    """Run attempt ``attempt`` until it logged ``steps`` steps, then SIGTERM it; its launch
    time (epoch seconds) and its attempt record."""
    from trainer.contract import RunLayout

    launched = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--config", str(cfg)],
        env={**environ, "TRAINOPS_ATTEMPT": str(attempt)},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 900
    while len(_records(store, run_uri, attempt)) < steps:
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.communicate()[0] if proc.poll() is not None else "(still running at the deadline)"
            proc.kill()
            raise RuntimeError(f"attempt {attempt} stopped before {steps} steps:\n{out[-3000:]}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=900)
    record = store.get_json(RunLayout(run_uri).attempt(attempt))
    if record.get("outcome") != "preempted":
        raise RuntimeError(
            f"attempt {attempt} ended {record.get('outcome')!r}, not preempted:\n{out[-3000:]}"
        )
    return launched, record


def checkpoint_bytes(store, run_uri: str) -> int:
    """The bytes of the newest committed checkpoint's files."""
    from trainer.checkpoint.files import find_latest
    from trainer.contract import RunLayout

    found = find_latest(store, RunLayout(run_uri))
    if found is None:
        raise RuntimeError("no committed checkpoint to measure")
    return sum(int(entry["size"]) for entry in found[1]["files"])


def measure(tmp: Path, preset: str, root: str, environ: dict) -> Measured:
    """Attempt 1 (saves, then SIGTERM and its emergency save), attempt 2 (resume, one step)."""
    from trainer.storage import open_storage

    data_uri = write_random_dataset(tmp / "data", tokens=200_000)
    run_uri = f"{root}/runs/goodput"
    store = open_storage(root)
    cfg = config(tmp, run_uri, data_uri, preset)
    _, first = attempt_until(cfg, environ, store, run_uri, 1, 2 * SAVE_EVERY + 2)
    size = checkpoint_bytes(store, run_uri)
    steps = _records(store, run_uri, 1)
    saves = [r for r in steps if "checkpoint_blocked_s" in r]
    launched, second = attempt_until(cfg, environ, store, run_uri, 2, 1)
    if "restore_s" not in second or "first_step_time" not in second:
        raise RuntimeError(f"attempt 2's record has no restore_s or first_step_time: {second}")
    return Measured(
        preset=preset,
        storage=root.split(":", 1)[0],
        step_s=median_interval([r["time"] for r in steps], skip=1),
        checkpoint_bytes=size,
        save_blocked_s=[r["checkpoint_blocked_s"] for r in saves],
        save_staged_s=[r["checkpoint_blocked_s"] - r.get("checkpoint_waited_s", 0.0) for r in saves],
        emergency_save_s=float(first["emergency_save_s"]),
        restore_s=float(second["restore_s"]),
        relaunch_local_s=max(0.0, second["first_step_time"] - launched - second["restore_s"]),
    )


def step_1b_s(a: Assumptions) -> float:
    """Seconds per step of ``1b`` on the assumed GPUs: its FLOPs at the assumed MFU."""
    args = PRESETS["1b"].with_vocab(a.vocab_size)
    per_token = flops.flops_per_token(non_embedding_params(args), args.n_layers, args.dim, a.seq_len)
    peak = flops.peak_flops(a.gpu, "bf16")
    if peak is None:
        raise ValueError(f"no bf16 peak known for {a.gpu!r}; name an NVIDIA GPU trainer.flops knows")
    return a.sequences_per_step * a.seq_len * per_token / (a.mfu * peak * a.nodes * a.gpus_per_node)


def components(m: Measured, a: Assumptions) -> dict[str, float]:
    """The ``1b`` run's components, scaled from what was measured (seconds, bytes)."""
    per_node = param_count(PRESETS["1b"].with_vocab(a.vocab_size)) * a.bytes_per_param / a.nodes
    restore = per_node / m.restore_bytes_per_s * a.restore_factor
    return {
        "step_s": step_1b_s(a),
        "checkpoint_bytes_per_node": per_node,
        "save_blocking_s": per_node / m.staging_bytes_per_s,
        "upload_s": per_node / m.upload_bytes_per_s,
        "emergency_save_s": per_node / m.upload_bytes_per_s,
        "restore_s": restore,
        "relaunch_s": m.relaunch_local_s + a.cluster_relaunch_s,
    }


def project(c: dict[str, float], mtbf_s: float, hours: float, *, notice: bool) -> dict[str, float]:
    """Goodput of ``hours`` of wall time with a preemption every ``mtbf_s`` seconds on average.

    :param notice: the emergency save commits before the node goes (0 steps lost, one
        synchronous save per preemption); else the work since the last commit is lost.
    """
    wall = hours * 3600
    optimum = math.sqrt(2 * c["save_blocking_s"] * mtbf_s)
    every = max(1, round(max(optimum, c["upload_s"], c["step_s"]) / c["step_s"]))
    interval = every * c["step_s"]
    lost = 0.0 if notice else interval / 2 + c["upload_s"]
    per_preemption = c["relaunch_s"] + c["restore_s"] + lost + (c["emergency_save_s"] if notice else 0.0)
    preemptions = wall / mtbf_s
    training = wall - c["relaunch_s"] - preemptions * per_preemption
    goodput = max(0.0, training) / (1 + c["save_blocking_s"] / interval) / wall
    return {
        "goodput": goodput,
        "young_daly_interval_s": optimum,
        "interval_s": interval,
        "every_steps": float(every),
        "preemptions": preemptions,
        "lost_progress_s": lost,
        "per_preemption_s": per_preemption,
        "save_overhead": (c["save_blocking_s"] / interval) / (1 + c["save_blocking_s"] / interval),
        "preemption_overhead": preemptions * per_preemption / wall,
    }


def relaunch_budget(c: dict[str, float], mtbf_s: float, hours: float, goal: float) -> float:
    """The longest relaunch (seconds) for which the goodput without notice is still ``goal``."""
    wall, interval = hours * 3600, project(c, mtbf_s, hours, notice=False)["interval_s"]
    fixed = c["restore_s"] + interval / 2 + c["upload_s"]
    preemptions = wall / mtbf_s
    # goal = (wall - R - n (R + fixed)) / (1 + C / interval) / wall, solved for R
    return (wall - goal * wall * (1 + c["save_blocking_s"] / interval) - preemptions * fixed) / (
        1 + preemptions
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storage", choices=("file", "s3"), default="file")
    p.add_argument("--preset", default="small", help="the model measured here (default small)")
    p.add_argument("--smoke", action="store_true", help="measure with the tiny preset, in seconds")
    defaults = Assumptions()
    for name, value in asdict(defaults).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    a = p.parse_args()
    assumed = Assumptions(**{k: getattr(a, k) for k in asdict(defaults)})
    preset = "tiny" if a.smoke else a.preset
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        tmp = Path(d)
        environ = env(tmp / "cache", threads=2)
        root = f"file://{tmp / 'storage'}"
        if a.storage == "s3":
            from checkpoint import moto_s3

            root, creds = stack.enter_context(moto_s3())
            environ.update(creds)
        measured = measure(tmp, preset, root, environ)
    c = components(measured, assumed)
    figures: dict[str, object] = {
        "measured_preset": measured.preset,
        "measured_storage": measured.storage,
        "measured_step_s": round(measured.step_s, 4),
        "measured_checkpoint_bytes": measured.checkpoint_bytes,
        "measured_save_blocked_s": [round(s, 4) for s in measured.save_blocked_s],
        "measured_save_staged_s": [round(s, 4) for s in measured.save_staged_s],
        "measured_staging_mb_s": round(measured.staging_bytes_per_s / 1e6, 1),
        "measured_emergency_save_s": measured.emergency_save_s,
        "measured_upload_mb_s": round(measured.upload_bytes_per_s / 1e6, 1),
        "measured_restore_s": measured.restore_s,
        "measured_restore_mb_s": round(measured.restore_bytes_per_s / 1e6, 1),
        "measured_relaunch_local_s": round(measured.relaunch_local_s, 2),
        **{f"assumed_{k}": v for k, v in asdict(assumed).items()},
        **{f"1b_{k}": round(v, 3) for k, v in c.items()},
    }
    for label, mtbf in (("1ph", 3600.0), ("3ph", 3 * 3600.0)):
        for notice in (False, True):
            suffix = "_notice" if notice else ""
            out = project(c, mtbf, assumed.hours, notice=notice)
            for k, v in out.items():
                if k != "goodput":
                    figures[f"{k}_{label}{suffix}"] = round(v, 4)
            figures[f"goodput_{label}{suffix}"] = round(out["goodput"], 4)
    figures["relaunch_budget_1ph_s"] = round(relaunch_budget(c, 3600.0, assumed.hours, 0.95), 1)
    figures["relaunch_budget_3ph_s"] = round(relaunch_budget(c, 3 * 3600.0, assumed.hours, 0.97), 1)
    for name, value in figures.items():
        print(f"{name}={value}")


if __name__ == "__main__":
    main()
