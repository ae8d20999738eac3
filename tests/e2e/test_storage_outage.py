"""A storage outage during training, end to end, with real parts: FSDPTrainingOperator on the
local cluster (two nodes of one CPU rank each under torchrun, the tiny model), the run's
storage on moto's S3 server behind the fault proxy (``tests/s3_faults.py``), the dataset on
file://. The proxy blacks S3 out mid-training, once the step-10 checkpoint is committed.

Time is scaled down. The trainer's outage tolerance (``TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S``,
300 s by default) reaches the pods through the operator's ``job_options`` env: 3 s for the
outage that outlasts it (the blackout lasts until the attempt has failed, some 15 s here,
standing in for an outage of minutes), 60 s for the one it rides out (a blackout of 2 s). The
operator is driven as Airflow would drive it (``execute``, ``execute_complete``,
``relaunch_when_gone``), its triggers run for real; only the infrastructure back-off before a
relaunch (30 s) is skipped, once the blackout is over, as that back-off is there to wait for.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.e2e import driving
from tests.e2e.driving import deferred, wait_until
from tests.trainer.helpers import TRAIN_KEYS, run_config, torchrun_argv, trainer_env, write_dataset
from trainer.contract import RunLayout, attempt_record_in_log, run_prefix
from trainer.storage import open_storage
from trainops.cluster.base import FINAL_PHASES
from trainops.operators import FSDPTrainingOperator
from trainops.triggers.job import JobGoneTrigger

pytestmark = pytest.mark.slow

# The trainer tests' small run (40 steps, a checkpoint every 10), its metrics flushed every 10
# steps: each flush during a blackout waits out the tolerance on rank 0 before it gives up.
CONFIG = {**TRAIN_KEYS, "metrics": {"flush_every": 10}}
MAX_STEPS = CONFIG["train"]["max_steps"]
RUN_ID = "manual__2026-12-01T00:00:00+00:00"
DEADLINE_S = 180.0


def run_trigger(trigger) -> dict:
    return driving.run_trigger(trigger, DEADLINE_S)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """A staged dataset version on file:// (the trainer tests' learnable byte-token data)."""
    return write_dataset(tmp_path_factory.mktemp("outage-data") / "datasets" / "demo" / "v1")


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory, dataset) -> bytes:
    """``model.safetensors`` of an uninterrupted run of the same config: 2 ranks under torchrun,
    one thread each (as the pods below), on file://."""
    tmp = tmp_path_factory.mktemp("outage-reference")
    config, _ = run_config(tmp, dataset, "run", metrics=CONFIG["metrics"])
    proc = subprocess.run(
        torchrun_argv(config),
        env=trainer_env(tmp / "cache", attempt=1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (tmp / "run" / "export" / "model.safetensors").read_bytes()


def context() -> dict:
    return {"ti": SimpleNamespace(dag_id="retrain", run_id=RUN_ID, task_id="train", map_index=-1)}


def training_operator(root: str, dataset: str, tolerance_s: float) -> FSDPTrainingOperator:
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": dataset},
        storage_root=root,
        trainer_config=CONFIG,
        nodes=2,
        cluster="local",
        deferrable=True,
        poll_interval=0.2,
        progress_every=3600,  # one progress line, at the start: the task log is not under test
        termination_grace_seconds=10,
        # What the pods get: the scaled-down tolerance, and one thread per rank as the reference.
        job_options={
            "env": {"TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S": str(tolerance_s), "OMP_NUM_THREADS": "1"}
        },
    )


class Background(threading.Thread):
    """``work()`` in a thread beside the trigger; :meth:`result` raises what it raised."""

    def __init__(self, work) -> None:
        super().__init__(daemon=True)
        self.work, self.error = work, None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:
            self.error = exc

    def result(self) -> None:
        self.join(timeout=DEADLINE_S)
        assert not self.is_alive(), "the blackout controller is still running"
        if self.error is not None:
            raise self.error


def committed_step(direct, layout: RunLayout) -> int:
    """The newest committed step, read from moto directly (not through the proxy)."""
    return int(direct.get_json(layout.latest).get("step", 0)) if direct.exists(layout.latest) else 0


def node_logs(event: dict) -> str:
    """Every node's log of the attempt (rank 0 logs each retry and each recovery, rank 1 its
    retries)."""
    return "".join(p.read_text() for p in sorted(Path(event["handle"]["job_dir"]).glob("node-*.log")))


def test_an_outage_longer_than_the_tolerance_fails_the_attempt_as_infra_and_the_relaunch_ends_identical(
    faulty_s3_root, s3_faults, moto_server, local_state, dataset, reference_weights
):
    op, ctx = training_operator(faulty_s3_root, dataset, tolerance_s=3), context()
    layout = RunLayout(run_prefix(faulty_s3_root, "retrain", RUN_ID, "train"))
    direct = open_storage(faulty_s3_root, endpoint_url=moto_server)

    first = deferred(lambda: op.execute(ctx))
    handle = first.trigger.handle
    blackout: dict[str, float] = {}

    def black_out_until_the_attempt_fails() -> None:
        wait_until(lambda: committed_step(direct, layout) >= 10, "the step-10 commit")
        s3_faults.blackout()
        blackout["on"] = time.monotonic()
        try:
            wait_until(lambda: op.backend.status(handle)["phase"] in FINAL_PHASES, "attempt 1 to fail")
        finally:
            s3_faults.end_blackout()
            blackout["off"] = time.monotonic()

    controller = Background(black_out_until_the_attempt_fails)
    controller.start()
    ended = run_trigger(first.trigger)
    controller.result()
    assert ended["status"] == "finished" and ended["state"]["phase"] == "failed"
    assert blackout["off"] - blackout["on"] > 3  # longer than the pods' tolerance
    refused = s3_faults.counts()["refused"]

    # The trainer retried every request for 3 s, each retry logged, then gave up as an outage.
    log = node_logs(ended)
    assert "refused (503 SlowDown); retry 1 in" in log
    assert "beyond the outage tolerance of 3 s" in log
    assert not direct.exists(layout.attempt(1))  # storage refused even the record: it is in the log
    committed = committed_step(direct, layout)  # the commit before the blackout, intact
    assert committed >= 10

    gone_wait = deferred(lambda: op.execute_complete(ctx, ended))
    assert gone_wait.method_name == "relaunch_when_gone"
    back_off = gone_wait.trigger.not_before - time.time()
    assert 25 < back_off <= 30  # the first infrastructure back-off
    job = direct.get_json(layout.job)
    entry = job["attempts"][0]
    record = entry["record"]
    assert (entry["classification"], job["infra_failures"], job["preemptions"]) == ("infra", 1, 0)
    assert entry["reason"].startswith("the trainer failed on storage (")
    assert record == attempt_record_in_log(log, 1)  # as rank 0 printed it
    assert (record["outcome"], record["cause"], record["checkpoint_step"]) == ("failed", "storage", committed)
    assert "StorageUnavailable" in record["error"] and "beyond the outage tolerance of 3 s" in record["error"]
    assert entry["steps_lost"] == record["steps_lost"] == record["last_step"] - committed > 0
    assert "relaunch" in entry["decision"]["reason"]

    # Past the back-off (the blackout is over): the old gang is gone, the next attempt starts.
    skip_back_off = JobGoneTrigger(**{**gone_wait.trigger.serialize()[1], "not_before": None})
    gone = run_trigger(skip_back_off)
    assert gone["status"] == "gone"
    second = deferred(lambda: op.relaunch_when_gone(ctx, gone))
    assert second.trigger.handle["labels"]["trainops/attempt"] == "2"
    result = op.execute_complete(ctx, run_trigger(second.trigger))

    assert (result["attempts"], result["steps"], result["steps_lost"]) == (2, MAX_STEPS, record["steps_lost"])
    resumed = direct.get_json(layout.attempt(2))
    assert (resumed["outcome"], resumed["resumed_from_step"], resumed["last_step"]) == (
        "completed",
        committed,
        MAX_STEPS,
    )
    job = direct.get_json(layout.job)
    assert [a["classification"] for a in job["attempts"]] == ["infra", "succeeded"]
    assert direct.get(f"{layout.export}/model.safetensors") == reference_weights
    print(
        f"\noutage: blackout {blackout['off'] - blackout['on']:.1f} s against a tolerance of 3 s, "
        f"{refused} requests refused; attempt 1 lost {record['steps_lost']} steps (last step "
        f"{record['last_step']}, committed {committed}); attempt 2 resumed from {committed}, ended identical"
    )


def refused_run_requests(proxy) -> int:
    """Requests of the run's own storage the proxy refused: everything but the heartbeat, whose
    writes keep their own 2 s tolerance and may give up on a beat while training goes on."""
    from urllib.parse import unquote

    return sum(
        1 for e in list(proxy.events) if e.action == "refused" and "/heartbeat/" not in unquote(e.target)
    )


def test_an_outage_shorter_than_the_tolerance_is_ridden_out_in_one_attempt(
    faulty_s3_root, s3_faults, moto_server, local_state, dataset, reference_weights
):
    op, ctx = training_operator(faulty_s3_root, dataset, tolerance_s=60), context()
    layout = RunLayout(run_prefix(faulty_s3_root, "retrain", RUN_ID, "train"))
    direct = open_storage(faulty_s3_root, endpoint_url=moto_server)

    first = deferred(lambda: op.execute(ctx))
    blackout: dict[str, float] = {}

    def black_out_for_two_seconds() -> None:
        wait_until(lambda: committed_step(direct, layout) >= 10, "the step-10 commit")
        s3_faults.blackout()
        blackout["on"] = time.monotonic()
        try:
            # Whichever of the run's requests comes next meets it: the step-10 checkpoint's pruning
            # when it is still in flight (the step-20 save waits for it, and the metrics flush
            # after that), else the step-20 metrics flush or checkpoint. Waiting for one kind
            # only held the blackout until the other gave up, 60 s later, on a loaded machine.
            wait_until(lambda: refused_run_requests(s3_faults) >= 1, "one of the run's requests to meet it")
            wait_until(lambda: time.monotonic() - blackout["on"] >= 2.0, "two seconds of blackout")
        finally:
            s3_faults.end_blackout()
            blackout["off"] = time.monotonic()

    controller = Background(black_out_for_two_seconds)
    controller.start()
    ended = run_trigger(first.trigger)
    controller.result()
    result = op.execute_complete(ctx, ended)  # finished: no relaunch

    refused = s3_faults.counts()["refused"]
    log = node_logs(ended)
    assert "refused (503 SlowDown); retry 1 in" in log
    # The run's storage rode the blackout out within its 60 s. A heartbeat write keeps its own
    # short tolerance and may give up on one beat while training goes on: the only such line.
    assert "succeeded on retry" in log
    gave_up = [line for line in log.splitlines() if "beyond the outage tolerance" in line]
    assert all("heartbeat not written" in line for line in gave_up), gave_up
    assert (result["attempts"], result["steps"], result["steps_lost"]) == (1, MAX_STEPS, 0)
    record = direct.get_json(layout.attempt(1))
    assert (record["outcome"], record["last_step"], record.get("metrics_unwritten", 0)) == (
        "completed",
        MAX_STEPS,
        0,
    )
    job = direct.get_json(layout.job)
    assert [a["classification"] for a in job["attempts"]] == ["succeeded"] and job["infra_failures"] == 0
    assert direct.get(f"{layout.export}/model.safetensors") == reference_weights
    print(
        f"\nblip: blackout {blackout['off'] - blackout['on']:.1f} s against a tolerance of 60 s, "
        f"{refused} requests refused and retried; one attempt, 0 steps lost, weights identical"
    )
