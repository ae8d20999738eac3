"""The messages and records of a wait that ended without the job finishing."""

from trainops.operators.deadlines import deadline_failure, ended_by_deadline, waiting_failed

HANDLE = {"cluster": "kubernetes", "job_id": "train-1234abcd-a2", "labels": {}}


def job_with_attempt():
    return {
        "run_uri": "file:///r", "config_uri": "file:///r/config.yaml", "cluster": "kubernetes",
        "capacity": "spot", "preemptions": 0, "infra_failures": 0, "status": "running",
        "attempts": [{"attempt": 1, "job": HANDLE, "launched_at": "2026-01-01T00:00:00+00:00"}],
    }  # fmt: skip


def test_a_failed_wait_leaves_the_job_and_says_how_to_reattach():
    message = waiting_failed(
        {"status": "error", "handle": HANDLE, "message": "status read failed for 601 s"}, 2
    )
    assert "Job train-1234abcd-a2 was left running" in message
    assert "clear this task to reattach" in message and "status read failed for 601 s" in message
    assert "could not watch training attempt 2" in message
    assert (
        "`kubectl -n default delete jobs,pytorchjobs,trainjobs,services -l trainops/job=train-1234abcd-a2`"
        in message
    )
    local = {"cluster": "local", "job_id": "stage-1", "job_dir": "/state/jobs/stage-1", "labels": {}}
    message = waiting_failed({"status": "error", "handle": local, "message": "m"}, 1, what="staging job")
    assert message.startswith("could not watch staging job: m. Job stage-1 was left running")
    assert "`kill -TERM $(cat /state/jobs/stage-1/supervisor.pid)`" in message


def test_a_deadline_records_the_attempt_as_timeout_with_its_last_state():
    state = {"phase": "running", "reason": None, "nodes": [], "disruptions": []}
    event = {"status": "deadline", "handle": HANDLE, "state": state, "message": "execution_timeout ends at X"}
    job = ended_by_deadline(job_with_attempt(), event, at="2026-01-01T01:00:00+00:00")
    entry = job["attempts"][-1]
    assert job["status"] == "failed"
    assert entry["classification"] == "timeout" and entry["reason"] == "execution_timeout ends at X"
    assert entry["state"] == state and entry["ended_at"] == "2026-01-01T01:00:00+00:00"
    assert "stopped by its execution_timeout" in deadline_failure(event, 1)
    assert "stopped by its job_timeout" in deadline_failure({**event, "status": "timeout"}, 1)
    assert "was deleted" in deadline_failure(event, 1)
