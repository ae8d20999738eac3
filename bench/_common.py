"""Shared by the benchmark scripts: a synthetic staged dataset and launching under torchrun."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_random_dataset(folder: Path, tokens: int = 2_000_000, vocab: int = 257, seed: int = 0) -> str:
    """A staged-dataset layout (manifest + one uint16 shard per split) of random tokens.

    Benchmarks time steps, not learning, so the tokens need not mean anything.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, n in (("train", tokens), ("eval", tokens // 20)):
        (folder / split).mkdir(exist_ok=True)
        path = folder / split / "00000.bin"
        rng.integers(0, vocab, n, dtype=np.uint16).tofile(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        splits[split] = {
            "tokens": n,
            "shards": [{"path": f"{split}/00000.bin", "tokens": n, "sha256": digest}],
        }
    (folder / "eval" / "index.jsonl").write_text("")
    manifest = {
        "format": "trainops.dataset/v1",
        "name": "bench",
        "version": "random",
        "tokenizer": {"kind": "byte", "vocab_size": vocab, "eos_id": vocab - 1},
        "token_dtype": "uint16",
        "splits": splits,
        "eval_index": {"path": "eval/index.jsonl", "records": 0, "slice_columns": []},
        "rows": {"total": 0, "train": 0, "eval": 0},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return f"file://{folder}"


def env(cache: Path, threads: int = 1) -> dict:
    """One intra-op thread per process: 2 processes on 2 cores must not oversubscribe."""
    paths = [str(REPO), str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "OMP_NUM_THREADS": str(threads),
        "TRAINOPS_CACHE_DIR": str(cache),
        "TRAINOPS_ATTEMPT": "1",
    }


def torchrun(args: list[str], nproc: int, environ: dict, timeout: float = 900) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    proc = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )


def median_interval(times: list[float], skip: int) -> float:
    """Median time between consecutive steps, after ``skip`` warm-up steps."""
    gaps = [b - a for a, b in zip(times[skip:], times[skip + 1 :], strict=False)]
    if not gaps:
        raise ValueError(f"need more than {skip + 1} steps to time, got {len(times)}")
    return statistics.median(gaps)
