"""How much parsing each DAG file costs the DAG processor, against a baseline DAG file.

The DAG processor re-parses every file in a process that has already imported Airflow, so the
figure is what a file adds on top of ``import airflow.sdk``. One fresh interpreter imports
``airflow.sdk`` and forks a child per parse (as the processor's parsing processes start from
that state); bytecode is cached first (compiling is not parsing). The baseline is a DAG file
with one ``EmptyOperator``, parsed in the same run, so the ratios hold on a loaded machine.

    .venv/bin/python bench/parse_time.py [--rounds 15]

prints ``baseline_s=``, and per DAG file ``<dag>_s=`` (the best of the rounds) and
``<dag>_ratio=`` (over the baseline), then ``worst_ratio=``. Airflow's own default
``dag_file_processor_timeout`` is 50 s; the figures here are tenths of a second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BASELINE_DAG = """
import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG(dag_id="baseline", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
    EmptyOperator(task_id="noop")
"""

PROBE = r"""
import importlib.util, json, os, sys, time
import airflow.sdk


def parse_once(path):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        t = time.perf_counter()
        spec = importlib.util.spec_from_file_location("dagfile", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        os.write(write, json.dumps(time.perf_counter() - t).encode())
        os._exit(0)
    os.close(write)
    data = os.read(read, 1024)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


rounds = int(sys.argv[1])
print(json.dumps({path: min(parse_once(path) for _ in range(rounds)) for path in sys.argv[2:]}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="parses per file; the best counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline.py"
        baseline.write_text(BASELINE_DAG)
        files = [baseline, *sorted((REPO / "dags").glob("*.py"))]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        for _ in ("fill the bytecode cache", "measure"):
            out = subprocess.run(
                [sys.executable, "-c", PROBE, str(args.rounds), *map(str, files)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
    best = json.loads(out.stdout.strip().splitlines()[-1])
    base = best[str(baseline)]
    print(f"baseline_s={base:.4f}")
    ratios = []
    for path in files[1:]:
        seconds = best[str(path)]
        ratios.append(seconds / base)
        print(f"{path.stem}_s={seconds:.4f}")
        print(f"{path.stem}_ratio={seconds / base:.2f}")
    print(f"worst_ratio={max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
