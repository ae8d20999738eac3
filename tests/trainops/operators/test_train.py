"""FSDPTrainingOperator's decisions, with a fake cluster at the backend boundary.

The fake (tests/trainops/cluster/fake_backend.py) returns job states shaped like the local
backend's status.json; the attempt records are real ones (trainer.contract.attempt_record) in
real file:// storage.
"""

import asyncio
import os
import re
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from tests.trainops.cluster.fake_backend import use_fake_cluster
from tests.trainops.operators.helpers import staged_dataset
from trainer.contract import RunLayout, attempt_record, run_prefix, safe_segment
from trainer.storage import open_storage
from trainops.operators import FSDPTrainingOperator, train_reads

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


def data_of(root):
    """A staged dataset version beside (not inside) the storage root ``root``."""
    return staged_dataset(f"{root.rsplit('/', 1)[0]}/data/datasets/demo/abc")


def operator(root, **kw):
    return FSDPTrainingOperator(
        **{
            "task_id": "train",
            "dataset": {"uri": data_of(root)},
            "storage_root": root,
            "nodes": 2,
            "trainer_config": {"train.max_steps": 100},
            **kw,
        },
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
        dataset={"uri": data_of(file_root)},
        storage_root=file_root,
        trainer_config="{{ params.trainer_config }}",
    )  # templated: checked when the task runs
    op.trainer_config = {"train": {"lrr": 0.1}}  # as rendered
    with pytest.raises(Exception, match=r"train\.lrr"):
        op.execute(context)
    assert cluster.launched == []
    assert open_storage(file_root).list(file_root) == []


def test_global_batch_the_ranks_cannot_split_fails_before_launch(file_root, cluster, context):
    op = FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": data_of(file_root)},
        storage_root=file_root,
        nodes="{{ params.nodes }}",
        trainer_config={"train": {"micro_batch_size": 4, "global_batch_size": 12}},
    )  # the world size is known once the sizing is rendered
    op.nodes = "2"
    with pytest.raises(Exception, match=r"train.global_batch_size=12 is not a multiple of .* world size 2"):
        op.execute(context)
    assert cluster.launched == []
    with pytest.raises(Exception, match=r"train.global_batch_size=12 is not a multiple of .* world size 2"):
        FSDPTrainingOperator(
            task_id="t",
            dataset=DATA_URI,
            nodes=2,
            trainer_config={"train": {"micro_batch_size": 4, "global_batch_size": 12}},
        )  # plain: when the DAG is parsed


def test_execute_writes_config_launches_attempt_one_and_defers(file_root, cluster, context):
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    layout = layout_of(file_root)
    spec, chaos = cluster.launched[0]
    assert spec.args == ["python", "-m", "trainer", "train", "--config", layout.config]
    assert spec.env["TRAINOPS_ATTEMPT"] == "1" and spec.nodes == 2 and chaos is None
    assert spec.labels["trainops/run"] == safe_segment("manual__2026-01-01T00:00:00+00:00")
    config = open_storage(file_root).get(layout.config).decode()
    assert f"data_uri: {data_of(file_root)}" in config and "max_steps: 100" in config
    assert deferred.value.trigger.handle["job_id"] == spec.name + "-x"
    job = open_storage(file_root).get_json(layout.job)
    assert [a["attempt"] for a in job["attempts"]] == [1]


def test_every_attempt_restarts_its_workers_in_place_twice_by_default_then_relaunches(
    file_root, cluster, context
):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "preempted", signal="SIGTERM")
    through_relaunch(
        op, context, finished(disruptions=[{"node": 1, "reason": "SpotInterruption", "message": "x"}])
    )
    assert [s.restarts_in_place for s, _ in cluster.launched] == [2, 2]  # the relaunched gang too
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert [a["spec"]["restarts_in_place"] for a in job["attempts"]] == [2, 2]  # recorded as launched


def test_an_attempt_that_restarted_in_place_finishes_with_its_restarts_in_job_json_and_the_result(
    file_root, cluster, context
):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    restarts = [
        {"restart": 0, "outcome": "failed", "cause": "network", "error": "NCCL timeout", "steps_lost": 6}
    ]
    write_record(
        file_root, 1, "completed", last_step=100, checkpoint_step=100, resumed_from_step=40,
        restarts=restarts, restore_files={"local": 2, "storage": 0},
    )  # fmt: skip
    result = op.execute_complete(context, finished(state_phase="succeeded"))
    assert (result["attempts"], result["steps_lost"]) == (1, 6)  # one attempt, its restart's replay lost
    (entry,) = open_storage(file_root).get_json(layout_of(file_root).job)["attempts"]
    assert entry["reason"] == (
        "the trainer completed every step; restarted in place 1× (network: NCCL timeout); resumed from "
        "the node-local tier: 2 of 2 files"
    )


