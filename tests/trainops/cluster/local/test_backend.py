"""The local backend with real detached processes (plain Python nodes, no torch)."""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.trainops.cluster.local.fake_gpus import fake_nvidia_smi, gpu_listing
from trainer.contract import MetricsReader, RunLayout
from trainer.storage import open_storage
from trainops.cluster.base import FINAL_PHASES, JobAlreadyExists
from trainops.cluster.local.backend import LocalCluster
from trainops.cluster.local.pgroups import job_processes, record_group
from trainops.cluster.spec import JobSpec, JobSpecError

NODE_FAILS = (
    "import os, sys, time\nif os.environ['TRAINOPS_NODE_INDEX'] == '1': sys.exit(3)\ntime.sleep(60)\n"
)

# A stand-in for torchrun + trainer: logs steps as metrics parts (one per step, written to a
# temp name and renamed, as the trainer's storage does), or appends them to the previous
# version's metrics.jsonl; on SIGTERM it writes a marker and exits 1, as torchrun does whatever
# its workers return.
STEPPER = (
    "import json, os, signal, sys, time\n"
    "run, parts = sys.argv[1], sys.argv[2] == 'parts'\n"
    "os.makedirs(run + '/metrics', exist_ok=True)\n"
    "def stop(*_):\n"
    "    open(run + '/sigterm-' + os.environ['TRAINOPS_NODE_INDEX'], 'w').close(); sys.exit(1)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "for step in range(1, 400):\n"
    "    if os.environ['TRAINOPS_NODE_INDEX'] == '0':\n"
    "        line = json.dumps({'step': step, 'attempt': 1}) + '\\n'\n"
    "        if parts:\n"
    "            with open(run + '/metrics/.tmp', 'w') as f: f.write(line)\n"
    "            os.rename(run + '/metrics/.tmp', run + '/metrics/part-000001-%08d.jsonl' % step)\n"
    "        else:\n"
    "            with open(run + '/metrics.jsonl', 'a') as f: f.write(line)\n"
    "    time.sleep(0.05)\n"
)


