"""SIGKILL of one worker: restart in place (torchrun's own restart, the node-local tier) against a
relaunch of the whole gang, measured in the same run on the local backend's terms.

Each round trains a 2-rank gang under torchrun (``--standalone``, the trainer as a launcher
starts it: ``TRAINOPS_ATTEMPT``, ``trainer.contract.TORCHRUN_ENV``), checkpointed every
``--every`` steps, until a checkpoint is committed and ``--kill-after`` steps are logged; then:

- **in place** (``--max-restarts=2``, as ``restarts_in_place`` gives it): SIGKILL one worker
  process; torchrun stops the other, restarts both, and the gang resumes from the newest
  checkpoint. Measured: the kill to the restarted gang's first step (``first_step_time`` of the
  attempt record, whose ``restarts`` and ``restore_files`` say what happened);
- **relaunch** (the baseline, ``--max-restarts=0``): SIGKILL the whole torchrun process group,
  as losing the pod does, and at once start attempt 2 (a fresh cache: new pods have empty
  disks), which resumes from storage. Measured the same way: the kill to attempt 2's first step.

The relaunch here starts the instant the gang is dead: on a cluster it also waits for the
operator to see the failure (its poll), for the old pods to go and new ones to be scheduled,
pulled and started, which this measures none of. So ``in_place_vs_relaunch`` is an upper bound
of the ratio a cluster sees. Prints ``name=value`` lines::

    .venv/bin/python bench/restart_in_place.py [--rounds 3] [--preset tiny] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import REPO, env, write_random_dataset
from checkpoint import config

from trainer.contract import TORCHRUN_ENV, MetricsReader, RunLayout
from trainer.storage import NotFound, open_storage

DEADLINE_S = 300.0


def argv(cfg: Path, max_restarts: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={max_restarts}",
        "-m",
        "trainer",
        "train",
        "--config",
        str(cfg),
    ]


def logged(store, run_uri: str) -> int:
    try:
        return max((r["step"] for r in MetricsReader(store, run_uri).records()), default=0)
    except NotFound:
        return 0


def committed(store, run_uri: str) -> int:
    try:
        return int(store.get_json(RunLayout(run_uri).latest).get("step", 0))
    except NotFound:
        return 0


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the gang ended or timed out before {what}:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.05)


def workers(pid: int) -> list[int]:
    """torchrun's worker processes (its children)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def start(cfg: Path, environ: dict, max_restarts: int, attempt: int) -> subprocess.Popen:
    return subprocess.Popen(
        argv(cfg, max_restarts),
        env={**environ, **TORCHRUN_ENV, "TRAINOPS_ATTEMPT": str(attempt)},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen) -> str:
    out = proc.communicate(timeout=DEADLINE_S)[0]
    if proc.returncode != 0:
        raise RuntimeError(f"the gang failed ({proc.returncode}):\n{out[-3000:]}")
    return out


def one_round(tmp: Path, data_uri: str, args: argparse.Namespace, in_place: bool) -> dict:
    name = "in_place" if in_place else "relaunch"
    run_uri = (tmp / name).as_uri()
    store = open_storage(run_uri)
    cfg = config(tmp, run_uri, data_uri, args.steps, args.every, preset=args.preset, resume="auto")
    environ = env(tmp / f"cache-{name}-1")
    proc = start(cfg, environ, 2 if in_place else 0, 1)
    wait_for(
        lambda: committed(store, run_uri) > 0 and logged(store, run_uri) >= args.kill_after,
        proc,
        f"step {args.kill_after}",
    )
    if in_place:
        os.kill(workers(proc.pid)[-1], signal.SIGKILL)
        killed_at = time.time()
        finish(proc)
        record = store.get_json(RunLayout(run_uri).attempt(1))
        if not record.get("restarts"):
            raise RuntimeError(f"the attempt was not restarted in place: {json.dumps(record)[:2000]}")
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        proc.communicate()
        second = start(cfg, env(tmp / f"cache-{name}-2"), 0, 2)
        finish(second)
        record = store.get_json(RunLayout(run_uri).attempt(2))
    return {
        "kill_to_step_s": record["first_step_time"] - killed_at,
        "resumed_from": record["resumed_from_step"],
        "restore_files": record.get("restore_files"),
        "outcome": record["outcome"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--kill-after", type=int, default=25)
    parser.add_argument("--smoke", action="store_true", help="one round of each, 30 steps")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.kill_after = 1, 30, 15
    results: dict[str, list[dict]] = {"in_place": [], "relaunch": []}
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as folder:
        tmp = Path(folder)
        data_uri = write_random_dataset(tmp / "data", tokens=200_000)
        for n in range(args.rounds):
            for in_place in (True, False):
                round_dir = tmp / f"round{n}"
                round_dir.mkdir(exist_ok=True)
                results["in_place" if in_place else "relaunch"].append(
                    one_round(round_dir, data_uri, args, in_place)
                )
    print(f"preset={args.preset}")
    print(f"rounds={args.rounds}")
    print(f"kill_after_steps={args.kill_after}")
    for name, rounds in results.items():
        times = [r["kill_to_step_s"] for r in rounds]
        print(f"{name}_kill_to_step_s={','.join(f'{t:.2f}' for t in times)}")
        print(f"{name}_kill_to_step_max_s={max(times):.2f}")
        print(f"{name}_kill_to_step_median_s={statistics.median(times):.2f}")
        print(f"{name}_resumed_from={','.join(str(r['resumed_from']) for r in rounds)}")
        print(
            f"{name}_restore_files={json.dumps([r['restore_files'] for r in rounds], separators=(',', ':'))}"
        )
    ratio = statistics.median(r["kill_to_step_s"] for r in results["in_place"]) / statistics.median(
        r["kill_to_step_s"] for r in results["relaunch"]
    )
    print(f"in_place_vs_relaunch={ratio:.3f}")


if __name__ == "__main__":
    main()
