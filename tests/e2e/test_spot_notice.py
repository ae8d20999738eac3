"""The cloud's interruption notice, end to end: a fake metadata endpoint on 127.0.0.1 announces
an interruption 10 s before the SIGTERM would come, and the gang saves and stops before it.

- AWS (IMDSv2, ``spot/instance-action``), through the operator on the local cluster: two nodes
  of one CPU rank each under torchrun, each node's watcher polling the endpoint. Attempt 1 stops
  on the notice with every step committed, before the deadline; job.json records the notice
  and its lead; attempt 2 resumes from that step and the task succeeds.
- GCE (``instance/preempted``) and Azure (Scheduled Events ``Preempt``), through the trainer
  under torchrun: the attempt record says the notice, its lead and the save, and nothing is lost.

The SIGTERM is sent at the deadline only to what is still running: nothing should be.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from tests.e2e import driving
from tests.e2e.driving import deferred, wait_until
from tests.trainer.helpers import (
    TRAIN_KEYS,
    metrics_of,
    read_json,
    run_config,
    torchrun_argv,
    trainer_env,
    write_dataset,
)
from tests.trainer.runtime.metadata_server import MetadataServer
from trainer.contract import MetricsReader
from trainer.storage import open_storage

pytestmark = pytest.mark.slow

LEAD_S = 10.0
POLL_S = 0.2  # the watcher's interval here (2 s by default)
MAX_STEPS = 100  # attempt 1 is stopped by the notice long before (it needs under 1 s to stop)
NOTICE_AFTER_STEP = 20
RUN_ID = "manual__2026-12-06T00:00:00+00:00"
DEADLINE_S = 240.0


def notice_env(server: MetadataServer) -> dict[str, str]:
    return {
        "TRAINOPS_SPOT_NOTICE": server.shape,
        "TRAINOPS_METADATA_URL": server.url,
        "TRAINOPS_SPOT_NOTICE_EVERY_S": str(POLL_S),
    }


def check_record(record: dict, shape: str, deadline: float) -> None:
    """The attempt stopped on the notice, lost nothing, and committed before the deadline."""
    assert (record["outcome"], record["signal"]) == ("preempted", "notice"), record
    assert record["steps_lost"] == 0 and record["checkpoint_step"] == record["last_step"] > NOTICE_AFTER_STEP
    notice = record["notice"]
    assert notice["provider"] == shape
    assert notice["saved_at"] < deadline  # committed before the SIGTERM would have come
    if shape == "gce":  # no deadline announced: the documented 30 s
        assert notice["lead_s"] == 30.0
    else:  # the announced deadline has whole seconds
        assert LEAD_S - 2 <= notice["lead_s"] <= LEAD_S


def test_an_aws_notice_saves_and_stops_the_gang_before_the_sigterm_and_the_run_resumes(
    file_root, local_state, tmp_path
):
    server = MetadataServer("aws")
    op, ctx, layout = driving.two_local_nodes(
        file_root,
        tmp_path,
        max_steps=MAX_STEPS,
        run_id=RUN_ID,
        poll_interval=0.5,
        termination_grace_seconds=3,
        job_options={"env": {"OMP_NUM_THREADS": "1", **notice_env(server)}},
    )
    store = open_storage(file_root)

    def last_step() -> int:
        latest = MetricsReader(store, layout.run_uri, attempt=1).latest().get(1)
        return int(latest["step"]) if latest else 0

    try:
        first = deferred(lambda: op.execute(ctx))
        wait_until(lambda: last_step() >= NOTICE_AFTER_STEP, f"attempt 1 to pass step {NOTICE_AFTER_STEP}")
        deadline = time.time() + LEAD_S
        server.announce(deadline)
        nodes = op.backend.status(first.trigger.handle)["nodes"]
        wait_until(lambda: store.exists(layout.attempt(1)), "attempt 1's record", timeout=LEAD_S)
        time.sleep(max(0.0, deadline - time.time()))
        server.clear()  # the VM is gone; the next attempt runs elsewhere
        for node in nodes:  # the SIGTERM the notice announced, to whatever still runs
            if node.get("pid") and psutil.pid_exists(node["pid"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node["pid"], signal.SIGTERM)
        ended = driving.run_trigger(first.trigger, DEADLINE_S)
        record = store.get_json(layout.attempt(1))
        check_record(record, "aws", deadline)

        relaunch = deferred(lambda: op.execute_complete(ctx, ended))
        job = store.get_json(layout.job)
        entry = job["attempts"][0]
        assert (entry["classification"], job["preemptions"]) == ("preempted", 1)
        assert entry["record"]["notice"]["lead_s"] == record["notice"]["lead_s"]  # job.json has it
        assert "the cloud's notice (aws spot/instance-action: terminate" in entry["reason"]
        if relaunch.method_name == "relaunch_when_gone":  # the old gang's processes must be gone first
            gone = driving.run_trigger(relaunch.trigger, DEADLINE_S)
            relaunch = deferred(lambda: op.relaunch_when_gone(ctx, gone))
        assert relaunch.trigger.handle["labels"]["trainops/attempt"] == "2"
        result = op.execute_complete(ctx, driving.run_trigger(relaunch.trigger, DEADLINE_S))
        assert (result["attempts"], result["steps"]) == (2, MAX_STEPS)
        second = store.get_json(layout.attempt(2))
        assert second["resumed_from_step"] == record["last_step"]  # not one step lost
    finally:
        server.close()
    print(
        f"\nspot notice (aws): announced {LEAD_S:.0f} s ahead after step {NOTICE_AFTER_STEP}; stopped at "
        f"step {record['last_step']}, committed {record['notice']['saved_after_s']:.1f} s after the notice, "
        f"{deadline - record['notice']['saved_at']:.1f} s before the deadline; attempt 2 resumed from it"
    )


@pytest.mark.parametrize("shape", ["gce", "azure"])
def test_a_gce_or_azure_notice_saves_and_stops_the_trainer_before_the_sigterm(shape, tmp_path):
    dataset = write_dataset(tmp_path / "data")
    config, run_uri = run_config(
        tmp_path, dataset, "run", train={**TRAIN_KEYS["train"], "max_steps": MAX_STEPS, "log_every": 5}
    )
    run_dir = tmp_path / "run"
    server = MetadataServer(shape)
    proc = subprocess.Popen(
        torchrun_argv(config),
        env={**trainer_env(tmp_path / "cache", 1), **notice_env(server)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        store = open_storage(run_uri)

        def last_step() -> int:
            latest = MetricsReader(store, run_uri, attempt=1).latest().get(1)
            return int(latest["step"]) if latest else 0

        if shape == "gce":  # first a maintenance notice: an advisory, one save and training goes on
            wait_until(lambda: last_step() >= 5 or proc.poll() is not None, "step 5")
            server.advise()
        wait_until(lambda: last_step() >= NOTICE_AFTER_STEP or proc.poll() is not None, "step 20")
        deadline = time.time() + LEAD_S
        server.announce(deadline)
        try:
            out, _ = proc.communicate(timeout=LEAD_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the SIGTERM at the deadline
            out, _ = proc.communicate(timeout=60)
            pytest.fail(f"the trainer was still running at the deadline:\n{out[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        server.close()
    record = read_json(run_dir / "attempts" / "1.json")
    check_record(record, shape, deadline)
    assert f"preempted by the {shape}" in out  # rank 0 said why
    saved = sorted(step for step, m in metrics_of(run_dir).items() if "checkpoint_blocked_s" in m)
    advised = [
        int(m) for m in re.findall(r"checkpoint: step (\d+) saved now, as the cloud's notice advised", out)
    ]
    if shape == "gce":  # the advisory's one save, wherever it fell, before the interruption
        assert len(advised) == 1 and advised[0] in saved and advised[0] < record["last_step"], (
            advised,
            saved,
        )
        assert "instance/maintenance-event: TERMINATE_ON_HOST_MAINTENANCE (advisory)" in out
    else:
        assert advised == [] and all(step % 10 == 0 for step in saved), saved