def test_restarts_in_place_zero_relaunches_the_gang_on_every_failure(file_root, cluster, context):
    with pytest.raises(TaskDeferred):
        operator(file_root, restarts_in_place=0).execute(context)
    ((spec, _),) = cluster.launched
    assert spec.restarts_in_place == 0


def ti_of(run_id="manual__2026-01-01T00:00:00+00:00", task_id="train", map_index=-1):
    return {"ti": SimpleNamespace(dag_id="retrain", run_id=run_id, task_id=task_id, map_index=map_index)}


def test_run_ids_that_differ_only_in_unsafe_characters_get_a_folder_each(file_root, cluster):
    """Airflow lets a trigger choose its run id: ``nightly:…`` and ``nightly_…`` are two runs."""
    store = open_storage(file_root)
    jobs = {}
    for run_id in ("nightly:2026-01-01", "nightly_2026-01-01", "nightly/2026-01-01"):
        with pytest.raises(TaskDeferred):
            operator(file_root, trainer_config={"seed": len(jobs) + 1}).execute(ti_of(run_id))
        layout = RunLayout(run_prefix(file_root, "retrain", run_id, "train"))
        jobs[run_id] = (store.get_json(layout.job), store.get(layout.config).decode())
    assert len({job["run_uri"] for job, _ in jobs.values()}) == 3
    for n, (run_id, (job, config)) in enumerate(jobs.items(), start=1):
        assert job["airflow"] == {"dag_id": "retrain", "run_id": run_id, "task_id": "train", "map_index": -1}
        assert f"seed: {n}" in config and [a["attempt"] for a in job["attempts"]] == [1]
    assert len(cluster.launched) == 3


def test_a_run_folder_another_run_owns_is_refused_naming_both_before_anything_is_written(file_root, cluster):
    """Task ``g.3`` (in a task group) and task ``g``'s map index 3 meet in one folder."""
    with pytest.raises(TaskDeferred):
        operator(file_root, task_id="g.3", trainer_config={"seed": 1}).execute(ti_of(task_id="g.3"))
    store = open_storage(file_root)
    layout = RunLayout(run_prefix(file_root, "retrain", "manual__2026-01-01T00:00:00+00:00", "g", 3))
    before = (store.get(layout.job), store.get(layout.config))

    with pytest.raises(AirflowFailException) as refused:  # failed at once: a retry cannot fix it
        operator(file_root, task_id="g", trainer_config={"seed": 2}).execute(ti_of(task_id="g", map_index=3))
    assert str(refused.value) == (
        f"{layout.job} belongs to dag 'retrain', run 'manual__2026-01-01T00:00:00+00:00', task 'g.3', "
        "not to this task (dag 'retrain', run 'manual__2026-01-01T00:00:00+00:00', task 'g', map index 3): "
        "two runs never share a run folder, so this one trains nothing there; trigger the run with "
        "another run id, or move that folder aside if it is stale [RunFolderTaken: not retried, every "
        "try would fail the same way; fix the input and run again]"
    )
    assert (store.get(layout.job), store.get(layout.config)) == before  # its seed, its attempts
    assert len(cluster.launched) == 1


def test_a_rival_that_creates_the_run_folder_first_wins_and_the_second_is_refused(
    file_root, cluster, monkeypatch
):
    """Both read "no job.json", both create it: the create-only write lets one through."""
    rival = operator(file_root)
    with pytest.raises(TaskDeferred):
        rival.execute(ti_of(task_id="train", map_index=-1))
    real_read = FSDPTrainingOperator._read_job
    reads = []

    def first_read_sees_nothing(self, store, layout, identity):
        reads.append(layout.job)
        return None if len(reads) == 1 else real_read(self, store, layout, identity)

    monkeypatch.setattr(FSDPTrainingOperator, "_read_job", first_read_sees_nothing)
    job_uri = layout_of(file_root).job
    # the same folder, as a hand-made record of another owner would be
    store = open_storage(file_root)
    job = store.get_json(job_uri)
    store.put_json(job_uri, {**job, "airflow": {**job["airflow"], "run_id": "someone-else"}})
    with pytest.raises(
        AirflowFailException, match=r"belongs to dag 'retrain', run 'someone-else', task 'train'"
    ):
        operator(file_root).execute(ti_of())
    assert len(reads) == 2 and len(cluster.launched) == 1


