"""The plan both engines start from: checks before any row is read, and the version."""

import pytest

from trainer.storage import open_storage
from trainops.staging.demo_data import write_demo_dataset
from trainops.staging.errors import SourceNotFound
from trainops.staging.plan import plan_stage
from trainops.staging.stage import stage_dataset


def _plan(root, source, **overrides):
    options = {
        "source_storage": open_storage(source),
        "expectations": None,
        "eval_percent": 10,
        "slice_columns": ["source"],
        "shard_tokens": 4096,
        "tokenizer": None,
        "quarantine": None,
    }
    options.update(overrides)
    return plan_stage(open_storage(root), root, source, "demo", **options)


def test_the_plan_names_the_version_staging_commits(tmp_path):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=200, files=2)["uri"]
    root = f"file://{tmp_path}/root"
    plan = _plan(root, raw)
    assert len(plan.objects) == 2 and plan.prefix == f"{root}/datasets/demo/{plan.version}"
    assert _plan(root, raw).version == plan.version  # nothing read, nothing changed
    assert _plan(root, raw, shard_tokens=8192).version != plan.version
    assert _plan(root, raw, quarantine={"max_fraction": 0.1}).quarantine == {
        "max_fraction": 0.1,
        "sample_rows": 100,
    }
    staged = stage_dataset(open_storage(root), root, raw, "demo", shard_tokens=4096)
    assert staged["version"] == plan.version and staged["manifest_uri"] == plan.manifest_uri


def test_bad_options_and_missing_sources_fail_before_anything_is_written(tmp_path):
    root = f"file://{tmp_path}/root"
    with pytest.raises(ValueError, match="eval_percent must be an integer from 1 to 50, got 0"):
        _plan(root, f"file://{tmp_path}/raw", eval_percent=0)
    with pytest.raises(SourceNotFound, match="does not exist or is an empty prefix"):
        _plan(root, f"file://{tmp_path}/raw")
    assert not (tmp_path / "root").exists()
