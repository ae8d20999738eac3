"""DAG files parse fast and keep heavy libraries out of the scheduler's processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "great_expectations", "kubernetes", "boto3", "pyarrow", "pandas")

PROBE = f"""
import importlib.util, json, sys, time
import airflow.sdk
t = time.perf_counter()
spec = importlib.util.spec_from_file_location("dagfile", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
print(json.dumps({{"seconds": time.perf_counter() - t,
                  "heavy": [m for m in {HEAVY!r} if m in sys.modules],
                  "dag_id": mod.dag.dag_id, "tasks": sorted(mod.dag.task_ids)}}))
"""


def test_demo_dag_imports_no_heavy_library():
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "dags" / "trainops_demo.py")],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert result["dag_id"] == "trainops_demo"
    assert result["tasks"] == ["demo_data", "evaluate", "gate", "promote", "stage", "train"]


def test_dagbag_has_no_import_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    for dag in bag.dags.values():
        assert dag.owner == "trainops" and dag.tags and dag.doc_md, dag.dag_id
    assert "trainops_demo" in bag.dags