def test_a_record_from_before_owners_were_kept_is_adopted(file_root, cluster, context):
    with pytest.raises(TaskDeferred):
        operator(file_root).execute(context)
    store, layout = open_storage(file_root), layout_of(file_root)
    legacy = store.get_json(layout.job)
    del legacy["airflow"]
    store.put_json(layout.job, legacy)
    with pytest.raises(TaskDeferred):
        operator(file_root).execute(context)  # reattaches (the fake's job is live) or relaunches
    assert store.get_json(layout.job)["airflow"]["run_id"] == "manual__2026-01-01T00:00:00+00:00"


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


def test_timeout_event_deletes_the_job_and_records_a_timeout(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    event = {**finished(), "status": "timeout", "message": "job j still running after 60s"}
    with pytest.raises(RuntimeError, match="stopped by its job_timeout: job j still running after 60s"):
        op.execute_complete(context, event)
    assert cluster.deleted == ["j"]
    entry = open_storage(file_root).get_json(layout_of(file_root).job)["attempts"][-1]
    assert entry["classification"] == "timeout" and "still running after 60s" in entry["reason"]


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


def test_a_record_storage_refused_is_read_from_the_log_and_a_storage_failure_relaunches(
    file_root, cluster, context
):
    """Storage refused even the attempt record: the trainer printed it as rank 0's last line,
    and an attempt that failed on storage is infrastructure, relaunched, not the program's error."""
    from trainer.contract import attempt_record_line

    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    record = attempt_record(
        attempt=1,
        outcome="failed",
        world_size=2,
        last_step=40,
        checkpoint_step=20,
        cause="storage",
        error="StorageUnavailable: PUT s3://b/run/checkpoints refused for 300 s",
    )
    cluster.log_tail = f"[node-0] step 40/100\n[node-0] {attempt_record_line(record)}\n[node-0] Traceback ..."
    with pytest.raises(TaskDeferred) as backoff:
        op.execute_complete(context, finished())  # no record in storage
    assert backoff.value.method_name == "relaunch_when_gone"  # an infrastructure back-off
    with pytest.raises(TaskDeferred):
        op.relaunch_when_gone(context, {"status": "gone", "handle": finished()["handle"]})
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    first = job["attempts"][0]
    assert (first["classification"], first["steps_lost"]) == ("infra", 20)
    assert first["record"]["cause"] == "storage"
    assert (job["infra_failures"], len(cluster.launched)) == (1, 2)


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
        (
            {"restarts_in_place": 1},
            "must not set 'restarts_in_place': use the training operator's 'restarts_in_place' parameter",
        ),
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
    # attempt 1 before its relaunch, attempt 2 once job.json recorded its success
    assert [d[-5:] for d in cluster.deleted] == ["-a1-x", "-a2-x"]


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


def test_the_result_and_job_json_carry_the_runs_estimated_cost(file_root, cluster, context):
    # 2 CPU nodes (1 accelerator each) on p5.48xlarge spot, priced by the parameter at $16 per
    # instance-hour = $2 per GPU-hour, for the hour the pods ran: $4. No step was logged, so
    # all of it is startup and the goodput is 0.
    op = operator(file_root, prices={"p5.48xlarge": {"spot": {"per_hour": 16.0}}})
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "completed", last_step=100, checkpoint_step=100)
    done = finished(state_phase="succeeded")
    p5 = {"node_name": "ip-10-0-1-7", "exit_code": 0, "instance_type": "p5.48xlarge", "capacity_type": "spot"}
    done["state"].update(
        nodes=[{**p5, "index": 0}, {**p5, "index": 1}],
        start_time=time.time() + 5,
        end_time=time.time() + 3605,
    )
    result = op.execute_complete(context, done)
    cost = open_storage(file_root).get_json(layout_of(file_root).job)["cost"]
    assert result["cost"] == cost and result["goodput"] == cost["goodput"] == 0.0
    assert cost["cost"] == pytest.approx(4.0) and cost["estimate"] is True
    assert cost["attempts"][0]["price"]["source"] == "prices parameter"
    assert cost["on_demand_cost"] == pytest.approx(2 * 98.32 / 8)  # the shipped on-demand price


def test_a_failed_run_records_its_cost_too(file_root, cluster, context):
    op = operator(file_root, max_preemptions=0)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "preempted", signal="SIGTERM")
    with pytest.raises(RuntimeError, match="over the budget of 0"):
        op.execute_complete(context, finished())
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert job["status"] == "failed" and job["cost"]["attempts"][0]["preempted"] is True


