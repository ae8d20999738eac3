"""Data that fails its expectations stops the DAG at staging: no training, storage untouched;
and ``python -m trainops demo --corrupt-data`` says which expectations failed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.demo_run import REPO, demo_env
from trainer.storage import open_storage
from trainops.cli.main import DEMO_DAG, load_dag
from trainops.operators import StageDatasetOperator
from trainops.staging.demo_data import write_demo_dataset

pytestmark = pytest.mark.slow


def test_bad_data_fails_staging_and_launches_nothing(tmp_path, monkeypatch, airflow_db):
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    store = open_storage(root)
    # A dataset staged earlier from good data must survive a bad delivery untouched.
    good = write_demo_dataset(f"{root}/raw/good", rows=300, seed=1)
    StageDatasetOperator(
        task_id="seed", source_uri=good["uri"], dataset_name="demo-text", aws_conn_id=None
    ).execute(context={})
    datasets_before = {uri: store.head(uri)["etag"] for uri in store.list(f"{root}/datasets")}

    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DEMO_DAG)
    dagrun = dag.test(run_conf={"corrupt_data": True})

    states = {ti.task_id: str(ti.state) for ti in dagrun.get_task_instances()}
    assert str(dagrun.state).endswith("failed")
    assert states["stage"].endswith("failed")
    assert all(states[t].endswith("upstream_failed") for t in ("train", "evaluate", "gate", "promote"))
    assert store.list(f"{root}/runs") == []
    assert not os.path.exists(tmp_path / "local" / "jobs")
    after = {uri: store.head(uri)["etag"] for uri in store.list(f"{root}/datasets")}
    assert {u: e for u, e in after.items() if u in datasets_before} == datasets_before
    new = sorted(set(after) - set(datasets_before))  # only the failed validation's report,
    assert len(new) == 1 and new[0].endswith("/validation.json")  # no manifest: no version
    assert not [u for u in after if u.startswith(new[0].rsplit("/", 1)[0]) and u.endswith("manifest.json")]


def test_the_corrupt_data_demo_names_the_failed_expectations_in_its_summary(tmp_path, airflow_db):
    done = subprocess.run(
        [sys.executable, "-m", "trainops", "demo", "--corrupt-data", "--project-dir", str(REPO)],
        cwd=REPO,
        env=demo_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    out = done.stdout
    lines = out.splitlines()
    assert done.returncode == 1 and "Traceback" not in out, out
    summary = lines[lines.index("trainops demo summary") :]
    # each failed expectation on a line: its column, the expectation, the count and a sample
    assert "dataset          REJECTED by staging; nothing was trained or written" in summary, out
    assert (
        "staging rejected the data: text: expect_column_value_lengths_to_be_between failed for 3 rows (e.g. '')"
        in summary
    ), out
    assert (
        "staging rejected the data: id: expect_column_values_to_not_be_null failed for 2 rows (e.g. row 3)"
        in summary
    )
    unique = [
        line for line in summary if "id: expect_column_values_to_be_unique failed for 4 rows (e.g. '" in line
    ]
    assert len(unique) == 1, out
    # and where to look next: the validation report's page, the commands
    (report,) = [line for line in summary if line.startswith("  validation     ")]
    assert report.split()[-1].startswith("http://localhost:8080/trainops/report?uri=file%3A%2F%2F")
    assert report.endswith("%2Fvalidation.json")
    assert lines[-2].startswith("  python -m trainops models demo-lm ")
    assert lines[-1].startswith("DAG run manual__") and ": failed in " in lines[-1]
    # the full log holds Airflow's output, without great-expectations' import-time noise
    log = Path(lines[0].split()[2]).read_text()
    assert "[DAG TEST]" in log and "expect_column_value_lengths_to_be_between" in log
    assert "Skipping registering function" not in log
