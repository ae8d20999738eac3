"""JobTrigger: serializes to (classpath, kwargs) and reports a finished job once."""

import asyncio
import threading
import time

from trainer.storage import open_storage
from trainops.cluster.local.backend import LocalCluster
from trainops.cluster.spec import JobSpec
from trainops.recovery import hang
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


class CountingReads:
    """The trigger's storage, counting the objects it reads."""

    def __init__(self, inner):
        self.inner, self.gets = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_with_etag(self, uri):
        self.gets.append(uri.rsplit("/", 1)[-1])
        return self.inner.get_with_etag(uri)


def test_progress_lines_read_each_new_part_of_the_attempt_once(tmp_path):
    """A long run has many parts: each poll lists them and reads only the attempt's newest one,
    and only when it is new (the trigger once re-read the whole metrics.jsonl every poll)."""
    from trainer.contract import RunLayout
    from trainer.runtime.metrics import MetricsLog

    layout = RunLayout((tmp_path / "run").as_uri())
    store = open_storage(layout.run_uri)
    older = MetricsLog(store, layout.metrics, attempt=1, flush_every=1)
    current = MetricsLog(store, layout.metrics, attempt=2, flush_every=1)
    for step in range(1, 6):
        older.add(step=step, loss=9.0, lr=0.1, tokens_per_s=0.0, time=0.0)
        current.add(step=step, loss=1.0 / step, lr=0.1, tokens_per_s=0.0, time=0.0)
    trigger = JobTrigger(
        handle={"cluster": "local", "job_id": "j", "labels": {"trainops/attempt": "2"}},
        progress_uri=layout.metrics,  # what the operator passes, and what stored triggers hold
    )
    trigger._store = reads = CountingReads(store)
    assert trigger._progress_line(layout.metrics) == "attempt 2: step 5, loss 0.2000"
    assert reads.gets == ["part-000002-00000005.jsonl"]
    assert trigger._progress_line(layout.metrics) == "attempt 2: step 5, loss 0.2000"
    current.add(step=6, loss=0.125, lr=0.1, tokens_per_s=0.0, time=0.0)
    assert trigger._progress_line(layout.metrics) == "attempt 2: step 6, loss 0.1250"
    assert reads.gets == ["part-000002-00000005.jsonl", "part-000002-00000006.jsonl"]


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
    assert "log read failed (ConnectionResetError: connection reset by peer); 1st failure" in logged


def test_progress_lines_through_a_storage_outage_are_missed_once_and_never_fail_the_wait(
    tmp_path, faulty_s3_root, s3_faults, monkeypatch, caplog, capsys
):
    """The storage blacks out until the trigger's progress read has given up once; the job runs
    until a read after the outage has succeeded. Each phase waits for the last, not for time."""
    # A progress read gives up after 0.2 s here (scaled down from 5 s).
    monkeypatch.setattr(job_trigger, "PROGRESS_OUTAGE_TOLERANCE_S", 0.2)
    progress_uri = f"{faulty_s3_root}/metrics.jsonl"
    open_storage(progress_uri).put(progress_uri, b'{"step": 7, "loss": 2.5, "attempt": 1}\n')
    cluster = LocalCluster(tmp_path)
    done = tmp_path / "done"
    handle = cluster.launch(
        JobSpec(
            name="steps",
            args=[
                "python",
                "-c",
                f"import os, time\nwhile not os.path.exists({str(done)!r}): time.sleep(0.05)",
            ],
            distributed=False,
            labels={"trainops/attempt": "1"},
        )
    )
    caplog.set_level("INFO")
    trigger = JobTrigger(
        handle=handle,
        poll_interval=0.1,
        progress_uri=progress_uri,
        progress_every=0.1,
        cluster_options={"state_dir": str(tmp_path)},
        settle_s=0,
    )
    s3_faults.blackout()

    def outage_then_recovery() -> None:
        # The trigger's own state: whether its last progress read gave up.
        try:
            wait_for(lambda: trigger._progress_failing, "the progress read to give up")
            s3_faults.end_blackout()
            wait_for(lambda: not trigger._progress_failing, "a progress read after the outage")
        finally:
            s3_faults.end_blackout()
            done.touch()

    conductor = threading.Thread(target=outage_then_recovery, daemon=True)
    conductor.start()
    event = first_event(trigger)
    conductor.join(timeout=5)
    assert event["status"] == "finished" and event["state"]["phase"] == "succeeded"
    logged = caplog.text + capsys.readouterr().out
    assert logged.count("no progress lines for now: could not read") == 1
    assert "beyond the outage tolerance of 0.2 s" in logged
    assert "progress lines resume" in logged
    assert "attempt 1: step 7, loss 2.5000" in logged


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class ApiException(Exception):
    """Shaped like kubernetes.client.ApiException: a status and a reason."""

    def __init__(self, status, reason):
        super().__init__(f"({status})\nReason: {reason}\nHTTP response headers: ...")
        self.status, self.reason = status, reason