def test_bad_prices_fail_at_parse_or_once_rendered_before_launch(file_root, cluster, context):
    with pytest.raises(
        ValueError, match=re.escape("prices parameter: p4d.24xlarge spot: per_hour must be >= 0")
    ):
        operator(file_root, prices={"p4d.24xlarge": {"spot": {"per_hour": -1}}})
    op = operator(file_root, prices="{{ params.prices }}")  # accepted at parse: unknown yet
    op.prices = '{"p9.fake": {"spot": {"per_hour": 3}}}'  # as rendered: no gpus for an unknown type
    with pytest.raises(
        ValueError, match=re.escape("p9.fake spot: gpus must be the instance type's accelerator")
    ):
        op.execute(context)
    assert cluster.launched == []


def test_a_bad_prices_variable_is_ignored_with_a_warning(file_root, cluster, context, monkeypatch, capfd):
    monkeypatch.setenv("AIRFLOW_VAR_TRAINOPS_PRICES", '{"p4d.24xlarge": []}')
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "completed", last_step=100, checkpoint_step=100)
    result = op.execute_complete(context, finished(state_phase="succeeded"))
    assert result["cost"]["format"] == "trainops.cost/v1"
    assert "Variable trainops_prices ignored for the cost estimate" in capfd.readouterr().out


def test_what_only_rendering_refuses_also_fails_at_parse_time():
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        FSDPTrainingOperator(
            task_id="t",
            dataset=DATA_URI,
            cluster="kubernetes",
            job_options={"env": {"AWS_SECRET_ACCESS_KEY": "abc"}},
        )
    with pytest.raises(ValueError, match="priority_class 'batch-low' cannot be set for kind 'trainjob'"):
        FSDPTrainingOperator(
            task_id="t",
            dataset=DATA_URI,
            cluster="kubernetes",
            termination_grace_seconds=30,
            job_options={"kind": "trainjob", "priority_class": "batch-low"},
        )


def test_sizing_settings_may_come_from_templates_and_are_checked_once_rendered(file_root, cluster, context):
    op = operator(
        file_root,
        gpus_per_node="{{ params.gpus }}",
        capacity="{{ params.capacity }}",
        max_preemptions="{{ params.max_preemptions }}",
        restarts_in_place="{{ params.restarts_in_place }}",
    )  # accepted at parse: unknown yet
    op.gpus_per_node, op.capacity, op.max_preemptions, op.restarts_in_place = "0", "on-demand", "5", "1"
    with pytest.raises(TaskDeferred):
        op.execute(context)
    spec, _ = cluster.launched[0]
    assert (spec.nodes, spec.gpus_per_node, spec.capacity, op.max_preemptions) == (2, 0, "on-demand", 5)
    assert spec.restarts_in_place == 1  # torchrun's --max-restarts, from the rendered text

    bad = operator(file_root, max_preemptions="{{ params.max_preemptions }}")
    bad.max_preemptions = "lots"
    with pytest.raises(AirflowFailException, match="max_preemptions must be an integer >= 0, got 'lots'"):
        bad.execute(context)  # a rendered bad value fails at once: a retry renders it the same
    bad = operator(file_root, restarts_in_place="{{ params.restarts_in_place }}")
    bad.restarts_in_place = "12"
    with pytest.raises(
        AirflowFailException, match="restarts_in_place must be an integer from 0 to 10, got 12"
    ):
        bad.execute(context)
    assert len(cluster.launched) == 1  # nothing launched for the bad ones


def test_plain_sizing_settings_fail_when_the_dag_is_parsed():
    with pytest.raises(ValueError, match="nodes must be an integer >= 1, got 0"):
        FSDPTrainingOperator(task_id="t", dataset=DATA_URI, nodes=0)
    with pytest.raises(ValueError, match="capacity 'cheap' is not one of"):
        FSDPTrainingOperator(task_id="t", dataset=DATA_URI, capacity="cheap")


# -- bad inputs: each fails before anything is launched or written ---------------------------
# Plain values fail when the DAG is parsed (the constructor); templated ones, and what needs
# storage or this host, in execute before config.yaml is written.


