"""How fast does staging go, and does its memory stay flat as the data grows?

Generates N text rows (default 1,000,000) as Parquet files, then stages them end to end
(read, validate every row with GX and the dataset-level checks, tokenize, write shards,
commit) with the default suite, on file:// storage. Then the same at 2N. Each run is a
child process, so its peak RSS is its own (``os.wait4``). As the baseline, a child reads
the same files in the same batches and only runs the GX row expectations on them: the
difference is what the rest of staging costs (uniqueness spill, tokenizing, writing).

Goals: peak RSS <= 1024 MB at both sizes and not growing with N; time growing
at most linearly.

With ``--engine spark`` the same data is also staged by the Spark engine in local mode
(``local[*]``), in a child of its own, and its line is printed next to the worker engine's
from the same run: rows/s, the driver's peak RSS (the Python process that drives Spark:
what an Airflow worker holds) and the local JVM's peak RSS (``VmHWM``; in local mode the
JVM is the executors too, so it is the cluster's memory, not the driver's). The Spark run
must give the same version and token count as the worker's.

    .venv/bin/python bench/staging.py [--rows 1000000] [--engine worker|spark] [--json F]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, env

ROWS_PER_FILE = 250_000
ROW_GROUP = 128 * 1024


# ----------------------------------------------------------------------------- children


def generate(folder: Path, rows: int, seed: int) -> None:
    """``rows`` unique-id rows of 1 to 6 demo sentences each (~200 bytes), in several files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainops.staging.demo_data import demo_rows

    pool = demo_rows(4096, seed=seed)
    sentences = np.array(pool["text"], dtype=object)
    sources = np.array(pool["source"], dtype=object)
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, rows, ROWS_PER_FILE):
        n = min(ROWS_PER_FILE, rows - start)
        picks = rng.integers(0, len(sentences), size=(n, 6))
        counts = rng.integers(1, 7, size=n)
        texts = [" ".join(sentences[p[:c]]) for p, c in zip(picks, counts, strict=False)]
        table = pa.table(
            {
                "id": [f"doc-{i:010d}" for i in range(start, start + n)],
                "text": texts,
                "source": sources[picks[:, 0]].tolist(),
            }
        )
        pq.write_table(table, folder / f"part-{start // ROWS_PER_FILE:05d}.parquet", row_group_size=ROW_GROUP)


def stage(data: Path, root: Path) -> dict:
    importlib.import_module("great_expectations")  # before the clock, as in a warm worker

    from trainer.storage import open_storage
    from trainops.staging.stage import stage_dataset

    uri = f"file://{root}"
    started = time.perf_counter()
    result = stage_dataset(open_storage(uri), uri, f"file://{data}", "bench", scratch_dir=str(root.parent))
    return {
        "seconds": time.perf_counter() - started,
        "rows": result["rows"],
        "tokens": result["train_tokens"] + result["eval_tokens"],
    }


