"""A local job's processes, found without its supervisor: what ``delete`` kills and ``all_gone``
waits for even after the supervisor was ``kill -9``ed.

The supervisor records each node's process group in ``<job_dir>/pgroups.jsonl`` the moment it
has started it (a line ``{"node": i}`` before the start, ``{"node": i, "pgid": p}`` after), and
every node's environment carries the job's launch token (``TRAINOPS_LOCAL_JOB``, from
``<job_dir>/token``, new at every launch). A process belongs to the job when it is in one of
the recorded groups *and* carries the token: a group id the kernel gave to someone else since
(pid reuse) is never signalled. A node started in the instant before its group was recorded
(a start line without its pgid) is found by the token alone, over every process of this user.
Linux reads ``/proc``; elsewhere the recorded groups are trusted as they are.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from pathlib import Path

GROUPS_FILE = "pgroups.jsonl"
TOKEN_FILE = "token"
ENV_JOB_TOKEN = "TRAINOPS_LOCAL_JOB"
PROC = Path("/proc")


def new_token(job_dir: Path) -> str:
    """Write a fresh launch token into ``job_dir`` and return it (at launch, before the
    supervisor starts)."""
    token = f"{job_dir.name}:{uuid.uuid4().hex}"
    (job_dir / TOKEN_FILE).write_text(token)
    return token


def read_token(job_dir: Path) -> str | None:
    """The job's launch token (None: a job launched before tokens existed)."""
    try:
        return (job_dir / TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _append(job_dir: Path, entry: dict[str, int]) -> None:
    """One line, flushed to disk before the caller goes on (a crash right after keeps it)."""
    with open(job_dir / GROUPS_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def record_starting(job_dir: Path, node: int) -> None:
    """Say that ``node`` is being started (its group id is not known until it is)."""
    _append(job_dir, {"node": node})


def record_group(job_dir: Path, node: int, pgid: int) -> None:
    """Record ``node``'s process group, as soon as it exists."""
    _append(job_dir, {"node": node, "pgid": pgid})


def recorded_groups(job_dir: Path) -> tuple[set[int], bool]:
    """The recorded process groups, and whether some node's start was never followed by its
    group (then the token alone must find it). A torn last line is ignored."""
    groups: set[int] = set()
    starting: set[int] = set()
    try:
        lines = (job_dir / GROUPS_FILE).read_text().splitlines()
    except FileNotFoundError:
        return groups, False
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "pgid" in entry:
            groups.add(int(entry["pgid"]))
            starting.discard(int(entry["node"]))
        else:
            starting.add(int(entry["node"]))
    return groups, bool(starting)


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, pgrp)`` of ``pid`` from ``/proc/<pid>/stat`` (None: gone)."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2])


def _carries(pid: int, token: str, *, in_group: bool) -> bool:
    """True if ``pid``'s environment holds the job's token; also, in a recorded group, when it
    reads empty: the process is exiting (its memory is gone, not yet the process), and a
    relaunch must wait for it. Unreadable (another user's): not the job's."""
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    if not environ:
        return in_group
    return f"{ENV_JOB_TOKEN}={token}".encode() in environ.split(b"\0")


def job_processes(job_dir: Path) -> list[int]:
    """The pids of the job's live processes (zombies excluded), verified as the module says."""
    groups, unrecorded = recorded_groups(job_dir)
    token = read_token(job_dir)
    if not PROC.is_dir() or token is None:
        return [g for g in groups if _group_alive(g)]
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] == "Z" or (stat[1] not in groups and not unrecorded):
            continue
        if _carries(pid, token, in_group=stat[1] in groups):
            found.append(pid)
    return sorted(found)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_job(job_dir: Path, sig: signal.Signals, *, leaders_only: bool = False) -> int:
    """Send ``sig`` to the job's processes and return how many were signalled.

    :param leaders_only: only each node's torchrun (the group leader, as the kubelet signals a
        container's PID 1), and the members whose leader is gone.
    """
    pids = job_processes(job_dir)
    groups, _ = recorded_groups(job_dir)
    if leaders_only:
        leaders = [p for p in pids if p in groups]
        led = set(leaders)
        pids = leaders + [p for p in pids if p not in groups and (_stat(p) or ("", -1))[1] not in led]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return len(pids)
