"""Checkpoint cost for a ~1 GB training state, to file:// and to an S3 endpoint.

- blocking_steps: the longest the training loop waited for one async checkpoint, in units of
  one training step (the median step of the same run): the copy of the state to CPU memory
  (staging) plus any wait for the previous save still in flight, as the step's metrics record
  it (``checkpoint_blocked_s``). Goal: at most 1. staging_steps is the staging alone (what
  this benchmark reported as blocking_steps before 2026-12-01, leaving the waits out), and
  waited_for_previous_s lists each save's wait: a wait means saves come faster than storage
  takes them. This run saves every 4 steps on purpose, faster than moto takes a checkpoint, so
  the waits show (the trainer warns once, naming ``checkpoint.every_steps``); ``bench/scale.py``'s
  blocking_steps measures the loop at an interval the storage keeps up with.
- emergency_s: SIGTERM to committed emergency checkpoint (``_COMMITTED`` present).
  Goal: at most 10 s to local disk.
- dd_write_mb_s: this disk's sequential write bandwidth (the physical limit), beside them.
- file_read_back_ratio: bytes this process reads (``rchar`` of ``/proc/self/io``) during one
  synchronous save to file:// and the pick of the checkpoint to resume from, over the bytes the
  checkpoint holds (the baseline, from the same run). Goal: 0 (nothing written is read back);
  it was about 3 (a sha256 pass, an md5 pass on upload and an md5 per ``head()``).
  file_save_s is the time of that save, beside it.

The state is the ``small`` preset with the dataset's 257-token vocabulary (about 85M
parameters: fp32 weights plus two AdamW moments, about 1 GB), trained by the real trainer in
one process on CPU. The S3 endpoint is moto's server over HTTP on this machine.

    .venv/bin/python bench/checkpoint.py [--targets file,s3] [--read-back-only]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env, median_interval, write_random_dataset


@contextlib.contextmanager
def moto_s3() -> Iterator[tuple[str, dict[str, str]]]:
    """An S3 endpoint (moto's server over HTTP on this machine) with a bucket ``bench``: yields
    the root URI and the environment a client needs to reach it (also set in this process)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        creds = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_S3": f"http://{host}:{port}",
        }
        os.environ.update(creds)
        boto3.client(
            "s3",
            endpoint_url=creds["AWS_ENDPOINT_URL_S3"],
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket="bench")
        yield "s3://bench/root", creds
    finally:
        server.stop()


def dd_write_mb_s(folder: Path) -> float:
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={folder / 'dd.bin'}", "bs=1M", "count=1024", "conv=fdatasync"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    (folder / "dd.bin").unlink()
    m = re.search(r"([0-9.]+) s, ", out)
    return 1024 / float(m.group(1))


def config(
    folder: Path,
    run_uri: str,
    data_uri: str,
    steps: int,
    every: int,
    *,
    preset: str = "small",
    resume: str = "never",
) -> Path:
    """A bench run's config: ``preset`` one sample a step, fp32, every step logged and flushed,
    checkpointed every ``every`` steps."""
    path = folder / f"config-{abs(hash(run_uri))}.yaml"
    path.write_text(
        json.dumps(
            {
                "run_uri": run_uri,
                "data_uri": data_uri,
                "seed": 1,
                "precision": "fp32",
                "resume": resume,
                "model": {"preset": preset},
                "train": {
                    "max_steps": steps,
                    "micro_batch_size": 1,
                    "grad_accum_steps": 1,
                    "seq_len": 64,
                    "lr": 1e-4,
                    "log_every": 1,
                },
                "checkpoint": {"every_steps": every, "keep": 2},
                "metrics": {"flush_every": 1},
            }
        )
    )
    return path


