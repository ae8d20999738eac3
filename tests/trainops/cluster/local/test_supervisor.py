"""The supervisor's pure parts: what a gang of exit codes amounts to, and what each node runs."""

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from trainops.cluster.local.supervisor import Supervisor, gang_phase, main, node_argv
from trainops.cluster.spec import JobSpec

TRAIN = ["python", "-m", "trainer", "train", "--config", "file:///runs/r1/config.yaml"]


def test_gang_phase_decisions():
    assert gang_phase([None, None]) == "running"
    assert gang_phase([0, None]) == "running"  # torchrun's exit barrier: wait for the rest
    assert gang_phase([0, 0]) == "succeeded"
    assert gang_phase([None, 1]) == "teardown"
    assert gang_phase([-15, 1]) == "failed"


def test_each_node_runs_torchrun_with_this_interpreter_and_node_0_hosts_the_rendezvous():
    spec = JobSpec(name="train-a1", args=TRAIN, nodes=2, gpus_per_node=0, termination_grace_seconds=40)
    host, other = (node_argv(spec, node, port=29511, job_id="train-a1-x") for node in (0, 1))
    assert host[:3] == [sys.executable, "-m", "torch.distributed.run"]
    for argv in (host, other):
        assert "--nnodes=2" in argv and "--nproc-per-node=1" in argv
        assert "--rdzv-endpoint=127.0.0.1:29511" in argv and "--rdzv-id=train-a1-x" in argv
        assert f"--shutdown-timeout={spec.shutdown_timeout_s}" in argv
        assert argv[-5:] == TRAIN[1:]
    assert "--rdzv-conf=is_host=1" in host and "--rdzv-conf=is_host=0" in other
    assert "--max-restarts=0" in host  # the JobSpec's default: every failure ends the gang


def test_each_node_restarts_its_workers_in_place_as_often_as_the_spec_says():
    spec = JobSpec(name="train-a1", args=TRAIN, nodes=2, restarts_in_place=2)
    for node in (0, 1):
        argv = node_argv(spec, node, port=29511, job_id="train-a1-x")
        assert [a for a in argv if a.startswith("--max-restarts")] == ["--max-restarts=2"]


def test_a_plain_process_is_its_args_with_this_interpreter():
    spec = JobSpec(name="eval-a1", args=["python", "-c", "print(1)"], distributed=False)
    assert node_argv(spec, 0, port=1, job_id="eval-a1-x") == [sys.executable, "-c", "print(1)"]


def test_a_new_supervisor_reports_pending_with_its_chaos_read(tmp_path):
    spec = JobSpec(name="train-a1", args=TRAIN, nodes=2)
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    (tmp_path / "chaos.json").write_text(json.dumps({"node": 1, "at_step": 5, "metrics_uri": "file:///m"}))
    supervisor = Supervisor(tmp_path)
    assert supervisor.spec == spec and supervisor.chaos == {
        "node": 1,
        "at_step": 5,
        "metrics_uri": "file:///m",
    }
    assert (supervisor.status["job_id"], supervisor.status["phase"]) == (tmp_path.name, "pending")
    assert supervisor.status["nodes"] == [] and supervisor.status["disruptions"] == []
    supervisor.save()
    assert json.loads((tmp_path / "status.json").read_text()) == supervisor.status


def test_main_wants_exactly_the_job_dir(capsys):
    assert main([]) == 2
    assert "usage: python -m trainops.cluster.local.supervisor [--reap] JOB_DIR" in capsys.readouterr().err
    assert main(["a", "b"]) == 2


# -- a kill -9 of the supervisor, with the real trainer under torchrun (slow) -------------------
RUN_ID = "manual__2026-12-01T00:00:00+00:00"


def job_tokens(state_dir: Path) -> dict[str, set[int]]:
    """Every live process of a local job under ``state_dir`` (whoever launched it, and
    whether or not it was recorded), by its job's launch token."""
    from trainops.cluster.local.pgroups import ENV_JOB_TOKEN

    found: dict[str, set[int]] = {}
    marker = f"{ENV_JOB_TOKEN}=".encode()
    ours = f"TRAINOPS_LOCAL_STATE={state_dir}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if ours not in environ:
            continue
        for var in environ:
            if var.startswith(marker):
                found.setdefault(var[len(marker) :].decode(), set()).add(int(entry.name))
    return found


