"""The local backend's job supervisor: one detached process per job attempt.

It plays the part Kubernetes plays for a real job: it starts one torchrun agent per "node"
(each in its own process group, with its own scratch directory and temp dir, removed when the
attempt ends), keeps ``status.json`` up to date, and enforces gang semantics: when one node
fails, the others are terminated (SIGTERM, then SIGKILL after the grace period), as a Job with
``backoffLimit: 0`` would be. It can also inject a spot preemption (SIGTERM to one node's
torchrun once the run reaches a step) for demos and tests.

Every node's process group is recorded in the job directory as it starts
(:mod:`trainops.cluster.local.pgroups`), so a job whose supervisor died can still be torn
down: ``python -m trainops.cluster.local.supervisor --reap JOB_DIR`` (:func:`reap`) does that,
as the supervisor would.

Run as ``python -m trainops.cluster.local.supervisor JOB_DIR``; see
:mod:`trainops.cluster.local.backend`.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired at run time.
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Literal, NotRequired

from trainer.contract import TORCHRUN_ENV, MetricsReader, torchrun_argv
from trainer.storage import open_storage
from trainops.cluster.base import Chaos, JobState
from trainops.cluster.local.gpus import host_gpus, node_devices
from trainops.cluster.local.pgroups import (
    ENV_JOB_TOKEN,
    job_processes,
    read_token,
    record_group,
    record_starting,
    signal_job,
)
from trainops.cluster.spec import JobSpec

POLL_S = 0.2
CHAOS_POLL_S = 0.5
SCRATCH_CACHE = "cache"  # TRAINOPS_CACHE_DIR: shard cache, checkpoint staging
SCRATCH_TMP = "tmp"  # TMPDIR

GangPhase = Literal["running", "teardown", "succeeded", "failed"]


class Status(JobState):
    """``status.json``: the attempt's state as the supervisor keeps it, plus its own fields."""

    job_id: str
    supervisor_pid: NotRequired[int]
    started_at: NotRequired[str]
    ended_at: NotRequired[str | None]


