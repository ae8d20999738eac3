"""Driving an operator by hand, as the worker and the triggerer would: a call that must defer,
a trigger run for real up to its first event, and the two-node local training task the
end-to-end recovery tests drive."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from tests.trainer.helpers import TRAIN_KEYS, write_dataset
from trainer.contract import RunLayout, run_prefix
from trainops.operators import FSDPTrainingOperator


def deferred(call) -> TaskDeferred:
    """What ``call()`` deferred with (it must defer)."""
    with pytest.raises(TaskDeferred) as caught:
        call()
    return caught.value


def wait_until(condition, what: str, timeout: float = 240.0) -> None:
    """Poll ``condition`` every 50 ms until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.05)


def run_trigger(trigger, timeout_s: float) -> dict:
    """The trigger's first event, running it for real (as the triggerer would), within ``timeout_s``."""

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), timeout=timeout_s))


def two_local_nodes(
    file_root: str, tmp_path: Path, *, max_steps: int, run_id: str, **options: Any
) -> tuple[FSDPTrainingOperator, dict[str, Any], RunLayout]:
    """A deferrable ``FSDPTrainingOperator`` training the tiny model for ``max_steps`` on the
    local cluster, two nodes of one CPU rank each under torchrun, storage under ``file_root``
    and the dataset written under ``tmp_path``; with its task context (DAG ``retrain``, run
    ``run_id``) and its run's layout.

    :param options: the operator's other arguments (poll interval, grace, env, injected
        preemption, hang timeout).
    """
    dataset = write_dataset(tmp_path / "data" / "datasets" / "demo" / "v1")
    op = FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": dataset},
        storage_root=file_root,
        trainer_config={**TRAIN_KEYS, "train": {**TRAIN_KEYS["train"], "max_steps": max_steps}},
        nodes=2,
        cluster="local",
        deferrable=True,
        progress_every=3600,
        **options,
    )
    ctx = {"ti": SimpleNamespace(dag_id="retrain", run_id=run_id, task_id="train", map_index=-1)}
    return op, ctx, RunLayout(run_prefix(file_root, "retrain", run_id, "train"))
