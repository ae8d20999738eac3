"""The train split as setup opens it (``trainer.runtime.train_data``): a dataset that cannot feed
the config is refused before a shard is downloaded, shards that disagree with the manifest are
refused, and a classification dataset without labels is named."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.trainer.helpers import read_json, write_dataset
from tests.trainer.test_train import start
from trainer.config import ConfigError, load_config
from trainer.data import DataError
from trainer.runtime.train_data import task_config


def test_a_dataset_that_cannot_feed_the_config_is_refused_by_the_operators_own_rule(
    world_of_one, tmp_path, dataset_uri
):
    """``trainer.config.check_data_fit``, the check the operator runs before launch, refuses in
    the trainer too (for a job launched some other way), before a shard is downloaded."""
    cache = Path(os.environ["TRAINOPS_CACHE_DIR"]) / "shards"
    before = set(cache.iterdir()) if cache.exists() else set()
    with pytest.raises(
        ConfigError, match=r"model.vocab_size=256 is smaller than the vocabulary of the dataset's"
    ):
        start(tmp_path, dataset_uri, world_of_one, 1, "model.vocab_size=256")
    with pytest.raises(
        ConfigError, match=r"train.seq_len=1000000 needs windows of 1000001 tokens, but the train"
    ):
        start(tmp_path, dataset_uri, world_of_one, 1, "train.seq_len=1000000")
    with pytest.raises(
        ConfigError, match=r"fewer than one micro-step takes \(train.micro_batch_size=100000 x"
    ):
        start(
            tmp_path,
            dataset_uri,
            world_of_one,
            1,
            "train.micro_batch_size=100000",
            "train.global_batch_size=0",
        )
    assert (set(cache.iterdir()) if cache.exists() else set()) == before
    assert not (tmp_path / "run" / "metrics").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_shards_that_hold_other_than_the_manifest_says_are_refused(world_of_one, tmp_path):
    uri = write_dataset(tmp_path / "ds", train_records=300, eval_records=5, seed=3)
    manifest = read_json(tmp_path / "ds" / "manifest.json")
    stated = manifest["splits"]["train"]["tokens"]
    manifest["splits"]["train"]["tokens"] = stated + 1000
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        DataError, match=rf"holds {stated} tokens in its shards, but its manifest says {stated + 1000}"
    ):
        start(tmp_path, uri, world_of_one, 1)


def test_the_task_config_keeps_a_token_runs_config_and_names_a_classification_dataset_without_labels(
    tmp_path,
):
    data_uri = (tmp_path / "ds").as_uri()
    config = load_config(None, [f"run_uri={(tmp_path / 'run').as_uri()}", f"data_uri={data_uri}"])
    assert task_config(config, {"task": {"kind": "causal_lm"}}) is config
    assert task_config(config, {}) is config  # a manifest naming no task: causal_lm
    with pytest.raises(
        DataError,
        match=rf"^{re.escape(data_uri)}: the dataset was staged for classification but its manifest's ",
    ):
        task_config(config, {"task": {"kind": "classification"}})
