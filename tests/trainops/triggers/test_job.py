"""JobTrigger: serializes to (classpath, kwargs) and reports a finished job once."""

import asyncio
import time

from trainops.cluster.local import LocalCluster
from trainops.cluster.spec import JobSpec
from trainops.triggers.job import JobTrigger


def first_event(trigger):
    async def take():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(take(), timeout=30))


def test_serialize_round_trip():
    handle = {"cluster": "local", "job_id": "j", "job_dir": "/tmp/j", "labels": {}}
    trigger = JobTrigger(handle=handle, poll_interval=0.5, timeout=60, started_at=123.0)
    path, kwargs = trigger.serialize()
    assert path == "trainops.triggers.job.JobTrigger"
    assert JobTrigger(**kwargs).serialize() == (path, kwargs)


def test_reports_finished_job_with_its_state(tmp_path):
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(JobSpec(name="quick", args=["python", "-c", "pass"], distributed=False))
    event = first_event(JobTrigger(handle=handle, poll_interval=0.1,
                                   cluster_options={"state_dir": str(tmp_path)}))
    assert event["status"] == "finished"
    assert event["state"]["phase"] == "succeeded"
    assert event["handle"]["job_id"] == handle["job_id"]


def test_reports_timeout_as_event_and_leaves_the_job_alone(tmp_path):
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(JobSpec(name="slow", args=["python", "-c", "import time; time.sleep(30)"],
                                    distributed=False))
    try:
        event = first_event(JobTrigger(handle=handle, poll_interval=0.1, timeout=0.5,
                                       cluster_options={"state_dir": str(tmp_path)}))
        assert event["status"] == "timeout" and "still" in event["message"]
        assert cluster.status(handle)["phase"] in ("pending", "running")  # the operator decides
    finally:
        cluster.delete(handle)


def test_backend_errors_become_error_events():
    event = first_event(JobTrigger(handle={"cluster": "nowhere", "job_id": "x"}, poll_interval=0.1))
    assert event["status"] == "error" and "unknown cluster 'nowhere'" in event["message"]


def test_logs_training_progress_from_metrics(tmp_path, caplog, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 7, "loss": 2.5, "tokens_per_s": 1234.0, "attempt": 1}\n'
                       '{"step": 3, "loss": 9.9, "attempt": 2}\n')
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(JobSpec(name="steps", args=["python", "-c", "import time; time.sleep(1)"],
                                    distributed=False, labels={"trainops/attempt": "1"}))
    caplog.set_level("INFO")
    first_event(JobTrigger(handle=handle, poll_interval=0.1, progress_uri=f"file://{metrics}",
                           progress_every=0.2, cluster_options={"state_dir": str(tmp_path)}))
    logged = caplog.text + capsys.readouterr().out
    assert "attempt 1: step 7, loss 2.5000, 1,234 tok/s" in logged
    assert "step 3" not in logged  # another attempt's record


def test_restart_deletes_nothing_and_kill_deletes_the_job(tmp_path):
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(JobSpec(name="long", args=["python", "-c", "import time; time.sleep(60)"],
                                    distributed=False))
    trigger = JobTrigger(handle=handle, poll_interval=0.1, cluster_options={"state_dir": str(tmp_path)})

    async def restart_then_kill():
        task = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.5)  # the trigger is polling; the triggerer now restarts:
        task.cancel()
        await trigger.cleanup()
        alive_after_restart = cluster.status(handle)["phase"] in ("pending", "running")
        await trigger.on_kill()  # a user marks the task failed
        return alive_after_restart

    try:
        assert asyncio.run(restart_then_kill()) is True
        deadline = time.monotonic() + 20
        while cluster.status(handle)["phase"] not in ("succeeded", "failed", "lost"):
            assert time.monotonic() < deadline, "the job survived on_kill"
            time.sleep(0.1)
        assert cluster.status(handle)["reason"] == "cancelled"
    finally:
        cluster.delete(handle)
