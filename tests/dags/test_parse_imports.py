"""Every DAG file parses without loading a heavy library into the DAG processor.

The DAG processor parses every file again and again, in a process that has already imported
Airflow: torch, great_expectations, kubernetes, boto3, pandas, pyarrow and pyspark must stay out of it
(each is seconds, or hundreds of MB). One fresh interpreter imports ``airflow.sdk`` and forks a
child per DAG file, as the processor's parsing processes do, and reports what the file added.

How long a parse takes is a benchmark, not a test: ``bench/parse_time.py`` prints each file's
cost as a ratio to a one-task DAG parsed in the same run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((REPO / "dags").glob("*.py"))
HEAVY = (
    "torch",
    "great_expectations",
    "kubernetes",
    "boto3",
    "botocore",
    "pandas",
    "pyarrow",
    "numpy",
    "pyspark",
    "py4j",
)

PROBE = rf"""
import importlib.util, json, os, sys

HEAVY = {HEAVY!r}
import airflow.sdk


def parse(path):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: parse the file from the parent's state, report, vanish
        os.close(read)
        before = set(sys.modules)
        try:
            spec = importlib.util.spec_from_file_location("dagfile", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            added = set(sys.modules) - before
            out = {{"heavy": sorted(m for m in added if m.split(".")[0] in HEAVY),
                   "trainer": sorted(m for m in added if m.split(".")[0] == "trainer"),
                   "dag_ids": sorted(v.dag_id for v in vars(module).values()
                                     if type(v).__name__ == "DAG")}}
        except BaseException as exc:
            out = {{"error": repr(exc)}}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'{{"error": "the child died"}}')


print(json.dumps({{path: parse(path) for path in sys.argv[1:]}}))
"""


@pytest.fixture(scope="module")
def parse_report():
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, DAG_FILES)],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_dags_folder_holds_the_example_dags():
    names = {p.stem for p in DAG_FILES}
    assert {"retrain_scheduled", "retrain_manual", "data_team_publish", "retrain_on_new_data"} <= names


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.stem for p in DAG_FILES])
def test_dag_file_parses_without_heavy_imports(parse_report, path):
    from trainer.contract import SHARED_MODULES

    report = parse_report[str(path)]
    assert "error" not in report, report
    assert report["heavy"] == [], f"{path.name} imports {report['heavy']} when it is parsed"
    shared = [m for m in report["trainer"] if m != "trainer" and not m.startswith(SHARED_MODULES)]
    assert shared == [], f"{path.name} loads trainer modules {shared} when it is parsed"
    assert report["dag_ids"] == [path.stem]
