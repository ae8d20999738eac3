"""A finished attempt's job is deleted once job.json records it, log tail included, unless kept;
a kept job gets a TTL where its kind has one."""

import pytest
from airflow.sdk.exceptions import TaskDeferred

from tests.trainops.operators.test_train import (  # the training operator's fixtures
    cluster,  # noqa: F401
    context,  # noqa: F401
    finished,
    layout_of,
    operator,
    write_record,
)
from trainer.storage import open_storage
from trainops.cluster.spec import JobSpec
from trainops.operators.cleanup import LOGS_TAIL_CHARS, clip_tail, deletes_finished, ttl_options
from trainops.operators.launch_plan import LaunchSettings, training_attempt


def job_json(root):
    return open_storage(root).get_json(layout_of(root).job)


def recording_deletes(cluster, root):  # noqa: F811
    """What job.json held each time the fake cluster was asked to delete a job."""
    seen = []
    delete = cluster.delete

    def spy(handle):
        seen.append(job_json(root)["attempts"][-1])
        delete(handle)

    cluster.delete = spy
    return seen


def test_a_succeeded_attempt_is_deleted_after_job_json_records_it(file_root, cluster, context):  # noqa: F811
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    seen = recording_deletes(cluster, file_root)
    write_record(file_root, 1, "completed", last_step=100, checkpoint_step=100)
    op.execute_complete(context, finished(state_phase="succeeded"))
    assert cluster.deleted == ["j"]
    (entry,) = seen  # recorded first: state, classification and the log tail
    assert entry["classification"] == "succeeded" and entry["state"]["phase"] == "succeeded"
    assert entry["logs_tail"] == cluster.log_tail
    assert job_json(file_root)["status"] == "succeeded"


def test_a_failed_attempt_is_deleted_after_its_tail_is_kept_and_the_task_still_says_why(
    file_root,
    cluster,  # noqa: F811
    context,  # noqa: F811
):
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    seen = recording_deletes(cluster, file_root)
    write_record(file_root, 1, "failed", error="ValueError: bad", hint="fix it")
    with pytest.raises(RuntimeError, match="fix it") as failure:
        op.execute_complete(context, finished())
    assert "[node-0] RuntimeError" in str(failure.value)  # the tail, read before the deletion
    assert cluster.deleted == ["j"] and seen[0]["classification"] == "error"
    assert job_json(file_root)["attempts"][0]["logs_tail"] == cluster.log_tail


def test_keep_finished_jobs_keeps_them(file_root, cluster, context):  # noqa: F811
    op = operator(file_root, keep_finished_jobs=True)
    with pytest.raises(TaskDeferred):
        op.execute(context)
    write_record(file_root, 1, "completed", last_step=100, checkpoint_step=100)
    op.execute_complete(context, finished(state_phase="succeeded"))
    assert cluster.deleted == []
    assert job_json(file_root)["attempts"][0]["logs_tail"] == cluster.log_tail


def test_a_failed_deletion_is_logged_and_the_outcome_stands(file_root, cluster, context, caplog, capsys):  # noqa: F811
    op = operator(file_root)
    with pytest.raises(TaskDeferred):
        op.execute(context)

    def refuse(handle):
        raise ConnectionResetError("reset by peer")

    cluster.delete = refuse
    write_record(file_root, 1, "completed", last_step=100, checkpoint_step=100)
    assert op.execute_complete(context, finished(state_phase="succeeded"))["steps"] == 100
    assert "could not delete the finished job j (reset by peer)" in caplog.text + capsys.readouterr().out


def test_the_keep_parameter_is_a_boolean(file_root):
    with pytest.raises(ValueError, match="keep_finished_jobs must be True or False, got 'yes'"):
        operator(file_root, keep_finished_jobs="yes")


def test_relaunches_delete_anyway_and_only_finished_runs_are_cleaned_here():
    assert deletes_finished(False, "finish") and deletes_finished(False, "fail")
    assert not deletes_finished(False, "relaunch")  # the relaunch path deletes before it waits
    assert not deletes_finished(True, "finish")


@pytest.mark.parametrize(
    ("kind", "where"),
    [("indexed-job", ("spec",)), ("pytorchjob", ("spec", "runPolicy")), ("trainjob", None)],
)
def test_a_kept_job_gets_a_ttl_where_its_kind_has_one(kind, where):
    from trainops.cluster.kubernetes.render import render_manifests

    settings = LaunchSettings(
        nodes=2,
        gpus_per_node=0,
        image="trainer:1",
        namespace="ml",
        termination_grace_seconds=30,
        job_options={"kind": kind, "spot_flavour": "gke"},
        keep_finished_jobs=True,
    )
    identity = {"dag_id": "d", "run_id": "r", "task_id": "train", "map_index": -1}
    spec = training_attempt(
        settings, identity=identity, run_uri="s3://b/runs/r", attempt=1, capacity="spot", storage_env={}
    ).spec
    job = render_manifests(spec)[-1]
    if where is None:
        assert spec.ttl_seconds_after_finished is None  # a TrainJob has no TTL field
        assert "ttlSecondsAfterFinished" not in str(job)
        return
    node = job
    for key in where:
        node = node[key]
    assert node["ttlSecondsAfterFinished"] == 86400
    own = ttl_options(True, kind, {"ttl_seconds_after_finished": 600})
    assert own == {}  # the user's own TTL in job_options wins


def test_a_trainjob_refuses_a_ttl_by_name():
    from trainops.cluster.kubernetes.render import render_manifests
    from trainops.cluster.spec import JobSpecError

    spec = JobSpec(
        name="t", args=["x"], kind="trainjob", termination_grace_seconds=30, ttl_seconds_after_finished=60
    )
    with pytest.raises(JobSpecError, match="ttl_seconds_after_finished 60 cannot be set for kind 'trainjob'"):
        render_manifests(spec)


def test_a_long_tail_keeps_its_end_from_a_line_start():
    text = "\n".join(f"line {i}" for i in range(10000))
    clipped = clip_tail(text)
    assert clipped is not None and len(clipped) <= LOGS_TAIL_CHARS
    assert clipped.endswith("line 9999") and clipped.startswith("line ")
    assert clip_tail("short") == "short" and clip_tail(None) is None
