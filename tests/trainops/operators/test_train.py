"""FSDPTrainingOperator's decisions, with a fake cluster at the backend boundary.

The fake (tests/trainops/cluster/fake_backend.py) returns job states shaped like the local
backend's status.json; the attempt records are real ones (trainer.contract.attempt_record) in
real file:// storage.
"""

import asyncio
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred

from tests.trainops.cluster.fake_backend import use_fake_cluster
from trainer.contract import RunLayout, attempt_record, run_prefix
from trainer.storage import open_storage
from trainops.operators import FSDPTrainingOperator

DATA_URI = "file:///data/datasets/demo/abc"


@pytest.fixture
def cluster(monkeypatch):
    return use_fake_cluster(monkeypatch)


@pytest.fixture
def context():
    return {
        "ti": SimpleNamespace(
            dag_id="retrain", run_id="manual__2026-01-01T00:00:00+00:00", task_id="train", map_index=-1
        )
    }


def operator(root, **kw):
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": DATA_URI},
        storage_root=root,
        nodes=2,
        trainer_config={"train.max_steps": 100},
        **kw,
    )


def layout_of(root):
    return RunLayout(run_prefix(root, "retrain", "manual__2026-01-01T00:00:00+00:00", "train"))


def finished(state_phase="failed", disruptions=()):
    return {
        "status": "finished",
        "handle": {"cluster": "local", "job_id": "j", "job_dir": "/nowhere"},
        "state": {
            "phase": state_phase,
            "reason": None,
            "disruptions": list(disruptions),
            "nodes": [{"index": 0, "exit_code": 1}, {"index": 1, "exit_code": 1}],
        },
    }


def first_event(trigger):
    async def take():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(take(), timeout=30))


def through_relaunch(op, context, event):
    """execute_complete deletes the attempt and waits (JobGoneTrigger) for its pods to be gone;
    the trigger runs for real against the fake; then the next attempt is launched."""
    with pytest.raises(TaskDeferred) as gone_wait:
        op.execute_complete(context, event)
    assert gone_wait.value.method_name == "relaunch_when_gone"
    gone = first_event(gone_wait.value.trigger)
    assert gone["status"] == "gone"
    with pytest.raises(TaskDeferred) as next_attempt:
        op.relaunch_when_gone(context, gone)
    assert next_attempt.value.method_name == "execute_complete"
    return next_attempt.value


def write_record(root, n, outcome, **kw):
    rec = attempt_record(
        attempt=n, outcome=outcome, world_size=2, **{"last_step": 50, "checkpoint_step": 50, **kw}
    )
    open_storage(root).put_json(layout_of(root).attempt(n), rec)


def test_bad_config_fails_before_anything_is_launched_or_written(file_root, cluster, context):
    op = FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": DATA_URI},
        storage_root=file_root,
        trainer_config={"train": {"lrr": 0.1}},
    )
    with pytest.raises(Exception, match=r"train\.lrr"):
        op.execute(context)
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []


def test_global_batch_the_ranks_cannot_split_fails_before_launch(file_root, cluster, context):
    op = FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": DATA_URI},
        storage_root=file_root,
        nodes=2,
        trainer_config={"train": {"micro_batch_size": 4, "global_batch_size": 12}},
    )
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
    through_relaunch(op, context, finished(disruptions=[spot]))
    assert [s.env["TRAINOPS_ATTEMPT"] for s, _ in cluster.launched] == ["1", "2"]
    assert cluster.deleted == ["j"]  # the old gang was deleted (and gone) before the relaunch
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert job["preemptions"] == 1
    assert job["attempts"][0]["classification"] == "preempted"
    assert "spot interruption notice" in job["attempts"][0]["reason"]

    write_record(file_root, 2, "completed", last_step=100, checkpoint_step=100, resumed_from_step=50)
    result = op.execute_complete(context, finished(state_phase="succeeded"))
    assert (result["steps"], result["attempts"], result["preemptions"], result["steps_lost"]) == (
        100,
        2,
        1,
        0,
    )


