"""``checkpoint.every_steps: auto`` on S3 (moto over HTTP), against a fixed save every 4 steps.

Issue 31, item 7's goals: ``auto`` stalls the loop at most 1 step per save (waits for the previous
save included), and a preemption without notice loses at most 2 intervals' work. The issue's
background, on the same storage: a save every 4 steps of ``small`` stalls the loop 3.18 steps
per save, and one full save takes 10.4 steps.

Two runs of the real trainer (one CPU process each, one after the other, the ``small`` preset:
about 85M parameters, a 1 GB training state; ``--smoke``: ``tiny``, in seconds), each against
the same moto S3 endpoint (``bench/checkpoint.py``'s ``moto_s3``), each stopped by SIGTERM once
its log shows the saves it needs committed:

1. ``auto``: ``checkpoint.every_steps: auto`` with ``checkpoint.preemptions_per_hour`` set to
   ``--preemptions-per-hour`` (printed: more preemptions an hour than the default 1 give a
   shorter Young/Daly optimum, so more saves in a short run). Its first two saves (steps 10 and
   20) measure the save and are left out of the goal figures; ``--saves`` saves come after them.
2. ``every4``: ``checkpoint.every_steps: 4``; its first save (the staging buffers are allocated
   then, and no save is in flight before it) is left out as warm-up; ``--baseline-saves`` after it.

Figures (``name=value``), each run's step time being the median gap between consecutive steps'
metrics records (``time``), its first step left out:

- ``*_stall_steps_max`` / ``_mean``: each save's ``checkpoint_blocked_s`` (every second the loop
  was held: the copy to CPU memory and any wait for the previous save) over the step time.
  Goal (auto): max <= 1. ``*_waited_saves``: how many of those saves waited for the previous one.
- ``auto_interval_steps``: the last interval ``auto`` chose (``checkpoint_every_steps`` of the last
  save's record); ``auto_interval_s``: that many steps at the median step time.
- ``*_lost_intervals_max``: the work a preemption without notice loses at worst, in intervals.
  For each counted save k, a preemption just before k commits falls back to save k-1: it loses
  the time from save k-1 to save k (the gap between their steps' metrics records) plus k's time
  from its start to its commit, over that gap. The commit time is read from the trainer's log line
  ``checkpoint: step N staged in ...; committed in X s`` (the figure
  ``Checkpointer.last_commit_s`` holds, to 0.1 s; it counts from the save's start, its wait for the previous save
  included). Goal (auto): max <= 2.
  ``auto_lost_intervals_last_interval`` reads it as (the last interval + the longest commit of
  a counted save) / the last interval, the interval at the median step time.
- ``stall_ratio_auto_vs_every4``: auto's mean stall (in its steps) over every4's (in its steps);
  ``stall_s_ratio_*`` the same in seconds. A save in flight slows the steps beside it (the upload
  and moto's server share the CPU with training), so every4's steps are slower and its stalls
  smaller in steps than in seconds. ``*_wall_s_per_step``: the run's wall time per step, stalls
  included; ``*_gaps_s``: the seconds between consecutive saves.

The trainer's own ``checkpoint: every N steps ...`` lines (the rule and its inputs) are printed
on stderr.

    .venv/bin/python bench/checkpoint_auto.py [--smoke] [--preemptions-per-hour 12] [--saves 4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
from _common import env, write_random_dataset
from checkpoint import config as checkpoint_config
from checkpoint import metrics, moto_s3, save_blocking, trainer

MEASURING_SAVES = 2  # auto's first two saves: at +10 steps each, to measure the save
COMMITTED = re.compile(r"checkpoint: step (\d+) staged in .*?; committed in ([0-9.]+)s")
CHOSEN = re.compile(r"checkpoint: every \d+ steps .*|checkpoint: every_steps auto.*")


@dataclass(frozen=True)
class Save:
    """One async save as the run recorded it (seconds)."""

    step: int
    time: float  # the saving step's metrics record's time (epoch)
    blocked_s: float
    waited_s: float
    commit_s: float | None  # its start to its commit, from the log; None: not seen committed
    every_steps: int | None  # auto: the interval chosen at this save


def config(tmp: Path, run_uri: str, data_uri: str, preset: str, every: int | str, per_hour: float) -> Path:
    """``bench/checkpoint.py``'s config (seq_len 64, one sequence a step, fp32, a metrics record
    every step), with the preset, ``checkpoint.every_steps`` and the preemption rate set here."""
    path = checkpoint_config(tmp, run_uri, data_uri, steps=100_000, every=4)
    cfg = json.loads(path.read_text())
    cfg["model"]["preset"] = preset
    cfg["checkpoint"].update(every_steps=every, preemptions_per_hour=per_hour)
    path.write_text(json.dumps(cfg))
    return path


def saves_of(records: list[dict], log: str) -> list[Save]:
    """The run's async saves, from its metrics records and its log."""
    commits = {int(step): float(s) for step, s in COMMITTED.findall(log)}
    return [
        Save(
            step=r["step"],
            time=r["time"],
            blocked_s=r["checkpoint_blocked_s"],
            waited_s=r["checkpoint_waited_s"],
            commit_s=commits.get(r["step"]),
            every_steps=r.get("checkpoint_every_steps"),
        )
        for r in records
        if "checkpoint_blocked_s" in r
    ]


