"""Fixtures for the trainer tests: a learnable dataset on file://, a world of one, and one shared
training run."""

from __future__ import annotations

import subprocess

import pytest

from tests.trainer.helpers import INSTRUMENTED, run_config, torchrun_argv, trainer_env, write_dataset


@pytest.fixture(scope="session")
def dataset_uri(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("dataset") / "demo" / "v1")


@pytest.fixture
def world_of_one():
    """A process group of one in this process (gloo), as ``python -m trainer train`` makes without torchrun."""
    from trainer import parallel

    env = parallel.init_distributed()
    yield env
    parallel.shutdown()


@pytest.fixture(autouse=True)
def _trainer_cache(tmp_path_factory, monkeypatch):
    # Downloads and checkpoint staging stay inside the session's temp area.
    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, dataset_uri) -> dict:
    """One uninterrupted 2-rank torchrun training run, shared by the tests that need a trained model.

    It records the samples it reads (``samples`` folder, see tests/trainer/instrumented.py).
    """
    tmp = tmp_path_factory.mktemp("reference")
    config, run_uri = run_config(tmp, dataset_uri, "run")
    samples = tmp / "samples"
    samples.mkdir()
    proc = subprocess.run(
        torchrun_argv(config, module=INSTRUMENTED),
        env=trainer_env(tmp / "cache", attempt=1, samples_dir=str(samples)),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        "config": config,
        "run_uri": run_uri,
        "run_dir": tmp / "run",
        "stdout": proc.stdout,
        "samples": samples,
    }
