"""The local job's processes as the recorded process groups and the launch token find them."""

import os
import subprocess
import sys
from pathlib import Path

from trainops.cluster.local.pgroups import (
    ENV_JOB_TOKEN,
    GROUPS_FILE,
    job_processes,
    new_token,
    read_token,
    record_group,
    record_starting,
    recorded_groups,
    signal_job,
)


def sleeper(token=None, *, new_group=True):
    env = {**os.environ}
    env.pop(ENV_JOB_TOKEN, None)
    if token is not None:
        env[ENV_JOB_TOKEN] = token
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=new_group
    )


def test_groups_are_read_back_and_a_start_without_its_group_is_noticed(tmp_path):
    assert recorded_groups(tmp_path) == (set(), False)
    record_starting(tmp_path, 0)
    record_group(tmp_path, 0, 1234)
    assert recorded_groups(tmp_path) == ({1234}, False)
    record_starting(tmp_path, 1)  # killed before the group was recorded
    with open(tmp_path / GROUPS_FILE, "a") as f:
        f.write('{"node": 1, "pg')  # a torn last line
    assert recorded_groups(tmp_path) == ({1234}, True)


def test_only_processes_of_recorded_groups_that_carry_the_token_are_the_jobs(tmp_path):
    token = new_token(tmp_path)
    assert read_token(tmp_path) == token and token.startswith(f"{tmp_path.name}:")
    ours, stranger, unrecorded = sleeper(token), sleeper(), sleeper(token)
    try:
        record_group(tmp_path, 0, ours.pid)
        record_group(tmp_path, 1, stranger.pid)  # a group id reused by someone else
        assert job_processes(tmp_path) == [ours.pid]  # the unrecorded one is not looked for
        record_starting(tmp_path, 2)  # a node whose group was never recorded: found by its token
        assert job_processes(tmp_path) == sorted([ours.pid, unrecorded.pid])
        assert signal_job(tmp_path, 9) == 2
        ours.wait(10)
        unrecorded.wait(10)
        assert job_processes(tmp_path) == [] and stranger.poll() is None
    finally:
        for proc in (ours, stranger, unrecorded):
            proc.kill()
            proc.wait()


def test_a_job_without_a_token_trusts_its_groups(tmp_path):
    proc = sleeper()
    try:
        record_group(tmp_path, 0, proc.pid)
        assert job_processes(Path(tmp_path)) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert job_processes(tmp_path) == []
