"""Two DAG runs whose ids differ only in characters a path cannot hold, end to end.

Airflow lets a trigger choose its run id, so ``nightly:2026-01-01`` and ``nightly_2026-01-01``
are two runs. Each trains with its own seed through FSDPTrainingOperator on the local cluster
(one node, one CPU rank under torchrun, the tiny model, 10 steps). Before run folders were
mapped injectively the second run resumed the first one's final checkpoint, trained nothing,
overwrote its ``config.yaml`` and appended to its ``job.json``: the first run's promoted model
then pointed at a config that did not produce it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.e2e import driving
from tests.e2e.driving import deferred
from tests.trainer.helpers import TRAIN_KEYS, write_dataset
from trainer.contract import RunLayout, run_prefix
from trainer.storage import open_storage
from trainops.operators import FSDPTrainingOperator

pytestmark = pytest.mark.slow

RUNS = {"nightly:2026-01-01": 1, "nightly_2026-01-01": 2}  # run id -> its seed
CONFIG = {
    **TRAIN_KEYS,
    "train": {**TRAIN_KEYS["train"], "max_steps": 10, "log_every": 5},
    "checkpoint": {"every_steps": 5, "keep": 1},
}


def train(root: str, dataset: str, run_id: str, seed: int) -> dict:
    """One run of the task, driven as Airflow drives it: execute, the trigger, execute_complete."""
    op = FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": dataset},
        storage_root=root,
        trainer_config={**CONFIG, "seed": seed},
        nodes=1,
        cluster="local",
        poll_interval=0.2,
        progress_every=3600,
        job_options={"env": {"OMP_NUM_THREADS": "1"}},
    )
    ctx = {"ti": SimpleNamespace(dag_id="nightly", run_id=run_id, task_id="train", map_index=-1)}
    first = deferred(lambda: op.execute(ctx))
    return op.execute_complete(ctx, driving.run_trigger(first.trigger, 240.0))


def test_two_run_ids_that_one_folder_used_to_hold_train_two_models(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    root = f"file://{tmp_path}/storage"
    dataset = write_dataset(tmp_path / "data" / "datasets" / "demo" / "v1")
    store = open_storage(root)
    layouts = {run_id: RunLayout(run_prefix(root, "nightly", run_id, "train")) for run_id in RUNS}
    assert len({layout.run_uri for layout in layouts.values()}) == 2

    weights = {}
    for run_id, seed in RUNS.items():
        result = train(root, dataset, run_id, seed)
        assert (result["run_uri"], result["steps"], result["attempts"]) == (layouts[run_id].run_uri, 10, 1)
        weights[run_id] = store.get(f"{layouts[run_id].export}/model.safetensors")

    for run_id, seed in RUNS.items():
        layout = layouts[run_id]
        job = store.get_json(layout.job)
        assert job["airflow"] == {"dag_id": "nightly", "run_id": run_id, "task_id": "train", "map_index": -1}
        assert len(job["attempts"]) == 1  # nobody appended to it
        assert f"seed: {seed}\n" in store.get(layout.config).decode()
        record = store.get_json(layout.attempt(1))
        assert (record["resumed_from_step"], record["last_step"]) == (None, 10)  # trained from step 0
    first, second = (weights[run_id] for run_id in RUNS)
    assert first != second  # another seed, another model
    # and the first run's export is still its own, bit for bit, after the second run
    assert store.get(f"{layouts['nightly:2026-01-01'].export}/model.safetensors") == first
