"""The message of a wait that failed (the job is left running)."""

from trainops.operators.deadlines import waiting_failed

HANDLE = {"cluster": "kubernetes", "job_id": "train-1234abcd-a2", "labels": {}}


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
