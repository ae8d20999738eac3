"""The GPUs of this host, for the local cluster, found without torch (the Airflow side never
imports it): ``nvidia-smi -L`` when it is on ``PATH``, else the NVIDIA driver's
``/proc/driver/nvidia/gpus`` (one folder per GPU), narrowed by ``CUDA_VISIBLE_DEVICES``.

A local job with ``gpus_per_node > 0`` is refused before launch when the host cannot give
every node its own GPUs: without the check, the trainer finds no CUDA device and trains on
the CPU without a word. Each node of a local gang gets its own slice of the visible devices
(``CUDA_VISIBLE_DEVICES``), as each pod of a Kubernetes gang gets its own GPUs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HostGPUs:
    """The devices a process started with some environment would see, and how that was found.

    :param devices: device ids for ``CUDA_VISIBLE_DEVICES`` (indices, or the ids it was given).
    :param found_by: how they were counted, for the message when there are too few.
    """

    devices: tuple[str, ...]
    found_by: str


def visible_devices(driver_count: int, cuda_visible: str | None) -> list[str]:
    """The device ids a CUDA process sees (pure): all ``driver_count`` GPUs, or the entries of
    ``CUDA_VISIBLE_DEVICES`` up to the first one that names no device (CUDA stops there)."""
    if cuda_visible is None:
        return [str(i) for i in range(driver_count)]
    devices = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        valid = (entry.isdigit() and int(entry) < driver_count) or entry.startswith(("GPU-", "MIG-"))
        if not valid:
            break
        devices.append(entry)
    return devices[:driver_count]


def node_devices(devices: Sequence[str], node: int, gpus_per_node: int) -> list[str]:
    """The devices of ``node`` in a local gang: its own ``gpus_per_node`` of ``devices`` (pure)."""
    return list(devices[node * gpus_per_node : (node + 1) * gpus_per_node])


def shortfall(nodes: int, gpus_per_node: int, gpus: HostGPUs) -> str | None:
    """Why this host cannot run ``nodes`` x ``gpus_per_node`` GPU processes, or None (pure)."""
    needed = nodes * gpus_per_node
    if needed <= len(gpus.devices):
        return None
    has = f"only {len(gpus.devices)}" if gpus.devices else "none"
    return (
        f"gpus_per_node={gpus_per_node} on {nodes} local node(s) needs {needed} GPU(s) on this host, "
        f"but it has {has} ({gpus.found_by}); set gpus_per_node=0 to train on the CPU, or run on "
        "cluster='kubernetes'"
    )


def host_gpus(env: Mapping[str, str] | None = None) -> HostGPUs:
    """The GPUs a process started with ``env`` (default: this one's) would see on this host."""
    env = os.environ if env is None else env
    count, found_by = _driver_gpus()
    visible = env.get("CUDA_VISIBLE_DEVICES")
    devices = visible_devices(count, visible)
    if visible is not None and len(devices) < count:
        found_by += f"; CUDA_VISIBLE_DEVICES={visible!r} leaves {len(devices)} visible"
    return HostGPUs(tuple(devices), found_by)


def _driver_gpus() -> tuple[int, str]:
    """How many GPUs the NVIDIA driver reports, and how that was found."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run(
                [smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 0, f"nvidia-smi -L failed: {exc}"
        if listed.returncode == 0:
            count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
            return count, f"nvidia-smi -L lists {count}"
        return 0, f"nvidia-smi -L exited {listed.returncode}: {listed.stderr.strip()[:200]}"
    try:
        count = sum(1 for entry in DRIVER_GPUS.iterdir() if entry.is_dir())
    except OSError:
        return 0, f"no NVIDIA driver: nvidia-smi is not on PATH and {DRIVER_GPUS} does not exist"
    return count, f"{DRIVER_GPUS} lists {count}"