def nothing_launched_or_written(cluster, root):
    assert cluster.launched == []
    assert open_storage(root).list(root) == []


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dataset": "s3:///datasets/demo/v1"}, "dataset URI 's3:///datasets/demo/v1' names no bucket: use "),
        (
            {"dataset": "data/demo/v1"},
            "dataset URI 'data/demo/v1' is not a file:// or s3:// URI: use file:///",
        ),
        (
            {"dataset": {"uri": "file://data/demo/v1"}},
            "dataset URI 'file://data/demo/v1' is not an absolute path",
        ),
        ({"dataset": ""}, "dataset must be a StageDatasetOperator result or a dataset version URI, got ''"),
        (
            {"trainer_config": {"train.lr": float("nan")}},
            r"train.lr: expected a finite number, got nan; set a number",
        ),
        ({"trainer_config": {"train": {"lr": float("inf")}}}, "train.lr: expected a finite number, got inf"),
        ({"trainer_config": {"train.lr": "1e999"}}, "train.lr: expected a finite number, got inf"),
        ({"trainer_config": {"train.grad_clip": float("nan")}}, "train.grad_clip: expected a finite number"),
        (
            {"trainer_config": {"model.builder": "custom_model.build"}},
            "model.builder: expected 'module:function'",
        ),
        (
            {"trainer_config": {"model.builder": "my-models:build"}},
            "model.builder: expected 'module:function'",
        ),
        (
            {"poll_interval": -1},
            r"poll_interval must be a positive number of seconds, got -1; pass a number such as 5",
        ),
        ({"poll_interval": 0}, "poll_interval must be a positive number of seconds, got 0"),
        ({"poll_interval": "5"}, "poll_interval must be a positive number of seconds, got '5'"),
        ({"poll_interval": float("nan")}, "poll_interval must be a positive number of seconds, got nan"),
        (
            {"progress_every": 0},
            "progress_every must be a positive number of seconds, got 0; pass a number such as 30",
        ),
        ({"job_timeout": -5}, "job_timeout must be a positive number of seconds, got -5"),
        (
            {"unschedulable_timeout": "900"},
            "unschedulable_timeout must be a positive number of seconds, got '900'",
        ),
        (
            {"termination_grace_seconds": "60"},
            "termination_grace_seconds must be an integer >= 1, got the text '60'; write 60 without quotes",
        ),
        ({"termination_grace_seconds": 0}, "termination_grace_seconds must be an integer >= 1, got 0"),
        ({"max_infra_retries": -1}, "max_infra_retries must be an integer >= 0, got -1"),
        ({"max_infra_retries": 1.5}, "max_infra_retries must be an integer >= 0, got 1.5"),
        ({"fallback_after": 0}, "fallback_after must be an integer >= 1, got 0"),
        (
            {"restarts_in_place": 11},
            r"restarts_in_place must be an integer from 0 to 10, got 11: .* pass a few, such as 2 "
            r"\(the default\), or 0 to relaunch the gang on every failure",
        ),
        ({"restarts_in_place": -1}, "restarts_in_place must be an integer >= 0, got -1"),
        ({"restarts_in_place": "often"}, "restarts_in_place must be an integer >= 0, got 'often'"),
        (
            {"job_options": {"memory": "-4Gi"}},
            r"JobSpec memory '-4Gi' is not a positive Kubernetes quantity \(negative\)",
        ),
        ({"job_options": {"cpu": "lots"}}, "JobSpec cpu 'lots' is not a positive Kubernetes quantity"),
        ({"job_options": {"shm_size": "0"}}, "JobSpec shm_size '0' is not a positive Kubernetes quantity"),
        # Not after training, at promotion: the name is known when the DAG is parsed.
        ({"model_name": "x" * 300}, r"model_name 'xxxx.*is 300 characters long; at most 128 are allowed"),
        ({"model_name": " demo-lm"}, "starts or ends with whitespace"),
        ({"model_name": ""}, "model_name '' is empty"),
    ],
)
def test_a_plain_bad_input_fails_when_the_dag_is_parsed(options, message):
    """On the local cluster too: ``job_options`` are checked whatever the cluster."""
    kwargs = {"task_id": "t", "dataset": DATA_URI, **options}
    with pytest.raises(ValueError, match=message):
        FSDPTrainingOperator(**kwargs)


@pytest.mark.parametrize(
    "rendered, message",
    [
        ({"dataset": "s3:///datasets/demo/v1"}, "dataset URI 's3:///datasets/demo/v1' names no bucket"),
        ({"dataset": "data/demo/v1"}, "dataset URI 'data/demo/v1' is not a file:// or s3:// URI"),
        ({"trainer_config": {"train.lr": float("nan")}}, "train.lr: expected a finite number, got nan"),
        ({"trainer_config": {"train.lr": "inf"}}, "train.lr: expected a number, got 'inf'"),
        (
            {"trainer_config": {"model.builder": "nope"}},
            "model.builder: expected 'module:function', got 'nope'",
        ),
    ],
)
def test_a_templated_bad_input_fails_in_execute_before_anything_is_written(
    file_root, cluster, context, rendered, message
):
    op = operator(
        file_root, dataset="{{ ti.xcom_pull('stage') }}", trainer_config="{{ params.trainer_config }}"
    )
    # accepted at parse (unknown yet); as the templates render:
    op.dataset, op.trainer_config = data_of(file_root), {}
    for key, value in rendered.items():
        setattr(op, key, value)
    # a bad parameter or trainer config fails at once, without retry, whatever `retries` says
    with pytest.raises(AirflowFailException, match=message):
        op.execute(context)
    nothing_launched_or_written(cluster, file_root)


