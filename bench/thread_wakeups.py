"""Which threads wake while the trainer trains, against the hand-written loop of ``trainer_overhead.py``.

On a small CPU host (2 ranks on 2 cores) every thread that wakes takes a core from a training
thread: the kernel counts it as an involuntary context switch of that thread. This runs each
program for ``--steps`` steps (2 ranks, CPU, bf16, no checkpoints while it trains) and samples
``/proc/<pid>/task/*/status`` of both ranks twice, ``--window`` seconds apart, once the steps
run. It prints per thread name the wake-ups a second (voluntary switches: the thread slept and
woke), the involuntary switches a second and the CPU share, then ratios of ours over the
baseline from the same run:

- ``main_preempted_ratio=``: the training threads' involuntary switches a second;
- ``gloo_loops_ours=``, ``gloo_loops_baseline=``: gloo TCP loop threads per rank (one per gloo
  process group; each wakes every 10 ms even when its group is idle).

Linux only (``/proc``). Timings are not its point: the counts are steady under load.

    .venv/bin/python bench/thread_wakeups.py [--steps 150] [--window 8] [--micro-batch 32]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, write_random_dataset
from trainer_overhead import write_config

MAIN = "(training thread)"


def rank_pids(launcher: int) -> list[int]:
    """The worker processes torchrun (pid ``launcher``) started: its children with a LOCAL_RANK."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == launcher and b"LOCAL_RANK=" in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue  # gone, or not ours to read
    return sorted(found)


def sample(pids: list[int]) -> dict[tuple[int, int], tuple[str, int, int, float]]:
    """(pid, tid) -> (thread name, voluntary switches, involuntary switches, CPU seconds)."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue  # the thread ended
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            name = MAIN if int(tid) == pid else fields["Name"].strip()
            cpu = sum(int(x) for x in stat.rsplit(")", 1)[1].split()[11:13]) / ticks
            threads[(pid, int(tid))] = (
                name,
                int(fields["voluntary_ctxt_switches"]),
                int(fields["nonvoluntary_ctxt_switches"]),
                cpu,
            )
    return threads


def measure(args: list[str], tmp: Path, warmup_s: float, window_s: float) -> tuple[dict, int]:
    """Per thread name, summed over both ranks: [wake-ups/s, preemptions/s, CPU share, threads];
    and the number of ranks sampled."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]
    proc = subprocess.Popen(
        cmd, env=env(tmp / "cache"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(warmup_s)  # imports, setup and the first steps
        pids = rank_pids(proc.pid)
        before, start = sample(pids), time.monotonic()
        time.sleep(window_s)
        after, elapsed = sample(pids), time.monotonic() - start
        if proc.poll() is not None:
            raise SystemExit(
                f"{' '.join(cmd)} ended before the window closed: raise --steps\n{proc.stderr.read()}"
            )
    finally:
        _, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for key, (name, vol, invol, cpu) in after.items():
        if key in before:
            _, vol0, invol0, cpu0 = before[key]
            row = by_name[name]
            row[0] += (vol - vol0) / elapsed
            row[1] += (invol - invol0) / elapsed
            row[2] += (cpu - cpu0) / elapsed
            row[3] += 1
    return dict(by_name), len(pids)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--window", type=float, default=8.0, help="seconds between the two samples")
    p.add_argument("--warmup", type=float, default=14.0, help="seconds from launch to the first sample")
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--preset", default="tiny")
    a = p.parse_args()
    if not Path("/proc/self/task").is_dir():
        raise SystemExit("this counts threads through /proc: it runs on Linux only")
    results = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data_uri = write_random_dataset(tmp / "data")
        config = write_config(tmp, data_uri, a.preset, a.steps, a.micro_batch, 128, "wakeups")
        programs = {
            "ours": ["-m", "trainer", "train", "--config", str(config)],
            "baseline": [
                str(REPO / "bench" / "baseline_fsdp.py"),
                "--config",
                str(config),
                "--out",
                str(tmp / "b.json"),
            ],
        }
        for name, args in programs.items():
            results[name] = measure(args, tmp, a.warmup, a.window)
            threads, ranks = results[name]
            print(f"{name}: {ranks} ranks, per second over both ranks", file=sys.stderr)
            for thread, (woke, preempted, cpu, n) in sorted(threads.items(), key=lambda kv: -kv[1][0]):
                print(
                    f"  {thread:20s} x{n:<2d} wake-ups {woke:7.1f}  preempted {preempted:7.1f}  CPU {cpu:.3f}",
                    file=sys.stderr,
                )
    (ours, ours_ranks), (base, base_ranks) = results["ours"], results["baseline"]
    print(f"config: preset={a.preset} micro_batch={a.micro_batch} seq_len=128 world=2 precision=bf16 cpu")
    print(f"main_preempted_ratio={ours[MAIN][1] / base[MAIN][1]:.3f}")
    print(f"gloo_loops_ours={ours.get('gloo_tcp_loop', [0, 0, 0, 0])[3] / ours_ranks:g}")
    print(f"gloo_loops_baseline={base.get('gloo_tcp_loop', [0, 0, 0, 0])[3] / base_ranks:g}")


if __name__ == "__main__":
    main()