def test_trainer_failure_fails_with_hint_and_log_tail(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(
        file_root,
        1,
        "failed",
        error="OutOfMemoryError: CUDA out of memory",
        hint="reduce train.micro_batch_size or enable activation checkpointing",
    )
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
        FSDPTrainingOperator(
            task_id="t", dataset=DATA_URI, cluster="kubernetes", inject_preemption={"node": 1, "at_step": 5}
        )


def test_preemption_storm_exhausts_the_budget_then_fails(file_root, cluster, context):
    op = operator(file_root, max_preemptions=2)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    spot = {"node": 0, "reason": "DisruptionTarget", "message": "PreemptionByScheduler"}
    for n in (1, 2):
        write_record(file_root, n, "preempted", signal="SIGTERM")
        through_relaunch(op, context, finished(disruptions=[spot]))
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
    through_relaunch(op, context, finished())
    assert [s.capacity for s, _ in cluster.launched] == ["spot-then-on-demand", "on-demand"]
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert [a["capacity"] for a in job["attempts"]] == ["spot-then-on-demand", "on-demand"]


def test_infra_failure_is_retried_then_succeeds(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    pull = {
        **finished(),
        "state": {
            "phase": "failed",
            "reason": "ImagePullBackOff",
            "nodes": [],
            "disruptions": [],
            "infra_reason": "ImagePullBackOff: image not found",
        },
    }
    with pytest.raises(TaskDeferred) as backoff:
        op.execute_complete(context, pull)  # no attempt record: the trainer never started
    assert backoff.value.method_name == "relaunch_when_gone"  # waits in the triggerer ...
    wait = backoff.value.trigger.serialize()[1]["not_before"] - time.time()
    assert 25 < wait <= 30  # the first back-off: 30 s
    assert len(cluster.launched) == 1
    with pytest.raises(TaskDeferred):
        op.relaunch_when_gone(context, {"status": "gone", "handle": pull["handle"]})  # ... then relaunches
    assert len(cluster.launched) == 2
    write_record(file_root, 2, "completed", last_step=100, checkpoint_step=100)
    result = op.execute_complete(context, finished(state_phase="succeeded"))
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert [a["classification"] for a in job["attempts"]] == ["infra", "succeeded"]
    assert (result["attempts"], result["preemptions"]) == (2, 0)


def test_spot_that_never_schedules_falls_back_to_on_demand_at_once(file_root, cluster, context):
    op = operator(file_root, capacity="spot-then-on-demand", max_infra_retries=0)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    why = "Unschedulable: pod train-0 found no node for 901s (deadline 900s): 0/8 nodes are available"
    stuck = {
        **finished(),
        "state": {
            "phase": "failed",
            "reason": why,
            "nodes": [],
            "disruptions": [],
            "infra_reason": why,
            "unschedulable": True,
        },
    }
    deferred = through_relaunch(op, context, stuck)  # no back-off, and no infra retry spent
    assert [s.capacity for s, _ in cluster.launched] == ["spot-then-on-demand", "on-demand"]
    assert deferred.trigger.handle["labels"]["trainops/attempt"] == "2"
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert (job["infra_failures"], job["capacity"]) == (0, "on-demand")
    assert "no spot capacity" in job["attempts"][0]["decision"]["reason"]


def test_unschedulable_on_plain_spot_is_an_infra_failure(file_root, cluster, context):
    op = operator(file_root, capacity="spot", max_infra_retries=0)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    stuck = {
        **finished(),
        "state": {
            "phase": "failed",
            "reason": "Unschedulable",
            "nodes": [],
            "disruptions": [],
            "infra_reason": "Unschedulable",
            "unschedulable": True,
        },
    }
    with pytest.raises(RuntimeError, match="1 infrastructure failures, over the limit of 0"):
        op.execute_complete(context, stuck)


def test_job_options_reach_the_job_spec(file_root, cluster, context):
    op = operator(
        file_root,
        cluster="kubernetes",
        job_options={
            "kind": "pytorchjob",
            "scheduler": "kueue:gpu-queue",
            "spot_flavour": "gke",
            "env_from_secrets": ["s3-credentials"],
            "env": {"HF_HOME": "/cache"},
            "labels": {"team": "search"},
            "nccl_env": {"NCCL_IB_DISABLE": "1"},
        },
    )
    with pytest.raises(TaskDeferred):
        op.execute(context)
    spec, _ = cluster.launched[0]
    assert (spec.kind, spec.scheduler, spec.spot_flavour) == ("pytorchjob", "kueue:gpu-queue", "gke")
    assert spec.env["HF_HOME"] == "/cache" and spec.env["TRAINOPS_ATTEMPT"] == "1"
    assert spec.labels["team"] == "search" and spec.labels["trainops/attempt"] == "1"
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    kinds = [m["kind"] for m in job["attempts"][0]["manifests"]]
    assert kinds == ["PyTorchJob"] and job["attempts"][0]["spec"]["scheduler"] == "kueue:gpu-queue"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"schedular": "volcano"}, "unknown field 'schedular'; known fields: .*'scheduler'"),
        ({"nodes": 4}, "must not set 'nodes': use the operator's 'nodes' parameter"),
        ({"args": ["sh", "-c", "x"]}, "must not set 'args': the operator builds the trainer command"),
        ({"scheduler": "slurm"}, "scheduler 'slurm'"),
        ({"kind": "mpijob"}, "kind 'mpijob' is not one of"),
    ],
)
def test_bad_job_options_fail_when_the_dag_is_parsed(options, message):
    with pytest.raises(ValueError, match=message):
        FSDPTrainingOperator(task_id="t", dataset=DATA_URI, cluster="kubernetes", job_options=options)