def test_a_dataset_that_points_at_nothing_is_named_with_what_is_there(file_root, tmp_path, cluster, context):
    data = f"file://{tmp_path}/data/datasets"
    op = operator(file_root)
    op.dataset = f"{data}/demo/never-staged"
    with pytest.raises(ValueError) as err:
        op.execute(context)
    assert str(err.value) == (
        f"dataset '{data}/demo/never-staged' does not exist (nothing is stored under it): point dataset at a "
        "staged dataset version (<root>/datasets/<name>/<version>, the 'uri' StageDatasetOperator returns)"
    )
    open_storage(data).put_json(f"{data}/demo/failed/validation.json", {"success": False})
    op.dataset = f"{data}/demo/failed"  # what a failed staging leaves: a report, no manifest
    with pytest.raises(
        ValueError,
        match=r"holds 1 object\(s\) \(such as .*validation.json'\) but no manifest.json, so it is not a staged dataset version",
    ):
        op.execute(context)
    op.dataset = f"{data}/demo"  # the dataset's folder, not one of its versions
    with pytest.raises(
        ValueError,
        match=rf"'{data}/demo' is not one dataset version but holds 1 of them, such as '{data}/demo/abc': point dataset at one version folder",
    ):
        op.execute(context)
    nothing_launched_or_written(cluster, file_root)


def test_a_window_longer_than_the_train_split_fails_naming_both_numbers(
    file_root, tmp_path, cluster, context
):
    op = operator(file_root, trainer_config={"train.seq_len": 64})
    op.dataset = staged_dataset(f"file://{tmp_path}/data/datasets/tiny/v1", train_tokens=50)
    with pytest.raises(AirflowFailException) as err:  # no retry: the same data fails the same way
        op.execute(context)
    assert str(err.value.__cause__) == (
        f"train.seq_len=64 needs windows of 65 tokens, but the train split of {op.dataset} has only 50 "
        "tokens; lower train.seq_len to at most 49, or stage more data"
    )
    nothing_launched_or_written(cluster, file_root)
    op.trainer_config = {"train.seq_len": 8, "train.micro_batch_size": 4}  # 6 samples, 2 ranks x 4 wanted
    with pytest.raises(
        AirflowFailException,
        match=r"50 tokens, 6 samples of train.seq_len=8, fewer than one micro-step takes \(train.micro_batch_size=4 x world size 2 = 8\)",
    ):
        op.execute(context)
    nothing_launched_or_written(cluster, file_root)


def test_a_vocabulary_below_the_tokenizers_fails_before_launch(file_root, cluster, context):
    op = operator(file_root, trainer_config={"model.vocab_size": 200})
    with pytest.raises(AirflowFailException) as err:
        op.execute(context)
    assert str(err.value.__cause__) == (
        f"model.vocab_size=200 is smaller than the vocabulary of the dataset's tokenizer (257, {data_of(file_root)}); "
        "set model.vocab_size=0 to take the dataset's, or at least 257"
    )
    nothing_launched_or_written(cluster, file_root)


def write_module(folder, name, source):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(source)
    return folder


def test_a_builder_the_local_cluster_cannot_import_fails_before_launch(
    file_root, tmp_path, cluster, context, monkeypatch
):
    """The lookup runs with the environment the local cluster gives the trainer: a module
    only Airflow's own sys.path holds (here: only this process's) is not found."""
    models = write_module(
        tmp_path / "models", "team_model", "import torch\n\ndef build(vocab_size, seq_len):\n    ...\n"
    )
    monkeypatch.syspath_prepend(str(models))  # this process finds it; the cluster's processes do not
    op = operator(file_root, trainer_config={"model.builder": "team_model:build"})
    with pytest.raises(
        ValueError,
        match=r"model.builder 'team_model:build': no module 'team_model' on the local cluster's Python path .*put its folder on PYTHONPATH",
    ):
        op.execute(context)
    nothing_launched_or_written(cluster, file_root)

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(models), os.environ.get("PYTHONPATH", "")]))
    op.trainer_config = {"model.builder": "team_model:make"}
    with pytest.raises(ValueError) as err:
        op.execute(context)
    assert str(err.value) == (
        f"model.builder 'team_model:make': module 'team_model' ({models / 'team_model.py'}) has no function "
        "'make'; name a function it defines at its top level"
    )
    nothing_launched_or_written(cluster, file_root)

    op.trainer_config = {"model.builder": "team_model:build"}
    with pytest.raises(TaskDeferred):
        op.execute(context)
    assert len(cluster.launched) == 1  # found where the trainer will look: launched