class Weather:
    """A backend whose reads fail as a busy control plane's do (503, 429, resets) for the
    first ``fail_for_s`` seconds (or ``fail_times`` reads), then work; it counts deletions."""

    def __init__(self, *, fail_for_s=None, fail_times=None, phase_after="succeeded", gone_after=True):
        self.started = time.monotonic()
        self.fail_for_s, self.fail_times = fail_for_s, fail_times
        self.phase_after, self.gone_after = phase_after, gone_after
        self.reads = self.failures = self.deletes = 0
        self.faults = [
            ApiException(503, "Service Unavailable"),
            ApiException(429, "Too Many Requests"),
            ConnectionResetError(104, "Connection reset by peer"),
        ]

    def _weather(self):
        self.reads += 1
        failing = (self.fail_for_s is not None and time.monotonic() - self.started < self.fail_for_s) or (
            self.fail_times is not None and self.failures < self.fail_times
        )
        if failing:
            self.failures += 1
            raise self.faults[self.failures % len(self.faults)]

    def status(self, handle):
        self._weather()
        return {"phase": self.phase_after, "reason": None, "nodes": [], "disruptions": []}

    def all_gone(self, handle):
        self._weather()
        return self.gone_after

    def log_lines(self, handle, cursor, max_lines=200):
        self._weather()
        return [], cursor

    def delete(self, handle):
        self.deletes += 1


def weather(monkeypatch, backend):
    import trainops.cluster

    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: backend)
    return backend


HANDLE = {"cluster": "x", "job_id": "train-a1", "labels": {"trainops/attempt": "1"}}


def test_an_outage_shorter_than_the_tolerance_is_ridden_out_and_logged_with_a_count(
    monkeypatch, caplog, capsys
):
    # An outage of minutes, scaled down: 1.5 s of 503/429/resets against a tolerance of 5 s.
    backend = weather(monkeypatch, Weather(fail_for_s=1.5))
    caplog.set_level("INFO")
    event = first_event(
        JobTrigger(handle=HANDLE, poll_interval=0.05, api_outage_tolerance=5, stream_logs=True)
    )
    assert event["status"] == "finished" and event["state"]["phase"] == "succeeded"
    assert backend.failures >= 3 and backend.deletes == 0
    logged = caplog.text + capsys.readouterr().out
    assert "status read failed (ApiException 429 Too Many Requests); 1st failure in 0 s" in logged
    assert "2nd failure in" in logged and "riding it out up to 5 s" in logged
    assert "status read works again after" in logged


def test_reads_failing_past_the_tolerance_report_an_error_that_names_the_outage(monkeypatch):
    backend = weather(monkeypatch, Weather(fail_for_s=60))
    started = time.monotonic()
    event = first_event(JobTrigger(handle=HANDLE, poll_interval=0.05, api_outage_tolerance=1.0))
    assert event["status"] == "error"
    assert 1.0 <= time.monotonic() - started < 5
    assert (
        "status read failed for 1 s" in event["message"] and "api_outage_tolerance of 1 s" in event["message"]
    )
    assert backend.deletes == 0


def test_a_hundred_blips_never_end_the_wait(monkeypatch):
    backend = weather(monkeypatch, Weather(fail_times=100))
    monkeypatch.setattr(job_trigger, "RETRY_CAP_S", 0.001)  # a hundred back-offs in well under a second
    event = first_event(JobTrigger(handle=HANDLE, poll_interval=0.001, api_outage_tolerance=60))
    assert event["status"] == "finished" and backend.failures == 100 and backend.deletes == 0


def test_the_gone_trigger_rides_out_an_outage_too(monkeypatch):
    backend = weather(monkeypatch, Weather(fail_for_s=1.0))
    event = first_event(JobGoneTrigger(handle=HANDLE, poll_interval=0.05, settle_s=0, api_outage_tolerance=5))
    assert event["status"] == "gone" and backend.failures >= 2


