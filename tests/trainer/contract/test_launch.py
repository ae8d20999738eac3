"""The command line a launcher builds (``trainer.contract.launch``)."""

import pytest

from trainer.contract import (
    torchrun_argv,
    trainer_argv,
)


def test_trainer_argv_is_an_argument_list_with_yaml_spelled_overrides():
    argv = trainer_argv(
        "train",
        "s3://b/runs/r/config.yaml",
        {"train.lr": 0.001, "train.compile": True, "eval.baseline_uri": None},
    )
    assert argv == [
        "python",
        "-m",
        "trainer",
        "train",
        "--config",
        "s3://b/runs/r/config.yaml",
        "train.lr=0.001",
        "train.compile=true",
        "eval.baseline_uri=null",
    ]
    assert trainer_argv("export", "file:///c.yaml", python="/venv/bin/python")[0] == "/venv/bin/python"
    with pytest.raises(
        ValueError, match=r"unknown trainer command 'fit'; expected one of \('train', 'evaluate', 'export'\)"
    ):
        trainer_argv("fit", "file:///c.yaml")


def test_torchrun_argv_wraps_the_trainer_for_a_whole_gang_relaunch():
    trainer = trainer_argv("train", "file:///c.yaml", {"train.lr": 0.1})
    argv = torchrun_argv(
        trainer, nnodes=2, nproc_per_node=8, rdzv_endpoint="head:29500", rdzv_id="r1", shutdown_timeout_s=20
    )
    assert argv == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=head:29500",
        "--rdzv-id=r1",
        "--shutdown-timeout=20",
        "--max-restarts=0",
        "-m",
        "trainer",
        "train",
        "--config",
        "file:///c.yaml",
        "train.lr=0.1",
    ]
    pinned = torchrun_argv(
        trainer, nnodes=2, nproc_per_node=1, rdzv_endpoint="h:1", rdzv_id="r", node_rank=1, is_host=False
    )
    assert pinned[pinned.index("--max-restarts=0") + 1 : pinned.index("-m", 3)] == [
        "--node-rank=1",
        "--rdzv-conf=is_host=0",
    ]
    with pytest.raises(ValueError, match=r"expected 'python -m trainer ...', got \['python', '-c', 'x'\]"):
        torchrun_argv(["python", "-c", "x"], nnodes=1, nproc_per_node=1, rdzv_endpoint="h:1", rdzv_id="r")


# --- 3. layout --------------------------------------------------------------------------------