def run_until(
    cfg: Path, environ: dict, store, run_uri: str, saves: int, timeout: float = 1800
) -> tuple[list[dict], str]:
    """Train until ``saves`` async saves have committed (counted from the log, which costs the
    loop nothing: polling the metrics on S3 would load these 2 cores), then SIGTERM: the
    records and the log."""
    proc = trainer(cfg, environ)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # never a full pipe
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while len(COMMITTED.findall("".join(lines))) < saves:
            if proc.poll() is not None:
                reader.join(10)
                raise RuntimeError(
                    f"the trainer ended ({proc.returncode}) before {saves} saves:\n{''.join(lines)[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {saves} saves in {timeout:.0f}s:\n{''.join(lines)[-3000:]}")
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(60)
    log = "".join(lines)
    if "preempted by SIGTERM" not in log:
        raise RuntimeError(f"the trainer did not stop as preempted:\n{log[-3000:]}")
    return metrics(store, run_uri), log


def figures(prefix: str, records: list[dict], saves: list[Save], skip: int) -> dict[str, object]:
    """Stall and lost-work figures of ``saves[skip:]``; the step time from all the records."""
    step_s = save_blocking(records)["step_s"]  # median gap between steps, the first left out
    counted = saves[skip:]
    if not counted:
        raise RuntimeError(f"{prefix}: no save after the first {skip}: train longer")
    stalls = [s.blocked_s / step_s for s in counted]
    lost = []
    for before, save in itertools.pairwise(saves[max(skip, 1) - 1 :]):
        if save.commit_s is None:
            raise RuntimeError(f"{prefix}: no 'committed in' log line for the save of step {save.step}")
        gap = save.time - before.time
        lost.append(((gap + save.commit_s) / gap, gap, save.commit_s))
    worst = max(lost) if lost else (float("nan"), float("nan"), float("nan"))
    span = records[-1]["time"] - records[1]["time"]  # the first step (warm-up) left out
    out: dict[str, object] = {
        f"{prefix}_step_s": round(step_s, 3),
        f"{prefix}_saves_counted": len(counted),
        f"{prefix}_save_steps": [s.step for s in saves],
        f"{prefix}_blocked_s": [round(s.blocked_s, 2) for s in saves],
        f"{prefix}_waited_s": [round(s.waited_s, 2) for s in saves],
        f"{prefix}_commit_s": [s.commit_s for s in saves],
        f"{prefix}_gaps_s": [round(b.time - a.time, 1) for a, b in itertools.pairwise(saves)],
        f"{prefix}_wall_s_per_step": round(span / max(len(records) - 2, 1), 3),
        f"{prefix}_stall_steps_max": round(max(stalls), 3),
        f"{prefix}_stall_steps_mean": round(statistics.mean(stalls), 3),
        f"{prefix}_stall_s_max": round(max(s.blocked_s for s in counted), 3),
        f"{prefix}_stall_s_mean": round(statistics.mean(s.blocked_s for s in counted), 3),
        f"{prefix}_waited_saves": sum(s.waited_s > 0 for s in counted),
        f"{prefix}_commit_s_max": max(s.commit_s or 0.0 for s in counted),
        f"{prefix}_lost_intervals": [round(x[0], 3) for x in lost],
        f"{prefix}_lost_intervals_max": round(worst[0], 3),
        f"{prefix}_lost_s_max": round(worst[1] + worst[2], 1),
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the tiny preset, in seconds")
    p.add_argument("--preset", default="small")
    p.add_argument("--preemptions-per-hour", type=float, default=12.0, help="auto plans for this rate")
    p.add_argument("--saves", type=int, default=4, help="auto's saves after its two measuring ones")
    p.add_argument("--baseline-every", type=int, default=4)
    p.add_argument("--baseline-saves", type=int, default=3, help="every4's saves after its first")
    a = p.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server: no line per request
    preset = "tiny" if a.smoke else a.preset
    saves = 1 if a.smoke else a.saves
    baseline_saves = 1 if a.smoke else a.baseline_saves
    from trainer.storage import open_storage

    out: dict[str, object] = {
        "assumed_preset": preset,
        "assumed_storage": "s3 (moto server over HTTP, this machine)",
        "assumed_preemptions_per_hour": a.preemptions_per_hour,
        "assumed_mtbf_s": round(3600 / a.preemptions_per_hour, 1),
        "assumed_auto_measuring_saves_left_out": MEASURING_SAVES,
        "assumed_baseline_every_steps": a.baseline_every,
        "assumed_baseline_warmup_saves_left_out": 1,
    }
    with tempfile.TemporaryDirectory() as d, moto_s3() as (root, creds):
        tmp = Path(d)
        data_uri = write_random_dataset(tmp / "data", tokens=200_000)
        store = open_storage(root)
        runs = (
            ("auto", "auto", MEASURING_SAVES, saves),
            (f"every{a.baseline_every}", a.baseline_every, 1, baseline_saves),
        )
        for name, every, skip, counted in runs:
            run_uri = f"{root}/runs/{name}"
            environ = {**env(tmp / f"cache-{name}", threads=2), **creds}
            cfg = config(tmp, run_uri, data_uri, preset, every, a.preemptions_per_hour)
            started = time.monotonic()
            records, log = run_until(cfg, environ, store, run_uri, skip + counted)
            for line in log.splitlines():
                if CHOSEN.search(line) or "had to wait" in line:
                    print(f"{name}: {line.strip()}", file=sys.stderr)
            print(
                f"{name}: trained {len(records)} steps in {time.monotonic() - started:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            saved = saves_of(records, log)
            out.update(figures(name, records, saved, skip))
            if name == "auto":
                chosen = [s.every_steps for s in saved if s.every_steps is not None]
                if not chosen:
                    raise RuntimeError("no auto save's record carries checkpoint_every_steps")
                out["auto_chosen_every_steps"] = chosen
                out["auto_interval_steps"] = chosen[-1]
                out["auto_interval_s"] = round(chosen[-1] * float(out["auto_step_s"]), 1)
                # the reading: the last interval and the longest commit of a counted save
                interval_s, commit_s = float(out["auto_interval_s"]), float(out["auto_commit_s_max"])
                out["auto_lost_intervals_last_interval"] = round((interval_s + commit_s) / interval_s, 3)
    base = f"every{a.baseline_every}"
    out[f"stall_ratio_auto_vs_{base}"] = round(
        float(out["auto_stall_steps_mean"]) / max(float(out[f"{base}_stall_steps_mean"]), 1e-9), 3
    )
    out[f"stall_s_ratio_auto_vs_{base}"] = round(
        float(out["auto_stall_s_mean"]) / max(float(out[f"{base}_stall_s_mean"]), 1e-9), 3
    )
    out["goal_auto_stall_steps_max_le_1"] = float(out["auto_stall_steps_max"]) <= 1
    out["goal_auto_lost_intervals_max_le_2"] = float(out["auto_lost_intervals_max"]) <= 2
    for key, value in out.items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