def stage_spark(data: Path, root: Path) -> dict:
    """The Spark engine in local mode; the session is started before the clock (a warm pool)."""
    importlib.import_module("great_expectations")

    from trainer.storage import open_storage
    from trainops.staging.spark.session import get_session, session_settings
    from trainops.staging.spark.stage import stage_dataset_spark

    spark = get_session(session_settings(conf={"spark.driver.memory": "2g"}, env={}))
    spark.sparkContext.setLogLevel("ERROR")
    uri = f"file://{root}"
    started = time.perf_counter()
    result = stage_dataset_spark(
        open_storage(uri), uri, f"file://{data}", "bench", spark=spark, scratch_dir=str(root.parent)
    )
    seconds = time.perf_counter() - started
    jvm = spark.sparkContext._gateway.proc.pid  # the local JVM py4j started
    with open(f"/proc/{jvm}/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    spark.stop()
    return {
        "seconds": seconds,
        "rows": result["rows"],
        "tokens": result["train_tokens"] + result["eval_tokens"],
        "version": result["version"],
        "jvm_peak_rss_mb": hwm / 1024,
    }


def gx_only(data: Path) -> dict:
    """The same batches through the same GX suite (the row expectations), nothing else."""
    importlib.import_module("great_expectations")

    from trainer.storage import open_storage
    from trainops.staging.expectations import ROW_EXPECTATIONS, normalize_expectations
    from trainops.staging.gx_batch import GXBatchValidator
    from trainops.staging.reader import iter_file_batches, list_source_objects

    started = time.perf_counter()
    suite = [e for e in normalize_expectations(None) if e["type"] in ROW_EXPECTATIONS]
    validator = GXBatchValidator(suite)
    uri = f"file://{data}"
    rows = 0
    gx_seconds = 0.0
    for obj in list_source_objects(open_storage(uri), uri):
        for batch in iter_file_batches(obj.uri[len("file://") :], obj):
            t = time.perf_counter()
            results = validator.validate(batch, rows, "id")
            gx_seconds += time.perf_counter() - t
            assert all(r["success"] for r in results), results
            rows += batch.num_rows
    return {"seconds": time.perf_counter() - started, "rows": rows, "gx_seconds": gx_seconds}


# ----------------------------------------------------------------------------- parent


def run_child(args: list[str], environ: dict, tmp: Path) -> tuple[dict, float]:
    """Run this script as a child; return its JSON answer and its own peak RSS in MB."""
    out_path, err_path = tmp / "child.out", tmp / "child.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, *args], env=environ, cwd=REPO, stdout=out, stderr=err
        )
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not the sum
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed ({proc.returncode}):\n{err_path.read_text()[-3000:]}")
    return json.loads(out_path.read_text().strip().splitlines()[-1]), usage.ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument(
        "--engine",
        choices=["worker", "spark"],
        default="worker",
        help="spark: also stage on Spark (local mode) and print it beside the worker engine",
    )
    p.add_argument("--child", choices=["generate", "stage", "stage-spark", "gx"], help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child == "generate":
        generate(Path(a.data), a.rows, seed=0)
        print(json.dumps({"rows": a.rows}))
        return
    if a.child == "stage":
        print(json.dumps(stage(Path(a.data), Path(a.root))))
        return
    if a.child == "stage-spark":
        print(json.dumps(stage_spark(Path(a.data), Path(a.root))))
        return
    if a.child == "gx":
        print(json.dumps(gx_only(Path(a.data))))
        return

    figures = {
        "date": datetime.date.today().isoformat(),
        "device": f"cpu, {os.cpu_count()} cores",
        "command": " ".join([".venv/bin/python bench/staging.py", *sys.argv[1:]]),
        "data": "Parquet, ~170 bytes of English text a row, 250k rows a file, "
        "128k-row row groups; file:// storage, default suite",
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(prefix="trainops-bench-") as d:
        tmp = Path(d)
        environ = env(tmp / "cache", threads=2)
        for rows in (a.rows, 2 * a.rows):
            data, root = tmp / f"data-{rows}", tmp / f"root-{rows}"
            run_child(["--child", "generate", "--rows", str(rows), "--data", str(data)], environ, tmp)
            size_mb = sum(f.stat().st_size for f in data.iterdir()) / 2**20
            staged, rss = run_child(
                ["--child", "stage", "--data", str(data), "--root", str(root)], environ, tmp
            )
            if a.engine == "spark":
                # The worker engine's line is the baseline here; the GX-only one is skipped.
                on_spark, spark_rss = run_child(
                    ["--child", "stage-spark", "--data", str(data), "--root", str(tmp / f"spark-{rows}")],
                    environ,
                    tmp,
                )
                assert on_spark["rows"] == staged["rows"] == rows, (on_spark, staged)
                assert on_spark["tokens"] == staged["tokens"], (on_spark, staged)
                line = {
                    "rows": rows,
                    "parquet_mb": round(size_mb, 1),
                    "tokens": staged["tokens"],
                    "worker_seconds": round(staged["seconds"], 2),
                    "worker_rows_per_s": round(rows / staged["seconds"]),
                    "worker_peak_rss_mb": round(rss),
                    "spark_seconds": round(on_spark["seconds"], 2),
                    "spark_rows_per_s": round(rows / on_spark["seconds"]),
                    "spark_driver_peak_rss_mb": round(spark_rss),
                    "spark_jvm_peak_rss_mb": round(on_spark["jvm_peak_rss_mb"]),
                }
                figures["sizes"].append(line)
                print(" ".join(f"{k}={v}" for k, v in line.items()), flush=True)
                subprocess.run(["rm", "-rf", str(data), str(root), str(tmp / f"spark-{rows}")], check=True)
                continue
            base, base_rss = run_child(["--child", "gx", "--data", str(data)], environ, tmp)
            assert staged["rows"] == base["rows"] == rows, (staged, base)
            line = {
                "rows": rows,
                "parquet_mb": round(size_mb, 1),
                "tokens": staged["tokens"],
                "seconds": round(staged["seconds"], 2),
                "rows_per_s": round(rows / staged["seconds"]),
                "peak_rss_mb": round(rss),
                "gx_seconds": round(base["seconds"], 2),
                "gx_rows_per_s": round(rows / base["seconds"]),
                "gx_validate_only_s": round(base["gx_seconds"], 2),
                "gx_peak_rss_mb": round(base_rss),
                "overhead_ratio": round(staged["seconds"] / base["seconds"], 2),
            }
            figures["sizes"].append(line)
            print(" ".join(f"{k}={v}" for k, v in line.items()), flush=True)
            for folder in (data, root):
                subprocess.run(["rm", "-rf", str(folder)], check=True)
    small, large = figures["sizes"]
    if a.engine == "spark":
        for key in ("worker_seconds", "worker_peak_rss_mb", "spark_seconds", "spark_driver_peak_rss_mb"):
            figures[f"{key}_ratio_2n_over_n"] = round(large[key] / small[key], 2)
        print(" ".join(f"{k}={v}" for k, v in figures.items() if k.endswith("_ratio_2n_over_n")))
        if a.json:
            Path(a.json).write_text(json.dumps(figures, indent=2) + "\n")
        return
    figures["time_ratio_2n_over_n"] = round(large["seconds"] / small["seconds"], 2)
    figures["rss_ratio_2n_over_n"] = round(large["peak_rss_mb"] / small["peak_rss_mb"], 2)
    print(
        f"time_ratio_2n_over_n={figures['time_ratio_2n_over_n']} "
        f"rss_ratio_2n_over_n={figures['rss_ratio_2n_over_n']} "
        f"(goals: time ratio <= ~2.0, peak_rss_mb <= 1024 at both sizes)"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