def test_the_gone_trigger_reports_an_outage_past_the_tolerance_without_relaunching(monkeypatch):
    weather(monkeypatch, Weather(fail_for_s=60))
    event = first_event(
        JobGoneTrigger(handle=HANDLE, poll_interval=0.05, settle_s=0, api_outage_tolerance=0.5)
    )
    assert event["status"] == "error" and "not relaunching while the pods of train-a1" in event["message"]


def test_the_deadline_is_reported_before_it_and_carried_in_every_event(monkeypatch):
    weather(monkeypatch, Weather(phase_after="running"))
    deadline = time.time() + job_trigger.DEADLINE_MARGIN_S + 1.0
    event = first_event(JobTrigger(handle=HANDLE, poll_interval=0.05, deadline=deadline))
    assert event["status"] == "deadline" and event["deadline"] == deadline
    assert time.time() < deadline - job_trigger.DEADLINE_MARGIN_S + 1.0
    assert "execution_timeout ends at" in event["message"] and event["state"]["phase"] == "running"
    gone = first_event(JobGoneTrigger(handle=HANDLE, poll_interval=0.05, settle_s=0, deadline=deadline + 60))
    assert gone["status"] == "gone" and gone["deadline"] == deadline + 60


def test_the_deadline_is_reported_during_an_outage(monkeypatch):
    weather(monkeypatch, Weather(fail_for_s=60))
    deadline = time.time() + job_trigger.DEADLINE_MARGIN_S + 0.5
    event = first_event(
        JobTrigger(handle=HANDLE, poll_interval=0.05, api_outage_tolerance=60, deadline=deadline)
    )
    assert event["status"] == "deadline"


def heartbeat_at(path, *, step, at, steps, median=None):
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"attempt": 1, "step": step, "time": at, "steps": steps, "median_step_s": median})
    )


def test_a_heartbeat_that_stops_moving_is_reported_hung(monkeypatch, tmp_path):
    weather(monkeypatch, Weather(phase_after="running"))
    beat = tmp_path / "heartbeat" / "1.json"
    heartbeat_at(beat, step=40, at=time.time() - 2.0, steps=12, median=0.1)
    trigger = JobTrigger(
        handle=HANDLE, poll_interval=0.05, heartbeat_uri=beat.as_uri(), hang_timeout=1.0, aws_conn_id=None
    )
    event = first_event(trigger)
    assert event["status"] == "hung" and event["state"]["phase"] == "running"
    # the heartbeat is 2 s old when the watch starts: the clock runs from the first read
    assert "no new step for 1s: step 41 never finished (limit 1s: hang_timeout 1s)" in event["message"]


def test_a_derived_hang_timeout_is_logged_when_first_known_and_when_the_pace_gives_it(
    monkeypatch, tmp_path, caplog, capsys
):
    import json

    weather(monkeypatch, Weather(phase_after="running"))
    monkeypatch.setattr(hang, "HANG_FLOOR_S", 2.0)  # the floor of 30 s, shortened for the test
    beat = tmp_path / "heartbeat" / "1.json"
    beat.parent.mkdir(parents=True)
    pace = dict.fromkeys(["p99_step_s", "max_gap_s", "busy", "busy_since", "busy_ended"])
    started = {"attempt": 1, "step": 0, "time": time.time(), "steps": 0, "median_step_s": None}
    beat.write_text(json.dumps({**started, **pace, "every_s": 0.1}))
    trigger = JobTrigger(handle=HANDLE, poll_interval=0.05, heartbeat_uri=beat.as_uri(), aws_conn_id=None)
    reads = []

    def warm_then_hung(uri):  # warm-up ends at the third read, then the trainer never steps again
        reads.append(uri)
        if len(reads) == 3:
            warm = {**started, "step": 10, "steps": 10, "time": time.time(), "median_step_s": 0.02}
            beat.write_text(
                json.dumps({**warm, **pace, "p99_step_s": 0.02, "max_gap_s": 0.03, "every_s": 0.1})
            )
        return job_trigger.JobTrigger._heartbeat(trigger, uri)

    trigger._heartbeat = warm_then_hung
    caplog.set_level("INFO")
    event = first_event(trigger)
    derived = "hang_timeout 2s, derived: max(2s, 3 x heartbeat interval 0.1s"
    assert event["status"] == "hung"
    message = event["message"]
    assert f"step 11 never finished (limit 2s: {derived}, 10 x longest gap between steps 0.03s))" in message
    logged = [line for line in (caplog.text + capsys.readouterr().out).splitlines() if "hang watch:" in line]
    expected = [
        f"hang watch: limit 1802s: {derived}), no pace yet + 1800s startup allowance (the first steps)",
        f"hang watch: limit 2s: {derived}, 10 x longest gap between steps 0.03s)",
    ]
    assert len(logged) == 2, logged  # the same limit at every later poll is not logged again
    assert all(want in line for want, line in zip(expected, logged, strict=True)), logged
    assert len(reads) > 10


