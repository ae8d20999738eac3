"""The local backend: jobs run as detached process gangs on this host (the embedded default).

Each job attempt gets a directory under ``<local_state_dir>/jobs/<job_id>/`` holding its spec,
its supervisor's ``status.json``, one log per node, the nodes' process groups and their scratch
space. The supervisor (:mod:`trainops.cluster.local.supervisor`) outlives the Airflow task that
launched it, so the operator can defer and a trigger can poll ``status.json``. It implements
:class:`~trainops.cluster.base.ClusterBackend`.

The job id is the spec's name, which the operators make deterministic per attempt, so a
second launch of the same attempt finds the first: :class:`~trainops.cluster.base.
JobAlreadyExists` while any process of it is left (the caller reattaches). A directory whose
job has ended and left no process is an old run's (a job.json that was moved aside, an
operator whose attempt numbers restart, as evaluation's do): it is moved to
``jobs/.ended/<job_id>-<n>/`` with its logs, and the job launched afresh.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import trainer
import trainops
from trainops.cluster.base import FINAL_PHASES, Chaos, JobAlreadyExists, JobHandle, LogCursor, cap_lines
from trainops.cluster.local.gpus import host_gpus, shortfall
from trainops.cluster.local.pgroups import job_processes, new_token
from trainops.cluster.local.supervisor import Status
from trainops.cluster.spec import JobSpec, JobSpecError
from trainops.cluster.torchrun_log import MAX_BLOCK_LINES, fold
from trainops.settings import local_state_dir


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (an exited child its launcher never reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


class LocalCluster:
    """Launch, watch and delete local job gangs. Handles are plain dicts (XCom/trigger safe).

    :param state_dir: where the jobs' directories go (``<state_dir>/jobs/``); default:
        ``trainops.settings.local_state_dir()``.
    """

    name = "local"

    def __init__(self, state_dir: str | os.PathLike | None = None):
        if state_dir is None:
            state_dir = local_state_dir()
        self.jobs_dir = Path(state_dir) / "jobs"

    def launch(self, spec: JobSpec, *, chaos: Chaos | None = None) -> JobHandle:
        """Start ``spec`` detached and return its handle.

        Raises JobSpecError, launching nothing, when ``spec`` asks for more GPUs than this
        host has (:mod:`trainops.cluster.local.gpus`), and JobAlreadyExists, launching nothing,
        when a job of the same name still has a process (see the module docstring).

        :param chaos: optional injected preemption, ``{"node": 1, "at_step": 40,
            "metrics_uri": ..., "attempt": 1}``: SIGTERM to that node's torchrun once the
            run's metrics for that attempt reach the step.
        """
        if spec.gpus_per_node > 0:  # else the trainer finds no CUDA device and trains on the CPU
            problem = shortfall(spec.nodes, spec.gpus_per_node, host_gpus({**os.environ, **spec.env}))
            if problem:
                raise JobSpecError(problem)
        job_id = spec.name
        job_dir = self._claim(job_id, dict(spec.labels))
        new_token(job_dir)
        (job_dir / "spec.json").write_text(json.dumps(spec.to_dict(), indent=2))
        if chaos:
            (job_dir / "chaos.json").write_text(json.dumps(chaos))
        _start_detached(job_dir, [str(job_dir)], "supervisor")
        return self._handle(job_dir, dict(spec.labels))

    def _handle(self, job_dir: Path, labels: dict[str, str]) -> JobHandle:
        return {"cluster": self.name, "job_id": job_dir.name, "job_dir": str(job_dir), "labels": labels}

    def _claim(self, job_id: str, labels: dict[str, str]) -> Path:
        """Create the job's directory, moving an ended job's aside; JobAlreadyExists when a job
        of that name still has a process (creating the directory is what makes it ours)."""
        job_dir = self.jobs_dir / job_id
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                job_dir.mkdir()
                return job_dir
            except FileExistsError:
                pass
            existing = self._handle(job_dir, labels)
            phase = self.status(existing)["phase"]
            if phase not in FINAL_PHASES or not self.all_gone(existing):
                raise JobAlreadyExists(
                    f"local job {job_id} is already there ({phase}, in {job_dir}); "
                    "an earlier launch of this attempt",
                    existing,
                )
            ended = self.jobs_dir / ".ended"
            ended.mkdir(exist_ok=True)
            n = sum(1 for d in ended.iterdir() if d.name.startswith(f"{job_id}-")) + 1
            with contextlib.suppress(FileNotFoundError):  # another launch moved it first
                os.rename(job_dir, ended / f"{job_id}-{n}")
        raise JobAlreadyExists(f"local job {job_id} was created by another launch meanwhile", existing)

    def status(self, handle: JobHandle) -> Status:
        """The job's state: ``{"phase", "reason", "nodes": [...], "disruptions": [...]}``, as
        the supervisor keeps it in ``status.json`` (with its ``job_id``, pid and times).

        ``phase`` is ``pending``, ``running``, ``succeeded``, ``failed`` or ``lost`` (the
        supervisor died without a final status, like a node that vanished with its pods).
        """
        job_dir = Path(handle["job_dir"])
        status_file = job_dir / "status.json"
        status: Status = (
            json.loads(status_file.read_text())
            if status_file.exists()
            else {
                "job_id": handle["job_id"],
                "phase": "pending",
                "reason": None,
                "nodes": [],
                "disruptions": [],
            }
        )
        if status["phase"] not in FINAL_PHASES:
            pid_file = job_dir / "supervisor.pid"
            pid = int(pid_file.read_text()) if pid_file.exists() else None
            if pid is None or not _pid_alive(pid):
                status["phase"] = "lost"
                status["reason"] = "the local supervisor process is gone (host restarted or killed)"
        return status

    def delete(self, handle: JobHandle) -> None:
        """Terminate the gang: SIGTERM to the supervisor, which tears the nodes down; when the
        supervisor is gone (``lost``, or ended with a process left over), a detached reaper
        does the same from the recorded process groups (SIGTERM, SIGKILL after the grace)."""
        job_dir = Path(handle["job_dir"])
        if self.status(handle)["phase"] not in FINAL_PHASES:
            pid_file = job_dir / "supervisor.pid"
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            return
        # A finished supervisor's pid may belong to someone else now: only the recorded,
        # token-checked processes of the job are signalled.
        if not job_processes(job_dir) or _reaper_alive(job_dir):
            return
        _start_detached(job_dir, ["--reap", str(job_dir)], "reaper")

    def all_gone(self, handle: JobHandle) -> bool:
        """True once no process of the job runs: a relaunch must not race a late commit.

        Not the pids in ``status.json`` (a torchrun's workers outlive it when it is killed,
        and a pid may be reused): the recorded process groups, token-checked
        (:mod:`trainops.cluster.local.pgroups`)."""
        if self.status(handle)["phase"] not in FINAL_PHASES:
            return False
        return not job_processes(Path(handle["job_dir"]))

    def find(self, labels: Mapping[str, str]) -> list[JobHandle]:
        """Handles of live (not finished) jobs whose labels include ``labels``."""
        found: list[JobHandle] = []
        if not self.jobs_dir.exists():
            return found
        for job_dir in sorted(self.jobs_dir.iterdir()):
            spec_file = job_dir / "spec.json"
            if not spec_file.exists():
                continue
            spec_labels = json.loads(spec_file.read_text()).get("labels", {})
            if all(spec_labels.get(k) == v for k, v in labels.items()):
                handle: JobHandle = {
                    "cluster": self.name,
                    "job_id": job_dir.name,
                    "job_dir": str(job_dir),
                    "labels": spec_labels,
                }
                if self.status(handle)["phase"] not in FINAL_PHASES:
                    found.append(handle)
        return found

    def logs_tail(self, handle: JobHandle, lines: int = 30) -> str:
        """The last ``lines`` lines of every node's log, each prefixed with its node, with
        torchrun's own traceback folded into one line (:mod:`~trainops.cluster.torchrun_log`)."""
        out = []
        for log in sorted(Path(handle["job_dir"]).glob("node-*.log")):
            with open(log, errors="replace") as f:
                tail = deque(f, maxlen=lines + MAX_BLOCK_LINES)  # a block's start, to fold it
            folded, _ = fold([line.rstrip() for line in tail])
            out += [f"[{log.stem}] {line}" for line in (folded[-lines:] if lines > 0 else [])]
        return "\n".join(out)

    def log_lines(
        self, handle: JobHandle, cursor: LogCursor | None, max_lines: int = 200
    ) -> tuple[list[str], LogCursor | None]:
        """New lines of node 0's log since ``cursor`` (None: start), and the next cursor.

        The cursor is plain JSON, ``{"offset": <bytes of node-0.log read>}``; only whole lines
        are read (a last line without a newline waits for the next call). Never raises for a
        job whose log does not exist (yet): returns ``([], cursor)``. At most ``max_lines``
        lines per call; when more were available, the first returned line says how many were
        skipped (``(… 1234 earlier lines skipped)``) and the newest follow.

        torchrun's own traceback is folded into one line (:func:`~trainops.cluster.local.
        torchrun_log.fold`); one still being written is left for the next call, so the cursor
        may stop before the last whole lines.
        """
        if max_lines < 1:
            raise ValueError(f"max_lines must be at least 1, not {max_lines}")
        offset = int((cursor or {}).get("offset") or 0)
        try:
            log = open(Path(handle["job_dir"]) / "node-0.log", "rb")  # noqa: SIM115 - "with" below
        except FileNotFoundError:
            return [], cursor
        with log:
            if offset > os.fstat(log.fileno()).st_size:
                offset = 0  # not the file the cursor was read from
            log.seek(offset)
            # the newest lines, with room for a torchrun block that folds into one line
            newest: deque[bytes] = deque(maxlen=max_lines + MAX_BLOCK_LINES)
            total = 0
            for raw in log:
                if not raw.endswith(b"\n"):
                    break
                offset, total = offset + len(raw), total + 1
                newest.append(raw)
        text = [raw.decode("utf-8", errors="replace").rstrip("\r\n") for raw in newest]
        folded, used = fold(text, final=False)
        offset -= sum(len(raw) for raw in list(newest)[used:])  # read again next time
        total -= len(newest) - used
        return cap_lines(folded[-max_lines:], max_lines, total - (used - len(folded))), {"offset": offset}


def _reaper_alive(job_dir: Path) -> bool:
    """True while a reaper started by :meth:`LocalCluster.delete` for ``job_dir`` runs."""
    try:
        return _pid_alive(int((job_dir / "reaper.pid").read_text()))
    except (FileNotFoundError, ValueError):
        return False


def _start_detached(job_dir: Path, args: list[str], role: str) -> None:
    """Start ``python -m trainops.cluster.local.supervisor ARGS`` in its own session, outliving
    this process, logging to ``<role>.log``; its pid goes to ``<role>.pid``."""
    log = open(job_dir / f"{role}.log", "ab")  # noqa: SIM115 - the child writes it; closed here once handed over
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainops.cluster.local.supervisor", *args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        env=_env_with_package_path(),
    )
    log.close()
    (job_dir / f"{role}.pid").write_text(str(proc.pid))


def _env_with_package_path() -> dict[str, str]:
    """Children must import trainops/trainer even when they come from a plugins folder."""
    paths = [
        str(Path(trainops.__file__).resolve().parents[1]),
        str(Path(trainer.__file__).resolve().parents[1]),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    )
    return env
