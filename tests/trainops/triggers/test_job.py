"""JobTrigger: serializes to (classpath, kwargs) and reports a finished job once."""

import asyncio
import time

from trainer.storage import open_storage
from trainops.cluster.local.backend import LocalCluster
from trainops.cluster.spec import JobSpec
from trainops.triggers import job as job_trigger
from trainops.triggers.job import JobGoneTrigger, JobTrigger


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
    event = first_event(
        JobTrigger(handle=handle, poll_interval=0.1, cluster_options={"state_dir": str(tmp_path)})
    )
    assert event["status"] == "finished"
    assert event["state"]["phase"] == "succeeded"
    assert event["handle"]["job_id"] == handle["job_id"]


def test_reports_timeout_as_event_and_leaves_the_job_alone(tmp_path):
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(
        JobSpec(name="slow", args=["python", "-c", "import time; time.sleep(30)"], distributed=False)
    )
    try:
        event = first_event(
            JobTrigger(
                handle=handle, poll_interval=0.1, timeout=0.5, cluster_options={"state_dir": str(tmp_path)}
            )
        )
        assert event["status"] == "timeout" and "still" in event["message"]
        assert cluster.status(handle)["phase"] in ("pending", "running")  # the operator decides
    finally:
        cluster.delete(handle)


def test_backend_errors_become_error_events():
    event = first_event(JobTrigger(handle={"cluster": "nowhere", "job_id": "x"}, poll_interval=0.1))
    assert event["status"] == "error" and "unknown cluster 'nowhere'" in event["message"]


def test_logs_training_progress_from_metrics(tmp_path, caplog, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"step": 7, "loss": 2.5, "tokens_per_s": 1234.0, "attempt": 1}\n'
        '{"step": 3, "loss": 9.9, "attempt": 2}\n'
    )
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(
        JobSpec(
            name="steps",
            args=["python", "-c", "import time; time.sleep(1)"],
            distributed=False,
            labels={"trainops/attempt": "1"},
        )
    )
    caplog.set_level("INFO")
    first_event(
        JobTrigger(
            handle=handle,
            poll_interval=0.1,
            progress_uri=f"file://{metrics}",
            progress_every=0.2,
            cluster_options={"state_dir": str(tmp_path)},
        )
    )
    logged = caplog.text + capsys.readouterr().out
    assert "attempt 1: step 7, loss 2.5000, 1,234 tok/s" in logged
    assert "step 3" not in logged  # another attempt's record


def test_restart_deletes_nothing_and_kill_deletes_the_job(tmp_path):
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(
        JobSpec(name="long", args=["python", "-c", "import time; time.sleep(60)"], distributed=False)
    )
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


class PodsLinger:
    """all_gone() is False for the first ``polls`` calls."""

    def __init__(self, polls):
        self.polls, self.calls = polls, 0

    def all_gone(self, handle):
        self.calls += 1
        return self.calls > self.polls


def test_gone_trigger_waits_for_the_pods_then_reports(monkeypatch):
    import trainops.cluster

    fake = PodsLinger(polls=3)
    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: fake)
    trigger = JobGoneTrigger(handle={"cluster": "x", "job_id": "train-a1"}, poll_interval=0.01)
    assert JobGoneTrigger(**trigger.serialize()[1]).serialize() == trigger.serialize()
    event = first_event(trigger)
    assert event["status"] == "gone" and fake.calls == 4


def test_gone_trigger_keeps_the_back_off(monkeypatch):
    import trainops.cluster

    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: PodsLinger(polls=0))
    begin = time.time()
    event = first_event(
        JobGoneTrigger(handle={"cluster": "x", "job_id": "j"}, poll_interval=0.01, not_before=begin + 0.3)
    )
    assert event["status"] == "gone" and time.time() >= begin + 0.3


def test_gone_trigger_gives_up_on_pods_that_never_go(monkeypatch):
    import trainops.cluster

    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: PodsLinger(polls=10**9))
    event = first_event(
        JobGoneTrigger(handle={"cluster": "x", "job_id": "train-a1"}, poll_interval=0.01, deadline_s=0.2)
    )
    assert event["status"] == "error"
    assert "train-a1 still has pods 0s after its deletion" in event["message"]
    assert "kubectl get pods -l trainops/job=train-a1" in event["message"]


def test_streams_node0_log_lines_into_the_task_log(tmp_path, caplog, capsys):
    cluster = LocalCluster(tmp_path)
    script = "import time\nfor i in range(3):\n    print(f'rank0 line {i}', flush=True); time.sleep(0.2)\n"
    handle = cluster.launch(JobSpec(name="talk", args=["python", "-c", script], distributed=False))
    caplog.set_level("INFO")
    event = first_event(
        JobTrigger(
            handle=handle, poll_interval=0.1, stream_logs=True, cluster_options={"state_dir": str(tmp_path)}
        )
    )
    logged = caplog.text + capsys.readouterr().out
    assert event["state"]["phase"] == "succeeded"
    assert [f"[node-0] rank0 line {i}" in logged for i in range(3)] == [True] * 3
    assert logged.count("[node-0] rank0 line 1") == 1  # each line once


