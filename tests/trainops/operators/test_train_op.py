"""FSDPTrainingOperator's decisions, with a fake cluster at the backend boundary.

The fake returns job states shaped like the local backend's status.json; the attempt records
are real ones (trainer.contract.attempt_record) in real file:// storage.
"""

from types import SimpleNamespace

import pendulum
import pytest
from airflow.sdk.exceptions import TaskDeferred

import trainops.cluster
from trainer.contract import RunLayout, attempt_record, run_prefix
from trainer.storage import open_storage
from trainops.operators import FSDPTrainingOperator

DATA_URI = "file:///data/datasets/demo/abc"


class FakeCluster:
    def __init__(self):
        self.launched, self.deleted, self.live = [], [], []

    def launch(self, spec, chaos=None):
        self.launched.append((spec, chaos))
        return {"cluster": "local", "job_id": f"{spec.name}-x", "job_dir": "/nowhere", "labels": spec.labels}

    def find(self, labels):
        return self.live

    def delete(self, handle):
        self.deleted.append(handle["job_id"])

    def all_gone(self, handle):
        return handle["job_id"] in self.deleted  # gone once deleted, as pods are

    def logs_tail(self, handle, lines=30):
        return "[node-0] RuntimeError: CUDA out of memory"


@pytest.fixture
def cluster(monkeypatch):
    fake = FakeCluster()
    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: fake)
    return fake


@pytest.fixture
def context():
    return {"ti": SimpleNamespace(dag_id="retrain", run_id="manual__2026-01-01T00:00:00+00:00",
                                  task_id="train", map_index=-1)}


def operator(root, **kw):
    return FSDPTrainingOperator(task_id="train", dataset={"uri": DATA_URI}, storage_root=root,
                                nodes=2, trainer_config={"train.max_steps": 100}, **kw)


def layout_of(root):
    return RunLayout(run_prefix(root, "retrain", "manual__2026-01-01T00:00:00+00:00", "train"))


def finished(state_phase="failed", disruptions=()):
    return {"status": "finished", "handle": {"cluster": "local", "job_id": "j", "job_dir": "/nowhere"},
            "state": {"phase": state_phase, "reason": None, "disruptions": list(disruptions),
                      "nodes": [{"index": 0, "exit_code": 1}, {"index": 1, "exit_code": 1}]}}


def write_record(root, n, outcome, **kw):
    rec = attempt_record(attempt=n, outcome=outcome, world_size=2,
                         **{"last_step": 50, "checkpoint_step": 50, **kw})
    open_storage(root).put_json(layout_of(root).attempt(n), rec)


def test_bad_config_fails_before_anything_is_launched_or_written(file_root, cluster, context):
    op = FSDPTrainingOperator(task_id="train", dataset={"uri": DATA_URI}, storage_root=file_root,
                              trainer_config={"train": {"lrr": 0.1}})
    with pytest.raises(Exception, match=r"train\.lrr"):
        op.execute(context)
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []


def test_global_batch_the_ranks_cannot_split_fails_before_launch(file_root, cluster, context):
    op = FSDPTrainingOperator(task_id="train", dataset={"uri": DATA_URI}, storage_root=file_root, nodes=2,
                              trainer_config={"train": {"micro_batch_size": 4, "global_batch_size": 12}})
    with pytest.raises(Exception, match=r"train.global_batch_size=12 is not a multiple of .* world size 2"):
        op.execute(context)
    assert cluster.launched == []


def test_execute_writes_config_launches_attempt_one_and_defers(file_root, cluster, context):
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    layout = layout_of(file_root)
    spec, chaos = cluster.launched[0]
    assert spec.args == ["python", "-m", "trainer", "train", "--config", layout.config]
    assert spec.env["TRAINOPS_ATTEMPT"] == "1" and spec.nodes == 2 and chaos is None
    assert spec.labels["trainops/run"] == "manual__2026-01-01T00_00_00_00_00"
    config = open_storage(file_root).get(layout.config).decode()
    assert f"data_uri: {DATA_URI}" in config and "max_steps: 100" in config
    assert deferred.value.trigger.handle["job_id"] == spec.name + "-x"
    job = open_storage(file_root).get_json(layout.job)
    assert [a["attempt"] for a in job["attempts"]] == [1]


def test_rerun_reattaches_to_the_live_job(file_root, cluster, context):
    cluster.live = [{"cluster": "local", "job_id": "train-live-a1", "job_dir": "/nowhere", "labels": {}}]
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    assert cluster.launched == []
    assert deferred.value.trigger.handle["job_id"] == "train-live-a1"


