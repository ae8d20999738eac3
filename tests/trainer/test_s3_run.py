"""A run whose prefix is on S3 (moto's server over HTTP) while its dataset is on file://."""

import subprocess

import pytest

from tests.trainer.helpers import REPO, run_config, torchrun_argv, trainer_env
from trainer.contract import MetricsReader, RunLayout
from trainer.storage import open_storage

pytestmark = pytest.mark.slow


def test_checkpoints_metrics_records_and_export_go_to_s3(tmp_path, dataset_uri, s3_root):
    run_uri = f"{s3_root}/runs/r1"
    config, _ = run_config(tmp_path, dataset_uri, "run", run_uri=run_uri)
    proc = subprocess.run(
        torchrun_argv(config, "train.max_steps=8", "checkpoint.every_steps=4"),
        env=trainer_env(tmp_path / "cache", attempt=1),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store, layout = open_storage(run_uri), RunLayout(run_uri)
    assert store.get_json(layout.attempt(1))["outcome"] == "completed"
    for step in (4, 8):
        marker = store.get_json(f"{layout.checkpoint(step)}/_COMMITTED")
        assert (marker["attempt"], marker["dir"]) == (1, "attempt_1")
        for f in marker["files"]:  # every listed file is on S3 with its size, in the attempt's folder
            assert store.head(f"{layout.checkpoint_files(step, 1)}/{f['name']}")["size"] == f["size"]
    latest = store.get_json(layout.latest)
    assert (latest["step"], latest["attempt"], latest["fence"]) == (8, 1, [{"attempt": 1, "after_step": 0}])
    assert [r["step"] for r in MetricsReader(store, run_uri).records()] == list(range(1, 9))
    assert store.exists(f"{layout.export}/model.safetensors")