def test_a_moving_heartbeat_is_not_hung_and_an_unreadable_one_is_no_verdict(monkeypatch, tmp_path):
    backend = weather(monkeypatch, Weather(phase_after="running"))
    beat = tmp_path / "heartbeat" / "1.json"
    heartbeat_at(beat, step=1, at=time.time(), steps=1)
    trigger = JobTrigger(
        handle=HANDLE, poll_interval=0.05, heartbeat_uri=beat.as_uri(), hang_timeout=0.5, aws_conn_id=None
    )
    reads = []

    def flaky(uri):
        reads.append(uri)
        if len(reads) % 2:
            raise ConnectionResetError("reset")
        heartbeat_at(beat, step=len(reads), at=time.time(), steps=len(reads))  # the trainer steps on
        return job_trigger.JobTrigger._heartbeat(trigger, uri)

    trigger._heartbeat = flaky

    async def watch():
        async for event in trigger.run():
            return event.payload

    async def bounded():
        try:
            return await asyncio.wait_for(watch(), timeout=2.0)
        except TimeoutError:
            return None

    assert asyncio.run(bounded()) is None  # 2 s, 4 x the hang timeout: never hung
    assert len(reads) > 5 and backend.deletes == 0


def test_an_in_place_restart_going_back_to_its_checkpoint_step_is_watched_through_not_hung(
    monkeypatch, tmp_path, caplog, capsys
):
    """torchrun restarts the workers in the same pods: the heartbeat stops for the restart,
    then the new incarnation beats from its checkpoint step (below the last step beaten), with
    no step of its own yet. The watch rides through it to the job's end."""
    import json

    monkeypatch.setattr(hang, "HANG_FLOOR_S", 5.0)  # the floor of 30 s, shortened for the test
    beat = tmp_path / "heartbeat" / "1.json"
    beat.parent.mkdir(parents=True)
    pace = {"p99_step_s": 0.02, "max_gap_s": 0.03, "every_s": 0.05, "busy": None, "busy_since": None}
    reads = []

    def write(step, steps, **more):
        fields = {"attempt": 1, "step": step, "time": time.time(), "steps": steps, "median_step_s": 0.02}
        beat.write_text(json.dumps({**fields, **pace, "busy_ended": None, **more}))

    def trains_restarts_and_trains_on(uri):
        reads.append(uri)
        n = len(reads)
        if n <= 4:  # the first incarnation steps on, past warm-up
            write(40 + n, 40 + n)
        elif n == 10:  # 5 polls of silence (a quarter of a second: a few seconds, scaled), then the
            # new loop starts at step 40
            write(40, 0, p99_step_s=None, max_gap_s=None)
        elif n > 12:  # and steps again
            write(40 + n - 12, n - 12)
        return job_trigger.JobTrigger._heartbeat(trigger, uri)

    class EndsAfterTheRestart(Weather):
        def status(self, handle):
            return {**super().status(handle), "phase": "succeeded" if len(reads) >= 20 else "running"}

    weather(monkeypatch, EndsAfterTheRestart())
    trigger = JobTrigger(handle=HANDLE, poll_interval=0.05, heartbeat_uri=beat.as_uri(), aws_conn_id=None)
    trigger._heartbeat = trains_restarts_and_trains_on
    caplog.set_level("INFO")
    event = first_event(trigger)
    assert event["status"] == "finished" and event["state"]["phase"] == "succeeded"
    logged = [line for line in (caplog.text + capsys.readouterr().out).splitlines() if "hang watch:" in line]
    # the new incarnation's start brings the startup allowance back, its pace then the limit
    assert any("startup allowance (the first steps)" in line for line in logged), logged
    assert "10 x longest gap between steps 0.03s" in logged[-1], logged
