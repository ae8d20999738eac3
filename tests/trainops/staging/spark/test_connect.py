"""Staging through a Spark Connect server (``spark_remote``), the production path the Spark
engine implements: the same version and the same bytes as the in-worker engine."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _free_port
from tests.trainops.staging.spark.test_stage import _files, _worker_stage
from trainops.staging.demo_data import write_demo_dataset

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]


def test_staging_through_a_spark_connect_server_gives_the_worker_engines_bytes(tmp_path):
    pytest.importorskip("pyspark")
    pytest.importorskip("grpc_status", reason="Spark Connect's client needs grpcio-status (the spark extra)")
    raw = f"file://{tmp_path}/raw"
    write_demo_dataset(raw, rows=1200, files=2)
    options = {"shard_tokens": 8192, "slice_columns": ["source", "created_at"]}
    worker = _worker_stage(f"file://{tmp_path}/w", raw, **options)

    paths = [str(REPO), str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(HERE / "connect_server.py"), str(port)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert server.stdout is not None
        started, _, _ = select.select([server.stdout], [], [], 300)  # never wait forever
        assert started and server.stdout.readline().strip() == "ready", (
            "the Spark Connect server did not start"
        )
        proc = subprocess.run(
            [
                sys.executable,
                str(HERE / "connect_client.py"),
                f"sc://127.0.0.1:{port}",
                f"file://{tmp_path}/c",
                raw,
                json.dumps(options),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    finally:
        server.communicate(input="", timeout=120)  # closing its stdin stops the server
    assert proc.returncode == 0, proc.stderr[-4000:]
    connected = json.loads(proc.stdout.strip().splitlines()[-1])

    assert connected["version"] == worker["version"]
    assert (connected["rows"], connected["train_tokens"]) == (1200, worker["train_tokens"])
    connect_files, worker_files = _files(connected["uri"]), _files(worker["uri"])
    assert sorted(connect_files) == sorted(worker_files)
    for name, data in worker_files.items():
        assert connect_files[name] == data, f"{name} differs"