def test_an_image_only_builder_passes_on_kubernetes_but_one_found_here_is_checked(
    file_root, tmp_path, cluster, context, monkeypatch
):
    op = operator(file_root, cluster="kubernetes", trainer_config={"model.builder": "image_only_model:build"})
    with pytest.raises(TaskDeferred):
        op.execute(context)  # not on this host: the trainer in the image finds out
    assert len(cluster.launched) == 1
    monkeypatch.syspath_prepend(
        str(write_module(tmp_path / "models", "shared_model", "def build(vocab_size, seq_len): ...\n"))
    )
    op = operator(file_root, cluster="kubernetes", trainer_config={"model.builder": "shared_model:nope"})
    with pytest.raises(
        ValueError,
        match=r"model.builder 'shared_model:nope': module 'shared_model' \(.*shared_model.py\) has no function 'nope'",
    ):
        op.execute(context)
    assert len(cluster.launched) == 1


def test_gpus_the_local_host_lacks_fail_before_anything_is_launched(
    file_root, tmp_path, context, monkeypatch
):
    """The real local cluster, on a host made GPU-less: no nvidia-smi on PATH and no driver
    folder. Without the check the trainer would find no CUDA device and train on the CPU."""
    import trainops.cluster.local.gpus as gpus

    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    monkeypatch.setattr(gpus, "DRIVER_GPUS", tmp_path / "no-driver")
    op = operator(file_root, gpus_per_node=1)
    with pytest.raises(ValueError) as err:
        op.execute(context)
    assert str(err.value) == (
        "gpus_per_node=1 on 2 local node(s) needs 2 GPU(s) on this host, but it has none (no NVIDIA driver: "
        f"nvidia-smi is not on PATH and {tmp_path / 'no-driver'} does not exist); set gpus_per_node=0 to train "
        "on the CPU, or run on cluster='kubernetes'"
    )
    assert not (tmp_path / "local" / "jobs").exists()
    assert open_storage(file_root).list(file_root) == []


def test_a_failed_wait_leaves_the_job_running_and_says_how_to_reattach(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    event = {**finished(), "status": "error", "message": "status read failed for 601 s (40 tries)"}
    event.pop("state")
    with pytest.raises(RuntimeError, match=r"Job j was left running .* clear this task to reattach"):
        op.execute_complete(context, event)
    assert cluster.deleted == []  # a read that failed never deletes a job
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert job["status"] == "running" and "ended_at" not in job["attempts"][-1]


def test_a_hung_attempt_keeps_its_logs_tail_and_is_relaunched_against_the_infra_budget(
    file_root, cluster, context
):
    op = operator(file_root, hang_timeout=45, max_infra_retries=1)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    trigger = deferred.value.trigger
    assert trigger.hang_timeout == 45 and trigger.heartbeat_uri == layout_of(file_root).heartbeat(1)
    running = {"phase": "running", "reason": None, "disruptions": [], "nodes": []}
    hung = {**finished(), "status": "hung", "state": running, "message": "job j: no new step for 46s"}
    nxt = through_relaunch(op, context, hung)
    assert cluster.deleted == ["j"] and len(cluster.launched) == 2
    assert nxt.trigger.heartbeat_uri == layout_of(file_root).heartbeat(2)
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    first = job["attempts"][0]
    assert first["classification"] == "hung" and first["reason"] == "job j: no new step for 46s"
    assert first["logs_tail"] == cluster.logs_tail({"job_id": "j"}, lines=50)
    assert job["infra_failures"] == 1 and job["preemptions"] == 0
    with pytest.raises(
        RuntimeError, match=r"no new step for 46s\. 2 infrastructure failures \(hangs included\)"
    ):
        op.execute_complete(context, hung)  # the second hang is over the budget of 1
    assert cluster.deleted == ["j", "j"]


def test_the_execution_timeout_is_every_triggers_deadline_and_airflows_timeout(file_root, cluster, context):
    from datetime import UTC, datetime, timedelta

    started = datetime.now(UTC)
    ctx = {"ti": SimpleNamespace(**vars(context["ti"]), start_date=started)}
    op = operator(file_root, execution_timeout=timedelta(hours=2))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    deadline = started.timestamp() + 7200
    assert deferred.value.trigger.deadline == deadline
    assert timedelta(hours=2) - timedelta(seconds=60) < deferred.value.timeout <= timedelta(hours=2)
    # after the deferral, a fresh operator (a new worker) takes the deadline from the event
    again = operator(file_root, execution_timeout=timedelta(hours=2))
    spot = {"node": 1, "reason": "SpotInterruption", "message": "spot"}
    write_record(file_root, 1, "preempted", signal="SIGTERM")
    with pytest.raises(TaskDeferred) as gone_wait:
        again.resume_execution(
            "execute_complete", {"event": {**finished(disruptions=[spot]), "deadline": deadline}}, ctx
        )
    assert gone_wait.value.trigger.deadline == deadline


def test_a_deadline_event_deletes_the_job_and_records_the_attempt(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    running = {"phase": "running", "reason": None, "disruptions": [], "nodes": []}
    event = {
        **finished(),
        "status": "deadline",
        "state": running,
        "message": "the task's execution_timeout ends",
    }
    with pytest.raises(RuntimeError, match="stopped by its execution_timeout"):
        op.execute_complete(context, event)
    assert cluster.deleted == ["j"]
    entry = open_storage(file_root).get_json(layout_of(file_root).job)["attempts"][-1]
    assert entry["classification"] == "timeout" and entry["state"] == running


def test_when_airflows_deferral_timeout_wins_the_live_jobs_are_deleted_before_it_fails(
    file_root, cluster, context
):
    from airflow.sdk.bases.operator import TriggerFailureReason  # what the scheduler stores
    from airflow.sdk.exceptions import TaskDeferralTimeout

    cluster.live = [{"cluster": "local", "job_id": "train-live-a1", "job_dir": "/nowhere", "labels": {}}]
    op = operator(file_root)  # a fresh worker: Airflow resumes the task only to fail it
    with pytest.raises(TaskDeferralTimeout):
        op.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, context)
    assert cluster.deleted == ["train-live-a1"]


def test_not_deferrable_the_deadline_stops_the_job_before_airflows_alarm(file_root, cluster, context):
    from datetime import timedelta

    from trainops.triggers.job import DEADLINE_MARGIN_S

    op = operator(file_root, deferrable=False, poll_interval=0.01)
    op.execution_timeout = timedelta(seconds=DEADLINE_MARGIN_S + 0.5)  # the event comes after 0.5 s
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="stopped by its execution_timeout"):
        op.execute(context)  # the job stays running: only the deadline ends the wait
    assert time.monotonic() - started < 10
    assert len(cluster.deleted) == 1
    entry = open_storage(file_root).get_json(layout_of(file_root).job)["attempts"][-1]
    assert entry["classification"] == "timeout"


