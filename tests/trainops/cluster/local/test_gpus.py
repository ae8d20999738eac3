"""This host's GPUs without torch: a real ``nvidia-smi`` stand-in on PATH, a driver folder laid
out as ``/proc/driver/nvidia/gpus`` is, and ``CUDA_VISIBLE_DEVICES``."""

import os

import pytest

import trainops.cluster.local.gpus as gpus
from tests.trainops.cluster.local.fake_gpus import fake_nvidia_smi, gpu_listing
from trainops.cluster.local.gpus import HostGPUs, host_gpus, node_devices, shortfall, visible_devices


@pytest.fixture
def bare_host(tmp_path, monkeypatch):
    """No nvidia-smi on PATH and no driver folder; returns the folder to put tools in."""
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setattr(gpus, "DRIVER_GPUS", tmp_path / "proc" / "driver" / "nvidia" / "gpus")
    return tools


def test_a_host_without_the_driver_has_none_and_says_why(bare_host):
    assert host_gpus({}) == HostGPUs(
        (), f"no NVIDIA driver: nvidia-smi is not on PATH and {gpus.DRIVER_GPUS} does not exist"
    )


def test_the_driver_folder_counts_one_entry_per_gpu(bare_host):
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (gpus.DRIVER_GPUS / bus).mkdir(parents=True)
    assert host_gpus({}) == HostGPUs(("0", "1"), f"{gpus.DRIVER_GPUS} lists 2")


def test_nvidia_smi_wins_and_cuda_visible_devices_narrows(bare_host):
    fake_nvidia_smi(bare_host, gpu_listing(2))
    assert host_gpus({}).devices == ("0", "1")
    narrowed = host_gpus({"CUDA_VISIBLE_DEVICES": "1"})
    assert narrowed == HostGPUs(("1",), "nvidia-smi -L lists 2; CUDA_VISIBLE_DEVICES='1' leaves 1 visible")
    assert host_gpus({"CUDA_VISIBLE_DEVICES": ""}).devices == ()


def test_a_failing_nvidia_smi_means_no_usable_gpu(bare_host):
    fake_nvidia_smi(bare_host, "", code=9)
    assert host_gpus({}).devices == ()
    assert host_gpus({}).found_by.startswith("nvidia-smi -L exited 9")


def test_visible_devices_follow_cuda():
    assert visible_devices(4, None) == ["0", "1", "2", "3"]
    assert visible_devices(4, "2,3") == ["2", "3"]
    assert visible_devices(4, "1,7,2") == ["1"]  # CUDA stops at the first that names no device
    assert visible_devices(4, "-1") == []
    assert visible_devices(2, "GPU-a,GPU-b,GPU-c") == ["GPU-a", "GPU-b"]
    assert visible_devices(0, "0") == []


def test_each_local_node_gets_its_own_gpus():
    devices = ["2", "3", "4", "5"]
    assert [node_devices(devices, node, 2) for node in range(2)] == [["2", "3"], ["4", "5"]]


def test_shortfall_counts_every_node():
    two = HostGPUs(("0", "1"), "nvidia-smi -L lists 2")
    assert shortfall(2, 1, two) is None and shortfall(1, 2, two) is None
    assert shortfall(2, 2, two) == (
        "gpus_per_node=2 on 2 local node(s) needs 4 GPU(s) on this host, but it has only 2 (nvidia-smi -L "
        "lists 2); set gpus_per_node=0 to train on the CPU, or run on cluster='kubernetes'"
    )


def test_the_real_host_is_read_without_torch():
    found = host_gpus(os.environ)
    assert isinstance(found.devices, tuple) and found.found_by