@pytest.mark.slow
def test_a_killed_supervisors_trainers_are_killed_before_the_relaunch_and_never_beside_it(
    tmp_path, monkeypatch
):
    """Two nodes of one CPU rank each under torchrun (the tiny model); once the step-10
    checkpoint is committed the supervisor is ``kill -9``ed. Its trainers keep training
    unwatched; the attempt ends ``lost`` (counted as a preemption), ``delete`` tears the
    orphaned gang down from its recorded process groups (SIGTERM: the trainers write their
    emergency checkpoint and record, well before step 80), and attempt 2 starts only once
    every process of attempt 1 is gone. A sampler reads every job's processes all along:
    never two gangs at once. The operator is driven as Airflow would, its triggers for real."""
    import asyncio
    import threading
    import time
    from types import SimpleNamespace

    from airflow.sdk.exceptions import TaskDeferred

    from tests.trainer.helpers import TRAIN_KEYS, write_dataset
    from trainer.contract import RunLayout, run_prefix
    from trainer.storage import open_storage
    from trainops.operators import FSDPTrainingOperator

    state = tmp_path / "local"
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(state))
    root = (tmp_path / "root").as_uri()
    dataset = write_dataset(tmp_path / "data" / "datasets" / "demo" / "v1")
    ctx = {"ti": SimpleNamespace(dag_id="retrain", run_id=RUN_ID, task_id="train", map_index=-1)}
    config = {**TRAIN_KEYS, "train": {**TRAIN_KEYS["train"], "max_steps": 80}}
    op = FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": dataset},
        storage_root=root,
        trainer_config=config,
        nodes=2,
        cluster="local",
        deferrable=True,
        poll_interval=0.2,
        progress_every=3600,
        termination_grace_seconds=5,
        job_options={"env": {"OMP_NUM_THREADS": "1"}},
    )
    layout = RunLayout(run_prefix(root, "retrain", RUN_ID, "train"))
    store = open_storage(root)

    def first(trigger):
        async def take():
            async for event in trigger.run():
                return event.payload

        return asyncio.run(asyncio.wait_for(take(), timeout=240))

    def deferred(call):
        with pytest.raises(TaskDeferred) as caught:
            call()
        return caught.value

    samples: list[dict[str, set[int]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(job_tokens(state))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        attempt_1 = deferred(lambda: op.execute(ctx))
        handle = attempt_1.trigger.handle
        deadline = time.monotonic() + 180
        while not (store.exists(layout.latest) and int(store.get_json(layout.latest).get("step", 0)) >= 10):
            assert time.monotonic() < deadline, "attempt 1 never committed its step-10 checkpoint"
            time.sleep(0.1)
        job_dir = Path(handle["job_dir"])
        token_1 = (job_dir / "token").read_text()
        os.kill(int((job_dir / "supervisor.pid").read_text()), signal.SIGKILL)
        ended = first(attempt_1.trigger)
        assert ended["status"] == "finished" and ended["state"]["phase"] == "lost"
        assert job_tokens(state).get(token_1), "the trainers should still run unwatched"

        gone_wait = deferred(lambda: op.execute_complete(ctx, ended))
        assert gone_wait.method_name == "relaunch_when_gone"
        gone = first(gone_wait.trigger)
        assert gone["status"] == "gone"
        assert not job_tokens(state).get(token_1)  # the orphaned trainers were killed
        attempt_2 = deferred(lambda: op.relaunch_when_gone(ctx, gone))
        assert attempt_2.trigger.handle["labels"]["trainops/attempt"] == "2"
        result = op.execute_complete(ctx, first(attempt_2.trigger))
    finally:
        stop.set()
        sampler.join(timeout=10)
    assert result["attempts"] == 2 and result["steps"] == 80
    job = store.get_json(layout.job)
    assert [a["classification"] for a in job["attempts"]] == ["preempted", "succeeded"]
    assert "supervisor process is gone" in job["attempts"][0]["reason"]
    # Attempt 1's trainers were stopped by the delete (SIGTERM: an emergency checkpoint), not
    # left to train to the end: what its ranks wrote when they were signalled.
    stopped = store.get_json(layout.attempt(1))
    assert stopped["outcome"] == "preempted" and stopped["last_step"] < 80, stopped
    together = max(len(s) for s in samples)
    both = [s for s in samples if len(s) > 1]
    assert together == 1 and not both, f"two gangs alive at once in {len(both)} of {len(samples)} samples"
    assert len({t for s in samples for t in s}) == 2  # the sampler saw both gangs, one after the other
    assert job_tokens(state) == {}  # nothing is left running
    print(
        f"\nsupervisor kill -9: {len(samples)} samples of the host's job processes, never two gangs at once"
    )


@pytest.mark.slow
def test_a_torchrun_attempt_leaves_no_torchelastic_folder_in_the_temp_dir(tmp_path, monkeypatch):
    """torchrun's elastic agent makes a ``torchelastic_*`` folder in the temp dir on every run and
    leaves it; through the local backend that temp dir is the attempt's own, removed at its end."""
    from tests.trainops.cluster.local.test_backend import wait_final
    from trainops.cluster.local.backend import LocalCluster

    machine_tmp = tmp_path / "machine-tmp"  # this test's own: other processes do not write here
    machine_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(machine_tmp))
    cluster = LocalCluster(tmp_path / "state")
    spec = JobSpec(name="presets", args=["python", "-m", "trainer", "presets"], env={"OMP_NUM_THREADS": "1"})
    handle = cluster.launch(spec)
    state = wait_final(cluster, handle, timeout=180)
    assert state["phase"] == "succeeded", cluster.logs_tail(handle)
    assert "bert-large-size" in cluster.logs_tail(handle)  # torchrun's worker ran
    assert sorted(machine_tmp.iterdir()) == []
    assert sorted(Path(handle["job_dir"]).glob("node-*/tmp")) == []