def trainer(cfg: Path, environ: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--config", str(cfg)],
        env=environ,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def metrics(store, run_uri: str) -> list[dict]:
    """The run's metrics records, by step."""
    from trainer.contract import MetricsReader, metrics_by_step

    by_step = metrics_by_step(MetricsReader(store, run_uri).records())
    return [by_step[step] for step in sorted(by_step)]


def metrics_times(store, run_uri: str) -> list[float]:
    return [r["time"] for r in metrics(store, run_uri)]


def save_blocking(records: list[dict]) -> dict:
    """Each async save's blocking as the metrics record it, the median step time of the same
    run (its first step, warm-up, left out), and the worst save in steps, the wait included."""
    saves = [r for r in records if "checkpoint_blocked_s" in r]
    if not saves:
        raise RuntimeError("no metrics record carries checkpoint_blocked_s: no async save was made")
    blocked = [r["checkpoint_blocked_s"] for r in saves]
    waited = [r["checkpoint_waited_s"] for r in saves]
    step_s = median_interval([r["time"] for r in records], skip=1)
    return {
        "step_s": step_s,
        "blocked_s": blocked,
        "staged_s": [b - w for b, w in zip(blocked, waited, strict=True)],
        "waited_for_previous_s": waited,
        "blocking_steps": max(blocked) / step_s,
        "staging_steps": max(b - w for b, w in zip(blocked, waited, strict=True)) / step_s,
    }


def async_blocking(tmp: Path, store, root: str, data_uri: str, environ: dict) -> dict:
    run_uri = f"{root}/runs/async"
    proc = trainer(config(tmp, run_uri, data_uri, steps=13, every=4), environ)
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(out[-3000:])
    # Every second the loop waited counts, the wait for the previous save included: that wait
    # is the loop stalling just the same (it says checkpoint.every_steps is too small here).
    return {**save_blocking(metrics(store, run_uri)), "warned": "checkpoint.every_steps to at least" in out}


def emergency(tmp: Path, store, root: str, data_uri: str, environ: dict) -> float:
    from trainer.contract import RunLayout
    from trainer.storage import NotFound

    run_uri = f"{root}/runs/emergency"
    layout = RunLayout(run_uri)
    proc = trainer(config(tmp, run_uri, data_uri, steps=1000, every=10**6), environ)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:  # wait until it trains, then preempt
        try:
            if len(metrics_times(store, run_uri)) >= 3:
                break
        except NotFound:
            pass
        time.sleep(0.2)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    while time.monotonic() < deadline:
        committed = [u for u in store.list(layout.checkpoints) if u.endswith("/_COMMITTED")]
        if committed:
            elapsed = time.monotonic() - sent
            break
        time.sleep(0.05)
    else:
        raise RuntimeError("no emergency checkpoint was committed")
    proc.communicate(timeout=600)
    return elapsed


def _rchar() -> int:
    """Bytes this process has read through read(2) and its kin so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no rchar line: this figure needs Linux")


def read_back(tmp: Path, saves: int = 2) -> dict:
    """Bytes read per synchronous save (and pick) of the training state, in this process."""
    os.environ["TRAINOPS_CACHE_DIR"] = str(tmp / "cache-read-back")
    import torch

    from trainer import parallel
    from trainer.checkpoint.files import find_latest
    from trainer.checkpoint.save import Checkpointer
    from trainer.contract import RunLayout
    from trainer.models.llama import Transformer
    from trainer.optim import build_optimizer
    from trainer.presets import PRESETS
    from trainer.state import ModelState, OptimizerState, TrainState
    from trainer.storage import open_storage

    parallel.init_distributed()
    try:
        torch.manual_seed(0)
        model = Transformer(PRESETS["small"].with_vocab(257))
        optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.1)
        tokens = torch.randint(0, 257, (1, 17))
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()  # the AdamW moments exist from here on
        run_uri = f"file://{tmp / 'storage'}/runs/read-back"
        storage, layout = open_storage(run_uri), RunLayout(run_uri)
        states = {
            "model": ModelState(model),
            "optim": OptimizerState(model, optimizer),
            "train_state": TrainState(torch.device("cpu")),
        }
        ckpt = Checkpointer(storage, run_uri, rank=0, world_size=1, keep=2, states=states)
        ckpt.save(1)  # warm-up: its lazy imports read files too
        read, seconds, size = [], [], 0
        for step in range(2, 2 + saves):
            before, started = _rchar(), time.monotonic()
            ckpt.save(step)
            seconds.append(time.monotonic() - started)
            found = find_latest(storage, layout)
            read.append(_rchar() - before)
            assert found is not None and found[0] == step
            size = sum(entry["size"] for entry in found[1]["files"])
    finally:
        parallel.shutdown()
    return {
        "checkpoint_bytes": size,
        "read_bytes_per_save": statistics.median(read),
        "read_back_ratio": statistics.median(read) / size,
        "save_s": statistics.median(seconds),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="file,s3")
    p.add_argument("--read-back-only", action="store_true", help="measure file_read_back_ratio alone")
    a = p.parse_args()
    from trainer.storage import open_storage

    results: dict = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if "file" in a.targets.split(","):
            results["file_read_back"] = read_back(tmp)
            r = results["file_read_back"]
            print(f"file_read_back_ratio={r['read_back_ratio']:.3f}")
            print(f"file_read_back_bytes_per_save={r['read_bytes_per_save']}")
            print(f"file_checkpoint_bytes={r['checkpoint_bytes']}")
            print(f"file_save_s={r['save_s']:.2f}", flush=True)
        if a.read_back_only:
            return
        data_uri = write_random_dataset(tmp / "data", tokens=200_000)
        results["dd_write_mb_s"] = dd_write_mb_s(tmp)
        for target in a.targets.split(","):
            environ = env(tmp / f"cache-{target}", threads=2)
            with moto_s3() if target == "s3" else contextlib.nullcontext(None) as s3:
                root = s3[0] if s3 else f"file://{tmp / 'storage'}"
                environ.update(s3[1] if s3 else {})
                store = open_storage(root)
                blocking = async_blocking(tmp, store, root, data_uri, environ)
                results[target] = {**blocking, "emergency_s": emergency(tmp, store, root, data_uri, environ)}
            r = results[target]
            print(
                f"{target}: step {r['step_s']:.2f}s, async saves blocked the loop {r['blocked_s']} s "
                f"(staging {r['staged_s']}, waits for the previous save {r['waited_for_previous_s']}), "
                f"emergency {r['emergency_s']:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    print(json.dumps(results, indent=2))
    print(f"dd_write_mb_s={results['dd_write_mb_s']:.0f}")
    for target in a.targets.split(","):
        print(f"{target}_blocking_steps={results[target]['blocking_steps']:.3f}")
        print(f"{target}_staging_steps={results[target]['staging_steps']:.3f}")
        print(f"{target}_emergency_s={results[target]['emergency_s']:.2f}")


if __name__ == "__main__":
    main()