def test_preempted_attempt_is_relaunched_and_recorded(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "preempted", signal="SIGTERM")
    spot = {"node": 1, "reason": "SpotInterruption", "message": "spot interruption notice"}
    with pytest.raises(TaskDeferred):
        op.execute_complete(context, finished(disruptions=[spot]))
    assert [s.env["TRAINOPS_ATTEMPT"] for s, _ in cluster.launched] == ["1", "2"]
    assert cluster.deleted == ["j"]  # the old gang was deleted (and gone) before the relaunch
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert job["preemptions"] == 1
    assert job["attempts"][0]["classification"] == "preempted"
    assert "spot interruption notice" in job["attempts"][0]["reason"]

    write_record(file_root, 2, "completed", last_step=100, checkpoint_step=100, resumed_from_step=50)
    result = op.execute_complete(context, finished(state_phase="succeeded"))
    assert (result["steps"], result["attempts"], result["preemptions"], result["steps_lost"]) == (100, 2, 1, 0)


def test_trainer_failure_fails_with_hint_and_log_tail(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "failed", error="OutOfMemoryError: CUDA out of memory",
                 hint="reduce train.micro_batch_size or enable activation checkpointing")
    with pytest.raises(RuntimeError) as failure:
        op.execute_complete(context, finished())
    message = str(failure.value)
    assert "reduce train.micro_batch_size" in message and "[node-0] RuntimeError" in message
    assert len(cluster.launched) == 1  # an error is not relaunched
    assert open_storage(file_root).get_json(layout_of(file_root).job)["status"] == "failed"


def test_preemption_budget_is_enforced(file_root, cluster, context):
    op = operator(file_root, max_preemptions=0)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "preempted", signal="SIGTERM")
    with pytest.raises(RuntimeError, match="over the budget of 0"):
        op.execute_complete(context, finished())


def test_timeout_event_deletes_the_job(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    event = {**finished(), "status": "timeout", "message": "job j still running after 60s"}
    with pytest.raises(RuntimeError, match="still running after 60s"):
        op.execute_complete(context, event)
    assert cluster.deleted == ["j"]


def test_malformed_event_is_reported(file_root, cluster, context):
    with pytest.raises(RuntimeError, match="malformed trigger event"):
        operator(file_root).execute_complete(context, {"status": "maybe"})


def test_inject_preemption_is_local_only():
    with pytest.raises(ValueError, match="only with cluster='local'"):
        FSDPTrainingOperator(task_id="t", dataset=DATA_URI, cluster="kubernetes",
                             inject_preemption={"node": 1, "at_step": 5})


def test_preemption_storm_exhausts_the_budget_then_fails(file_root, cluster, context):
    op = operator(file_root, max_preemptions=2)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    spot = {"node": 0, "reason": "DisruptionTarget", "message": "PreemptionByScheduler"}
    for n in (1, 2):
        write_record(file_root, n, "preempted", signal="SIGTERM")
        with pytest.raises(TaskDeferred):
            op.execute_complete(context, finished(disruptions=[spot]))
    write_record(file_root, 3, "preempted", signal="SIGTERM")
    with pytest.raises(RuntimeError, match="preempted 3 times, over the budget of 2"):
        op.execute_complete(context, finished(disruptions=[spot]))
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert (job["preemptions"], job["status"], len(cluster.launched)) == (3, "failed", 3)


def test_spot_then_on_demand_falls_back_after_n_preemptions(file_root, cluster, context):
    op = operator(file_root, capacity="spot-then-on-demand", fallback_after=1, max_preemptions=3)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "preempted", signal="SIGTERM")
    with pytest.raises(TaskDeferred):
        op.execute_complete(context, finished())
    assert [s.capacity for s, _ in cluster.launched] == ["spot-then-on-demand", "on-demand"]
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert [a["capacity"] for a in job["attempts"]] == ["spot-then-on-demand", "on-demand"]


def test_infra_failure_is_retried_then_succeeds(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    pull = {**finished(), "state": {"phase": "failed", "reason": "ImagePullBackOff", "nodes": [],
                                     "disruptions": [], "infra_reason": "ImagePullBackOff: image not found"}}
    with pytest.raises(TaskDeferred) as backoff:
        op.execute_complete(context, pull)  # no attempt record: the trainer never started
    assert backoff.value.method_name == "relaunch_after_backoff"  # waits in the triggerer ...
    wait = (backoff.value.trigger.serialize()[1]["moment"] - pendulum.now("UTC")).total_seconds()
    assert 25 < wait <= 30  # the first back-off: 30 s
    assert len(cluster.launched) == 1
    with pytest.raises(TaskDeferred):
        op.relaunch_after_backoff(context, {"status": "success"})  # ... then relaunches
    assert len(cluster.launched) == 2
    write_record(file_root, 2, "completed", last_step=100, checkpoint_step=100)
    result = op.execute_complete(context, finished(state_phase="succeeded"))
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert [a["classification"] for a in job["attempts"]] == ["infra", "succeeded"]
    assert (result["attempts"], result["preemptions"]) == (2, 0)