def test_job_options_may_not_override_the_operators_env_or_labels(file_root, cluster, context):
    op = operator(file_root, job_options={"env": {"TRAINOPS_ATTEMPT": "7"}})
    with pytest.raises(ValueError, match=r"job_options env sets \['TRAINOPS_ATTEMPT'\]"):
        op.execute(context)
    assert cluster.launched == []


def test_deferrable_follows_the_trainops_setting(monkeypatch):
    assert FSDPTrainingOperator(task_id="t", dataset=DATA_URI).deferrable is True
    monkeypatch.setenv("AIRFLOW__TRAINOPS__DEFAULT_DEFERRABLE", "false")
    assert FSDPTrainingOperator(task_id="t", dataset=DATA_URI).deferrable is False
    assert FSDPTrainingOperator(task_id="t", dataset=DATA_URI, deferrable=True).deferrable is True


def test_not_deferrable_waits_in_the_worker_through_a_preemption(file_root, cluster, context):
    op = operator(file_root, deferrable=False, poll_interval=0.01)
    write_record(file_root, 1, "preempted", signal="SIGTERM")
    write_record(file_root, 2, "completed", last_step=100, checkpoint_step=100, resumed_from_step=50)
    spot = {"node": 0, "reason": "DisruptionTarget", "message": "PreemptionByScheduler"}
    cluster.states = {
        1: {"phase": "failed", "reason": None, "disruptions": [spot], "nodes": []},
        2: {"phase": "succeeded", "reason": None, "disruptions": [], "nodes": []},
    }
    result = op.execute(context)  # no TaskDeferred: the same triggers run in this process
    assert (result["steps"], result["attempts"], result["preemptions"]) == (100, 2, 1)
    assert len(cluster.deleted) == 1 and cluster.deleted[0].endswith("-a1-x")


def test_job_json_records_node_types_for_the_cost_report(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "completed", last_step=100, checkpoint_step=100)
    done = finished(state_phase="succeeded")
    done["state"]["nodes"] = [
        {
            "index": 0,
            "exit_code": 0,
            "node_name": "ip-10-0-1-7",
            "instance_type": "p5.48xlarge",
            "capacity_type": "spot",
        },
        {
            "index": 1,
            "exit_code": 0,
            "node_name": "ip-10-0-1-9",
            "instance_type": "p5.48xlarge",
            "capacity_type": "spot",
        },
    ]
    op.execute_complete(context, done)
    entry = open_storage(file_root).get_json(layout_of(file_root).job)["attempts"][0]
    assert [(n["instance_type"], n["capacity_type"]) for n in entry["node_types"]] == [
        ("p5.48xlarge", "spot")
    ] * 2
    assert entry["launched_at"] <= entry["ended_at"]


def test_what_only_rendering_refuses_also_fails_at_parse_time():
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        FSDPTrainingOperator(
            task_id="t",
            dataset=DATA_URI,
            cluster="kubernetes",
            job_options={"env": {"AWS_SECRET_ACCESS_KEY": "abc"}},
        )
    with pytest.raises(ValueError, match="spot_flavour 'auto' cannot be placed by kind 'trainjob'"):
        FSDPTrainingOperator(
            task_id="t",
            dataset=DATA_URI,
            cluster="kubernetes",
            termination_grace_seconds=30,
            job_options={"kind": "trainjob"},
        )


def test_sizing_settings_may_come_from_templates_and_are_checked_once_rendered(file_root, cluster, context):
    op = operator(
        file_root,
        gpus_per_node="{{ params.gpus }}",
        capacity="{{ params.capacity }}",
        max_preemptions="{{ params.max_preemptions }}",
    )  # accepted at parse: unknown yet
    op.gpus_per_node, op.capacity, op.max_preemptions = "0", "on-demand", "5"  # as rendered
    with pytest.raises(TaskDeferred):
        op.execute(context)
    spec, _ = cluster.launched[0]
    assert (spec.nodes, spec.gpus_per_node, spec.capacity, op.max_preemptions) == (2, 0, "on-demand", 5)

    bad = operator(file_root, max_preemptions="{{ params.max_preemptions }}")
    bad.max_preemptions = "lots"
    with pytest.raises(ValueError, match="max_preemptions must be an integer >= 0, got 'lots'"):
        bad.execute(context)
    assert len(cluster.launched) == 1  # nothing launched for the bad one


def test_plain_sizing_settings_fail_when_the_dag_is_parsed():
    with pytest.raises(ValueError, match="nodes must be an integer >= 1, got 0"):
        FSDPTrainingOperator(task_id="t", dataset=DATA_URI, nodes=0)
    with pytest.raises(ValueError, match="capacity 'cheap' is not one of"):
        FSDPTrainingOperator(task_id="t", dataset=DATA_URI, capacity="cheap")
