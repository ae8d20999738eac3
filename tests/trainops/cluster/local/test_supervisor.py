"""The supervisor's pure parts: what a gang of exit codes amounts to, and what each node runs."""

import json
import sys

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
    assert "usage: python -m trainops.cluster.local.supervisor JOB_DIR" in capsys.readouterr().err
    assert main(["a", "b"]) == 2