def test_a_job_that_ends_at_once_is_reported_only_after_the_settle_time(tmp_path):
    # Airflow 3.3 fails a deferred task whose trigger fires before the scheduler has seen the
    # deferring worker exit (apache/airflow#66374): the event waits out settle_s.
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(JobSpec(name="quick", args=["python", "-c", "pass"], distributed=False))
    deferred_at = time.time()
    trigger = JobTrigger(
        handle=handle,
        poll_interval=0.1,
        started_at=deferred_at,
        settle_s=2.0,
        cluster_options={"state_dir": str(tmp_path)},
    )
    assert trigger.serialize()[1]["settle_s"] == 2.0
    event = first_event(trigger)
    assert event["status"] == "finished" and time.time() - deferred_at >= 2.0


def test_gone_is_reported_only_after_the_settle_time(tmp_path):
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(JobSpec(name="quick", args=["python", "-c", "pass"], distributed=False))
    deferred_at = time.time()
    event = first_event(
        JobGoneTrigger(
            handle=handle,
            poll_interval=0.1,
            started_at=deferred_at,
            settle_s=1.5,
            cluster_options={"state_dir": str(tmp_path)},
        )
    )
    assert event["status"] == "gone" and time.time() - deferred_at >= 1.5


def test_settle_time_defaults_to_the_trainops_setting(monkeypatch):
    handle = {"cluster": "local", "job_id": "j", "job_dir": "/tmp/j", "labels": {}}
    monkeypatch.setenv("AIRFLOW__TRAINOPS__TRIGGER_SETTLE_SECONDS", "7.5")
    assert JobTrigger(handle=handle).settle_s == 7.5
    assert JobGoneTrigger(handle=handle).settle_s == 7.5
    monkeypatch.delenv("AIRFLOW__TRAINOPS__TRIGGER_SETTLE_SECONDS")
    assert JobTrigger(handle=handle).settle_s == 20.0


def test_waiting_in_the_worker_does_not_settle(tmp_path):
    from trainops.operators.base import wait_here

    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(JobSpec(name="quick", args=["python", "-c", "pass"], distributed=False))
    started = time.time()
    event = wait_here(
        JobTrigger(
            handle=handle, poll_interval=0.1, settle_s=60.0, cluster_options={"state_dir": str(tmp_path)}
        )
    )
    assert event["status"] == "finished" and time.time() - started < 30


class LogHiccup:
    """A backend whose job is done but whose log cannot be read."""

    def status(self, handle):
        return {"phase": "succeeded", "reason": None, "nodes": [], "disruptions": []}

    def log_lines(self, handle, cursor, max_lines=200):
        raise ConnectionResetError("connection reset by peer")


def test_a_log_that_cannot_be_read_is_a_warning_not_a_failure(monkeypatch, caplog, capsys):
    import trainops.cluster

    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: LogHiccup())
    caplog.set_level("INFO")
    event = first_event(
        JobTrigger(
            handle={"cluster": "x", "job_id": "train-a1", "labels": {}}, poll_interval=0.01, stream_logs=True
        )
    )
    assert event["status"] == "finished" and event["state"]["phase"] == "succeeded"
    logged = caplog.text + capsys.readouterr().out
    assert "could not read node 0's log of train-a1: connection reset by peer" in logged


def test_progress_lines_through_a_storage_outage_are_missed_once_and_never_fail_the_wait(
    tmp_path, faulty_s3_root, s3_faults, monkeypatch, caplog, capsys
):
    # A progress read gives up after 0.2 s here (scaled down from 5 s), so the outage is short too.
    monkeypatch.setattr(job_trigger, "PROGRESS_OUTAGE_TOLERANCE_S", 0.2)
    progress_uri = f"{faulty_s3_root}/metrics.jsonl"
    open_storage(progress_uri).put(progress_uri, b'{"step": 7, "loss": 2.5, "attempt": 1}\n')
    cluster = LocalCluster(tmp_path)
    handle = cluster.launch(
        JobSpec(
            name="steps",
            args=["python", "-c", "import time; time.sleep(3)"],
            distributed=False,
            labels={"trainops/attempt": "1"},
        )
    )
    caplog.set_level("INFO")
    s3_faults.blackout(1.5)
    event = first_event(
        JobTrigger(
            handle=handle,
            poll_interval=0.1,
            progress_uri=progress_uri,
            progress_every=0.1,
            cluster_options={"state_dir": str(tmp_path)},
            settle_s=0,
        )
    )
    assert event["status"] == "finished" and event["state"]["phase"] == "succeeded"
    logged = caplog.text + capsys.readouterr().out
    assert logged.count("no progress lines for now: could not read") == 1
    assert "beyond the outage tolerance of 0.2 s" in logged
    assert "progress lines resume" in logged
    assert "attempt 1: step 7, loss 2.5000" in logged