def wait_final(cluster, handle, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cluster.status(handle)
        if state["phase"] in FINAL_PHASES:
            return state
        time.sleep(0.1)
    raise AssertionError(f"job still {state['phase']} after {timeout}s")


def job(name, code, nodes=1, **kw):
    return JobSpec(
        name=name, args=["python", "-c", code, *kw.pop("argv", [])], nodes=nodes, distributed=False, **kw
    )


@pytest.fixture
def cluster(tmp_path):
    return LocalCluster(tmp_path / "state")


def test_success_logs_and_labels(cluster):
    handle = cluster.launch(
        job("ok-job", "print('hello from node', flush=True)", nodes=2, labels={"trainops/run": "r1"})
    )
    state = wait_final(cluster, handle)
    assert state["phase"] == "succeeded"
    assert [n["exit_code"] for n in state["nodes"]] == [0, 0]
    assert "[node-0] hello from node" in cluster.logs_tail(handle)
    assert cluster.log_lines(handle, None) == (["hello from node"], {"offset": 16})
    job_dir = Path(handle["job_dir"])
    assert not (job_dir / "node-0" / "cache").exists()  # scratch goes, like a pod's
    assert (job_dir / "node-0.log").exists() and (job_dir / "status.json").exists()
    assert cluster.find({"trainops/run": "r1"}) == []  # finished jobs are not reattached


def test_the_state_bounds_the_node_processes_in_epoch_seconds(cluster):
    before = time.time()
    handle = cluster.launch(job("timed", "import time; time.sleep(1.0)", nodes=2))
    state = wait_final(cluster, handle)
    assert before <= state["start_time"] and state["end_time"] <= time.time()
    assert state["end_time"] - state["start_time"] >= 1.0  # the nodes' whole run, not the poll


def test_one_failed_node_tears_down_the_gang(cluster):
    started = time.monotonic()
    handle = cluster.launch(job("gang", NODE_FAILS, nodes=2, termination_grace_seconds=5))
    state = wait_final(cluster, handle)
    assert state["phase"] == "failed"
    assert state["nodes"][1]["exit_code"] == 3
    assert state["nodes"][0]["exit_code"] == -signal.SIGTERM
    assert "node 1 exited non-zero" in state["reason"]
    assert time.monotonic() - started < 20  # not the 60 s node 0 would have slept


@pytest.mark.parametrize("written_as", ["parts", "metrics.jsonl"])
def test_injected_preemption_signals_one_node_then_the_gang_stops(cluster, tmp_path, written_as):
    layout = RunLayout((tmp_path / "run").as_uri())
    handle = cluster.launch(
        job("chaos", STEPPER, nodes=2, argv=[str(tmp_path / "run"), written_as]),
        chaos={"node": 1, "at_step": 5, "attempt": 1, "metrics_uri": layout.metrics},
    )
    state = wait_final(cluster, handle)
    assert [d["node"] for d in state["disruptions"]] == [1]
    assert state["disruptions"][0]["reason"] == "SpotInterruption"
    assert state["start_time"] < state["disruptions"][0]["time"] < state["end_time"]  # the bill's bounds
    assert state["nodes"][1]["exit_code"] == 1  # the preempted node went first ...
    assert "node 1 exited non-zero" in state["reason"]  # ... and the gang was torn down
    assert (tmp_path / "run" / "sigterm-0").exists()
    steps = [r["step"] for r in MetricsReader(open_storage(layout.run_uri), layout.run_uri).records()]
    assert 5 <= max(steps) < 100  # stopped soon after step 5, not after all 399


def test_delete_cancels_and_find_reattaches(cluster):
    handle = cluster.launch(job("sleepy", "import time; time.sleep(60)", labels={"trainops/run": "r2"}))
    deadline = time.monotonic() + 10
    while cluster.status(handle)["phase"] != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [h["job_id"] for h in cluster.find({"trainops/run": "r2"})] == [handle["job_id"]]
    assert not cluster.all_gone(handle)
    cluster.delete(handle)
    state = wait_final(cluster, handle)
    assert state["phase"] == "failed" and state["reason"] == "cancelled"
    assert cluster.all_gone(handle)
    cluster.delete(handle)  # deleting a finished job signals nobody (its pid may be reused)


def test_supervisor_that_vanished_is_lost(cluster):
    handle = cluster.launch(job("doomed", "import time; time.sleep(60)"))
    deadline = time.monotonic() + 10
    while cluster.status(handle)["phase"] != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(Path(handle["job_dir"], "supervisor.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    state = wait_final(cluster, handle)
    assert state["phase"] == "lost" and "supervisor" in state["reason"]
    for node in state["nodes"]:  # clean up the orphaned node
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node["pid"], signal.SIGKILL)


# -- node 0's log, a few lines at a time (the files as the supervisor writes them) -----------
def logged(tmp_path, data: bytes, node=0):
    with open(tmp_path / f"node-{node}.log", "ab") as f:
        f.write(data)
    return {"cluster": "local", "job_id": "j", "job_dir": str(tmp_path), "labels": {}}


def test_log_lines_returns_only_new_whole_lines(cluster, tmp_path):
    handle = logged(tmp_path, b"node 1 line\n", node=1)
    assert cluster.log_lines(handle, None) == ([], None)  # node 0 has not written yet
    logged(tmp_path, b"start\nstep 1 \xff\r\nstep 2 is half")
    lines, cursor = cluster.log_lines(handle, None)
    assert lines == ["start", "step 1 \ufffd"]  # undecodable bytes replaced, CR dropped
    assert cursor == {"offset": len(b"start\nstep 1 \xff\r\n")}
    assert json.loads(json.dumps(cursor)) == cursor
    assert cluster.log_lines(handle, cursor) == ([], cursor)  # the half line waits
    logged(tmp_path, b" written\nstep 3\n")
    lines, cursor = cluster.log_lines(handle, cursor)
    assert lines == ["step 2 is half written", "step 3"]
    assert cursor == {"offset": (tmp_path / "node-0.log").stat().st_size}


def test_log_lines_caps_a_backlog_with_a_notice(cluster, tmp_path):
    handle = logged(tmp_path, b"".join(b"step %d\n" % i for i in range(1234)))
    lines, cursor = cluster.log_lines(handle, None, max_lines=5)
    assert lines == ["(… 1230 earlier lines skipped)", "step 1230", "step 1231", "step 1232", "step 1233"]
    logged(tmp_path, b"step 1234\n")
    assert cluster.log_lines(handle, cursor, max_lines=5) == (
        ["step 1234"],
        {"offset": (tmp_path / "node-0.log").stat().st_size},
    )
    assert cluster.log_lines(handle, None, max_lines=1235)[0][0] == "step 0"


def test_log_lines_fold_torchruns_traceback_even_when_it_arrives_in_pieces(cluster, tmp_path):
    from tests.trainops.cluster.test_torchrun_log import PREEMPTED_NODE_0

    data = PREEMPTED_NODE_0.encode()
    cut = data.index(b"raise ChildFailedError")
    handle = logged(tmp_path, data[:cut])
    lines, cursor = cluster.log_lines(handle, None)
    assert lines == PREEMPTED_NODE_0.splitlines()[:2]  # the traceback waits for its end
    logged(tmp_path, data[cut:] + b"after\n")
    lines, cursor = cluster.log_lines(handle, cursor)
    assert lines == [
        "torchrun: worker rank 0 exited with code 143 (SIGTERM); torchrun's traceback is left out",
        "after",
    ]
    assert cursor == {"offset": (tmp_path / "node-0.log").stat().st_size}
    assert "ChildFailedError" not in cluster.logs_tail(handle)
    assert cluster.logs_tail(handle).endswith("[node-0] after")


def test_log_lines_of_a_job_that_is_gone(cluster, tmp_path):
    handle = {"cluster": "local", "job_id": "j", "job_dir": str(tmp_path / "gone"), "labels": {}}
    assert cluster.log_lines(handle, {"offset": 42}) == ([], {"offset": 42})


def test_a_gpu_job_this_host_cannot_run_is_refused_and_leaves_nothing(cluster):
    """``CUDA_VISIBLE_DEVICES=""`` hides every GPU on any host: the trainer would train on the
    CPU without a word, so nothing is started."""
    spec = job("gpu-job", "print(1)", gpus_per_node=1, env={"CUDA_VISIBLE_DEVICES": ""})
    with pytest.raises(
        JobSpecError,
        match=r"^gpus_per_node=1 on 1 local node\(s\) needs 1 GPU\(s\) on this host, but it has none",
    ):
        cluster.launch(spec)
    assert not cluster.jobs_dir.exists()


def test_each_node_of_a_gpu_gang_sees_only_its_own_gpus(cluster, tmp_path, monkeypatch):
    """A host with 4 GPUs (a stand-in nvidia-smi on PATH, as the supervisor process finds it):
    2 nodes x 2 GPUs, each node its own pair, as each pod of a gang has its own."""
    fake_nvidia_smi(tmp_path / "bin", gpu_listing(4))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code = "import os; print('devices', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)"
    handle = cluster.launch(job("gpu-gang", code, nodes=2, gpus_per_node=2))
    assert wait_final(cluster, handle)["phase"] == "succeeded"
    assert sorted(cluster.logs_tail(handle).splitlines()) == ["[node-0] devices 0,1", "[node-1] devices 2,3"]
    with pytest.raises(
        JobSpecError, match=r"needs 6 GPU\(s\) on this host, but it has only 4 \(nvidia-smi -L lists 4\)"
    ):
        cluster.launch(job("too-big", code, nodes=3, gpus_per_node=2))


# -- one job per attempt name, and a gang whose supervisor died -----------------------------
def wait_for(condition, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def running(cluster, handle, nodes=1):
    wait_for(
        lambda: (
            cluster.status(handle)["phase"] == "running"
            and len(job_processes(Path(handle["job_dir"]))) >= nodes
        ),
        "the gang to run",
    )


def test_a_second_launch_of_the_same_attempt_reattaches_and_an_ended_one_is_moved_aside(cluster):
    spec = job("train-abc-a1", "import time; time.sleep(60)", labels={"trainops/attempt": "1"})
    handle = cluster.launch(spec)
    assert handle["job_id"] == "train-abc-a1"  # the spec's name: deterministic per attempt
    running(cluster, handle)
    with pytest.raises(
        JobAlreadyExists, match=r"local job train-abc-a1 is already there \(running"
    ) as exists:
        cluster.launch(spec)
    assert exists.value.handle == handle
    assert len(job_processes(Path(handle["job_dir"]))) == 1  # no second gang
    cluster.delete(handle)
    wait_final(cluster, handle)
    wait_for(lambda: cluster.all_gone(handle), "the gang to be gone")
    again = cluster.launch(job("train-abc-a1", "print('second', flush=True)"))
    assert wait_final(cluster, again)["phase"] == "succeeded"
    moved = cluster.jobs_dir / ".ended" / "train-abc-a1-1"
    assert (moved / "status.json").exists() and json.loads((moved / "status.json").read_text())[
        "reason"
    ] == "cancelled"
    assert cluster.find({"trainops/attempt": "1"}) == []


def test_a_dead_supervisors_nodes_and_their_children_are_killed_by_delete(cluster, tmp_path):
    """``kill -9`` of the supervisor: the nodes (and a worker each, as torchrun's) keep running
    unwatched; ``delete`` finds them by their recorded process groups and tears them down,
    SIGKILL after the grace period for a node that ignores SIGTERM."""
    code = (
        "import os, signal, subprocess, sys, time\n"
        "if os.environ['TRAINOPS_NODE_INDEX'] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "time.sleep(120)\n"
    )
    handle = cluster.launch(job("orphans", code, nodes=2, termination_grace_seconds=2))
    running(cluster, handle, nodes=4)  # two nodes, a worker each
    processes = [_started(pid) for pid in job_processes(Path(handle["job_dir"]))]
    os.kill(int(Path(handle["job_dir"], "supervisor.pid").read_text()), signal.SIGKILL)
    wait_for(lambda: cluster.status(handle)["phase"] == "lost", "the job to be lost")
    assert not cluster.all_gone(handle)  # its trainers still run
    started = time.monotonic()
    cluster.delete(handle)
    wait_for(lambda: cluster.all_gone(handle), "the orphaned gang to be killed", timeout=30)
    assert time.monotonic() - started >= 1.5  # node 1 ignored SIGTERM: SIGKILL after the grace
    assert [process for process in processes if _alive(process)] == []


def test_a_reused_process_group_id_is_never_signalled(cluster):
    """A recorded group id the kernel gave to another process since: it lacks the job's token,
    so the job is gone and that process is left alone."""
    handle = cluster.launch(job("reused", "import time; time.sleep(60)"))
    running(cluster, handle)
    os.kill(int(Path(handle["job_dir"], "supervisor.pid").read_text()), signal.SIGKILL)
    wait_for(lambda: cluster.status(handle)["phase"] == "lost", "the job to be lost")
    cluster.delete(handle)
    wait_for(lambda: cluster.all_gone(handle), "the gang to be killed")
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record_group(Path(handle["job_dir"]), 1, stranger.pid)
        assert job_processes(Path(handle["job_dir"])) == [] and cluster.all_gone(handle)
        reaper = Path(handle["job_dir"], "reaper.pid").read_text()
        cluster.delete(handle)  # nothing of the job is left: no reaper is started
        assert Path(handle["job_dir"], "reaper.pid").read_text() == reaper
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def _stat(pid):
    """``/proc/<pid>/stat``'s fields after the command name (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def _started(pid):
    """``pid`` with its start time: the process itself, not a later one given the same pid (pids
    wrap at 32768 here, and a busy suite reuses them within seconds)."""
    fields = _stat(pid)
    return (pid, fields[19] if fields else None)


def _alive(process):
    """Whether ``process`` (a pid, or ``_started``'s pair) still runs, a zombie not counted."""
    pid, started = process if isinstance(process, tuple) else (process, None)
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return False
    return started is None or fields[19] == started


# -- the nodes' temp folder: the attempt's own, gone when the attempt ends ------------------------
# A stand-in for torchrun's elastic agent: a folder in the temp dir, as the agent makes one for its
# workers' logs and error files and leaves behind (empty) on every run; then per node: exit 0,
# exit 3 (node 1, failing the gang) or wait to be stopped.
MAKES_TEMP = (
    "import os, sys, tempfile, time\n"
    "made = tempfile.mkdtemp(prefix='torchelastic_')\n"
    "open(os.path.join(made, 'error.json'), 'w').close()\n"
    "print('made', made, flush=True)\n"
    "node, end = os.environ['TRAINOPS_NODE_INDEX'], sys.argv[1]\n"
    "if end == 'exit' or (end == 'fail' and node == '1'): sys.exit(0 if end == 'exit' else 3)\n"
    "time.sleep(120)\n"
)


@pytest.mark.parametrize("end", ["succeeds", "a node fails", "cancelled", "supervisor killed -9"])
def test_an_attempt_leaves_nothing_in_the_temp_dir_however_it_ends(cluster, tmp_path, monkeypatch, end):
    """Every node's temp dir (``TMPDIR``) is a folder of its attempt, removed when the attempt
    ends: by the supervisor, or by the reaper ``delete`` starts when the supervisor is gone."""
    machine_tmp = tmp_path / "machine-tmp"  # this test's own: other processes do not write here
    machine_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(machine_tmp))
    argv = {"succeeds": "exit", "a node fails": "fail"}.get(end, "wait")
    handle = cluster.launch(
        job(f"temp-{argv}", MAKES_TEMP, nodes=2, argv=[argv], termination_grace_seconds=5)
    )
    job_dir = Path(handle["job_dir"])

    def made() -> list[Path]:
        logs = [log.read_text() for log in sorted(job_dir.glob("node-*.log"))]
        return [
            Path(line.split(" ", 1)[1])
            for text in logs
            for line in text.splitlines()
            if line.startswith("made ")
        ]

    wait_for(lambda: len(made()) == 2, "both nodes to make their temp folder")
    if end == "cancelled":
        cluster.delete(handle)
    elif end == "supervisor killed -9":
        os.kill(int((job_dir / "supervisor.pid").read_text()), signal.SIGKILL)
        wait_for(lambda: cluster.status(handle)["phase"] == "lost", "the job to be lost")
        cluster.delete(handle)
        reaper = int((job_dir / "reaper.pid").read_text())
        wait_for(lambda: not _alive(reaper), "the reaper to finish")
    wait_final(cluster, handle)
    wait_for(lambda: cluster.all_gone(handle), "the gang to be gone")
    assert [folder for folder in made() if folder.exists()] == []
    assert sorted(machine_tmp.iterdir()) == []
    assert sorted(job_dir.glob("node-*/tmp")) == []


def test_a_temp_dir_the_job_env_names_is_the_nodes(cluster, tmp_path):
    theirs = tmp_path / "their-tmp"
    theirs.mkdir()
    handle = cluster.launch(
        job("their-tmp", "import tempfile; print('tmp', tempfile.gettempdir())", env={"TMPDIR": str(theirs)})
    )
    assert wait_final(cluster, handle)["phase"] == "succeeded"
    assert f"[node-0] tmp {theirs}" in cluster.logs_tail(handle)