def test_the_result_and_a_silent_attempts_progress_come_from_the_newest_metrics_parts(tmp_path):
    from trainer.runtime.metrics import MetricsLog

    layout = RunLayout((tmp_path / "run").as_uri())
    store = open_storage(layout.run_uri)
    assert train_reads.progress(store, layout, 1) is None  # nothing logged at all
    first, second = (MetricsLog(store, layout.metrics, attempt=a, flush_every=2) for a in (1, 2))
    for step in range(1, 7):
        first.add(step=step, loss=10.0 - step, lr=0.1, tokens_per_s=1.0, time=0.0)
    for step in range(5, 9):  # resumed from step 4 after a SIGKILL
        second.add(step=step, loss=1.0 / step, lr=0.1, tokens_per_s=1.0, time=0.0)
    assert train_reads.progress(store, layout, 1) == {"last_step": 6, "committed_step": 0}
    assert train_reads.progress(store, layout, 2) == {"last_step": 8, "committed_step": 0}
    assert train_reads.progress(store, layout, 3) == {"last_step": 0, "committed_step": 0}
    record = attempt_record(attempt=2, outcome="completed", last_step=8, checkpoint_step=8, world_size=1)
    job = {"attempts": [{"steps_lost": 2}, {"steps_lost": 0}], "preemptions": 0}
    result = train_reads.result(store, layout, job, record)
    assert (result["final_loss"], result["metrics_uri"]) == (0.125, layout.metrics_parts)


def test_the_steps_bad_loss_rollbacks_skipped_are_in_job_json_and_the_result(file_root, cluster, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    rollback = {"at_step": 14, "loss": "nan", "why": "non-finite loss nan", "to_step": 10}
    write_record(
        file_root,
        1,
        "completed",
        last_step=100,
        checkpoint_step=100,
        rollbacks=[
            {**rollback, "skipped_from": 11, "skipped_to": 15},
            {**rollback, "skipped_from": 61, "skipped_to": 62},
        ],
    )
    result = op.execute_complete(context, finished(state_phase="succeeded"))
    assert result["steps_skipped"] == [[11, 15], [61, 62]]  # what the model card records
    job = open_storage(file_root).get_json(layout_of(file_root).job)
    assert [r["skipped_from"] for r in job["attempts"][0]["record"]["rollbacks"]] == [11, 61]