def now_iso() -> str:
    """Now, in UTC, as ISO 8601 to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def gang_phase(exit_codes: list[int | None]) -> GangPhase:
    """What a gang of nodes amounts to: ``running``, ``teardown``, ``succeeded`` or ``failed``.

    One non-zero exit fails the whole gang: the survivors cannot make progress without it.
    A zero exit while others still run is normal (torchrun's exit barrier), so we wait.
    """
    if any(code not in (None, 0) for code in exit_codes):
        return "failed" if all(code is not None for code in exit_codes) else "teardown"
    if all(code == 0 for code in exit_codes):
        return "succeeded"
    return "running"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def node_scratch(job_dir: Path, node: int) -> Path:
    """Node ``node``'s scratch space: its working directory, holding its ``cache`` (the
    trainer's node-local cache) and ``tmp`` (its temp dir)."""
    return job_dir / f"node-{node}"


def drop_scratch(job_dir: Path) -> None:
    """Remove every node's cache and temp dir, once none of the job's processes is left: a pod's
    ephemeral storage goes with the pod, so a finished attempt keeps only its logs and status."""
    for scratch in job_dir.glob("node-*"):
        if scratch.is_dir():
            for part in (SCRATCH_CACHE, SCRATCH_TMP):
                shutil.rmtree(scratch / part, ignore_errors=True)


def node_argv(spec: JobSpec, node: int, port: int, job_id: str) -> list[str]:
    """What a pod of this node would run, with this host's interpreter as ``python``: the
    same torchrun arguments (``--max-restarts`` too: a node's workers restart in place), with
    the rendezvous on this host and node 0 as its host."""
    args = [sys.executable, *spec.args[1:]]
    if not spec.distributed:
        return args
    return torchrun_argv(
        args,
        nnodes=spec.nodes,
        nproc_per_node=spec.procs_per_node,
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_id=job_id,
        shutdown_timeout_s=spec.shutdown_timeout_s,
        is_host=(node == 0),
        restarts_in_place=spec.restarts_in_place,
    )


class Supervisor:
    """One job attempt's gang: starts its nodes, watches them, tears them down together.

    :param job_dir: the attempt's directory, holding ``spec.json`` (and ``chaos.json``).
    """

    def __init__(self, job_dir: Path):
        self.dir = job_dir
        self.spec = JobSpec.from_dict(json.loads((job_dir / "spec.json").read_text()))
        chaos_file = job_dir / "chaos.json"
        self.chaos: Chaos | None = json.loads(chaos_file.read_text()) if chaos_file.exists() else None
        self.chaos_done = False
        self.procs: list[subprocess.Popen[bytes]] = []
        self.status: Status = {
            "job_id": job_dir.name,
            "phase": "pending",
            "reason": None,
            "supervisor_pid": os.getpid(),
            "nodes": [],
            "disruptions": [],
            "started_at": now_iso(),
            "ended_at": None,
        }
        self.cancelled = False
        self.teardown_at: float | None = None
        self._last_chaos_poll = 0.0
        self._chaos_metrics: MetricsReader | None = None  # kept: each poll reads only what is new

    def save(self) -> None:
        """Publish the status (atomically: the backend may read it at any time)."""
        _write_json(self.dir / "status.json", self.status)

    def start(self) -> None:
        """Start every node: one torchrun process group each, logging to ``node-<i>.log``; with
        GPUs, each node sees only its own ``gpus_per_node`` devices."""
        port = _free_port()
        torchrun = TORCHRUN_ENV if self.spec.distributed else {}
        base_env = {**os.environ, **torchrun, **self.spec.env, **self.spec.nccl_env}
        token = read_token(self.dir)
        if token is not None:  # marks the job's processes: a reused group id is not signalled
            base_env[ENV_JOB_TOKEN] = token
        gpus = self.spec.gpus_per_node
        devices = host_gpus(base_env).devices if gpus else ()
        self.status["start_time"] = time.time()  # what a pod's startTime is to a bill
        for node in range(self.spec.nodes):
            scratch = node_scratch(self.dir, node)
            for part in (SCRATCH_CACHE, SCRATCH_TMP):
                (scratch / part).mkdir(parents=True, exist_ok=True)
            env = {
                **base_env,
                "TRAINOPS_CACHE_DIR": str(scratch / SCRATCH_CACHE),
                # The node's temp dir is the attempt's, removed with it (drop_scratch): torchrun's
                # elastic agent leaves a torchelastic_* folder in tempfile.gettempdir() on every
                # run, and the workers theirs (a file store, compile caches), which in the host's
                # /tmp would pile up attempt after attempt. On Kubernetes the container's /tmp is
                # the pod's own and goes with it. A TMPDIR the job's env names is the user's.
                "TMPDIR": self.spec.env.get("TMPDIR") or str(scratch / SCRATCH_TMP),
                "TRAINOPS_NODE_INDEX": str(node),
                "PYTHONUNBUFFERED": "1",
            }
            if gpus:  # each node its own GPUs, as each pod has its own: NCCL refuses a shared one
                env["CUDA_VISIBLE_DEVICES"] = ",".join(node_devices(devices, node, gpus))
            log = open(self.dir / f"node-{node}.log", "ab")  # noqa: SIM115 - the child writes it; closed here once handed over
            record_starting(self.dir, node)
            proc = subprocess.Popen(
                node_argv(self.spec, node, port, self.dir.name),
                env=env,
                cwd=scratch,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # own process group: SIGKILL reaches its workers too
            record_group(self.dir, node, proc.pid)  # first: a kill -9 from here on leaves it findable
            log.close()
            self.procs.append(proc)
            self.status["nodes"].append(
                {"index": node, "pid": proc.pid, "exit_code": None, "log": str(self.dir / f"node-{node}.log")}
            )
        self.status["phase"] = "running"
        self.save()

    def on_cancel(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM to the supervisor (``LocalCluster.delete``): tear the gang down."""
        self.cancelled = True

    def maybe_inject(self) -> None:
        """SIGTERM to the chaos node's torchrun once the run's metrics reach the chaos step."""
        chaos = self.chaos
        if not chaos or self.chaos_done or time.monotonic() - self._last_chaos_poll < CHAOS_POLL_S:
            return
        self._last_chaos_poll = time.monotonic()
        attempt = int(chaos.get("attempt", 1))
        if self._chaos_metrics is None:
            self._chaos_metrics = MetricsReader(
                open_storage(chaos["metrics_uri"]), chaos["metrics_uri"], attempt=attempt
            )
        latest = self._chaos_metrics.latest().get(attempt)
        step = int(latest["step"]) if latest else 0
        if step < int(chaos["at_step"]):
            return
        node = int(chaos.get("node", 0))
        proc = self.procs[node]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the kubelet signals the container's PID 1 only
        self.chaos_done = True
        self.status["disruptions"].append(
            {
                "node": node,
                "reason": "SpotInterruption",
                "message": f"injected spot preemption: SIGTERM to node {node}'s torchrun at step {step}",
                "at": now_iso(),
                "time": time.time(),
            }
        )
        self.save()

    def terminate_all(self, reason: str) -> None:
        """SIGTERM to every node still running (once), recording why."""
        if self.teardown_at is None:
            self.teardown_at = time.monotonic()
            self.status["reason"] = self.status["reason"] or reason
            for proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            self.save()

    def kill_stragglers(self) -> None:
        """SIGKILL to the process groups still running a grace period after the SIGTERM."""
        grace = float(self.spec.termination_grace_seconds)
        if self.teardown_at is not None and time.monotonic() - self.teardown_at > grace:
            for proc in self.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)

    def run(self) -> int:
        """Run the gang to its end and leave its final status; the exit code is always 0."""
        signal.signal(signal.SIGTERM, self.on_cancel)
        self.start()
        phase = self.watch()
        self.status["end_time"] = time.time()  # the last node process has exited
        self.status["phase"] = "failed" if self.cancelled else phase
        self.status["ended_at"] = now_iso()
        drop_scratch(self.dir)  # every node has exited (a kill -9 of the supervisor: reap's)
        self.save()
        return 0

    def watch(self) -> Literal["succeeded", "failed"]:
        """Poll the nodes until every one has exited; on a failure or a cancel, tear the rest
        down; meanwhile inject the preemption, if any."""
        while True:
            changed = False
            for node, proc in zip(self.status["nodes"], self.procs, strict=False):
                code = proc.poll()
                if code is not None and node["exit_code"] is None:
                    node["exit_code"], changed = code, True
            phase = gang_phase([n["exit_code"] for n in self.status["nodes"]])
            if phase == "succeeded" or phase == "failed":
                return phase
            if self.cancelled:
                self.terminate_all("cancelled")
            elif phase == "teardown":
                failed = [n["index"] for n in self.status["nodes"] if n["exit_code"] not in (None, 0)]
                self.terminate_all(f"node {failed[0]} exited non-zero; terminating the gang")
            else:
                self.maybe_inject()
            self.kill_stragglers()
            if changed:
                self.save()
            time.sleep(POLL_S)


def reap(job_dir: Path, *, grace_s: float | None = None, poll_s: float = POLL_S) -> bool:
    """Tear down a job whose supervisor is gone, as the supervisor would: SIGTERM to each
    node's torchrun (and to any process of the job whose torchrun is gone), SIGKILL to what is
    left after the grace period; once none of its processes is left, remove the nodes' scratch
    (:func:`drop_scratch`) and return True.

    :param grace_s: SIGTERM-to-SIGKILL seconds (None: the spec's ``termination_grace_seconds``).
    """
    if grace_s is None:
        spec = JobSpec.from_dict(json.loads((job_dir / "spec.json").read_text()))
        grace_s = float(spec.termination_grace_seconds)
    signal_job(job_dir, signal.SIGTERM, leaders_only=True)
    deadline = time.monotonic() + grace_s
    while job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(poll_s)
    signal_job(job_dir, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while job_processes(job_dir) and time.monotonic() < deadline:
        time.sleep(poll_s)
    if job_processes(job_dir):
        return False
    drop_scratch(job_dir)  # what the dead supervisor would have removed at the end
    return True


def main(argv: list[str]) -> int:
    """``python -m trainops.cluster.local.supervisor [--reap] JOB_DIR``."""
    if len(argv) == 2 and argv[0] == "--reap":
        return 0 if reap(Path(argv[1])) else 1
    if len(argv) != 1:
        print("usage: python -m trainops.cluster.local.supervisor [--reap] JOB_DIR", file=sys.stderr)
        return 2
    return Supervisor(Path(argv[0])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
