"""StageDatasetOperator staging a large source as one CPU job on the cluster backend.

The job runs for real on the local backend (``python -m trainops.staging.job`` in its own
process), the trigger runs in this process, and the result is compared with staging the same
source in the worker.
"""

import asyncio
import os

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from trainer.storage import open_storage
from trainops.operators.stage import StageDatasetOperator
from trainops.staging.demo_data import write_demo_dataset

pytestmark = pytest.mark.slow


class TI:
    dag_id, run_id, task_id, map_index, try_number = "retrain", "manual__1", "stage", -1, 1

    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def first_event(trigger):
    async def take():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(take(), timeout=120))


@pytest.fixture
def local_state(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    return tmp_path / "local"


def op(source, root, **kw):
    return StageDatasetOperator(
        task_id="stage",
        source_uri=source,
        dataset_name="demo",
        storage_root=root,
        aws_conn_id=None,
        shard_tokens=4096,
        **kw,
    )


def test_a_source_over_the_threshold_stages_in_a_job_with_the_same_version(tmp_path, local_state):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=300, seed=4)
    ti = TI()
    with pytest.raises(TaskDeferred) as deferred:
        op(raw["uri"], f"file://{tmp_path}/job-root", job_threshold_bytes=0).execute({"ti": ti})
    assert deferred.value.trigger.handle["job_id"].startswith("stage-")
    event = first_event(deferred.value.trigger)
    assert event["state"]["phase"] == "succeeded"
    result = op(raw["uri"], f"file://{tmp_path}/job-root", job_threshold_bytes=0).execute_complete(
        {"ti": ti}, event
    )
    in_worker = op(raw["uri"], f"file://{tmp_path}/worker-root").execute({"ti": TI()})
    assert (result["version"], result["rows"], result["train_tokens"]) == (
        in_worker["version"],
        300,
        in_worker["train_tokens"],
    )
    assert ti.pushed == {"trainops_validation_report": result["validation_uri"]}
    assert (
        open_storage(result["manifest_uri"]).get_json(result["manifest_uri"])["version"] == result["version"]
    )


def test_bad_data_in_a_job_fails_without_retry_and_points_at_the_report(tmp_path, local_state):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=300, seed=4, corrupt=True)
    root = f"file://{tmp_path}/root"
    ti = TI()
    stage = op(raw["uri"], root, job_threshold_bytes=0, deferrable=False, poll_interval=0.2)
    with pytest.raises(AirflowFailException, match="expect_column_values_to_be_unique") as failure:
        stage.execute({"ti": ti})  # not deferrable: the trigger runs in this worker
    assert "nothing was staged" in str(failure.value)
    report = ti.pushed["trainops_validation_report"]
    assert report.endswith("/validation.json") and open_storage(root).head(report) is not None
    assert not [u for u in open_storage(root).list(f"{root}/datasets") if u.endswith("manifest.json")]


def test_a_small_source_stays_in_the_worker(tmp_path, local_state):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=100, seed=4)
    result = op(raw["uri"], f"file://{tmp_path}/root").execute({"ti": TI()})  # default: 1 GiB
    assert result["rows"] == 100 and not os.path.exists(local_state / "jobs")


def test_a_bad_threshold_fails_when_the_dag_is_parsed():
    with pytest.raises(ValueError, match="job_threshold_bytes must be None or an integer >= 0, got -1"):
        op("file:///x", "file:///root", job_threshold_bytes=-1)
