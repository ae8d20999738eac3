"""The pods' disk, estimated from the model preset and the dataset's manifest."""

import pytest

from trainer.config import config_from_mapping
from trainer.presets import PRESETS, param_count
from trainops.operators.sizing import GIB, disk_options, estimate, gib

MANIFEST = {
    "token_dtype": "uint16",
    "tokenizer": {"vocab_size": 32000},
    "splits": {"train": {"tokens": 50 * GIB // 2, "shards": []}, "eval": {"tokens": 10, "shards": []}},
}


def config(**model):
    return config_from_mapping({"run_uri": "s3://b/r", "data_uri": "s3://b/d", "model": model})


def test_a_7b_run_on_8_gpus_counts_the_dataset_the_checkpoint_once_per_node_and_the_export():
    found = estimate(config(preset="7b"), MANIFEST, procs_per_node=8)
    params = param_count(PRESETS["7b"].with_vocab(32000))
    assert found is not None
    assert found.dataset_bytes == 50 * GIB  # 25 Gi tokens of 2 bytes
    assert found.checkpoint_bytes == params * 12  # fp32 weights and AdamW's two moments
    # the node's ranks share one cache: with the nodes unknown, one whole checkpoint to resume
    # from (not one per rank) and one being saved
    assert found.resume_bytes == found.save_bytes == found.checkpoint_bytes
    parts = found.dataset_bytes + found.resume_bytes + found.save_bytes + found.export_bytes
    assert found.cache_bytes == parts + int(parts * 0.25) + (1 if parts * 0.25 % 1 else 0)
    options = disk_options(found)
    assert options == {"cache_size": gib(found.cache_bytes), "ephemeral_storage": gib(found.request_bytes)}
    assert options["cache_size"] == "283Gi"  # (50 Gi + 2 x 75.3 Gi + 25.1 Gi) x 1.25, was 847Gi
    assert "this node's share of the 76Gi checkpoint on resume (76Gi)" in found.describe()


def test_on_several_nodes_each_node_holds_its_share_of_the_checkpoint():
    one = estimate(config(preset="7b"), MANIFEST, procs_per_node=8, nodes=1)
    two = estimate(config(preset="7b"), MANIFEST, procs_per_node=8, nodes=2)
    assert one is not None and two is not None
    checkpoint = one.checkpoint_bytes
    assert one.resume_bytes == one.save_bytes == checkpoint
    assert two.save_bytes == checkpoint // 2  # its 8 ranks' files of 16
    # a resume on another mesh may read two more ranks' files at the edges of its shards
    assert two.resume_bytes == checkpoint // 2 + -(-2 * checkpoint // 16)
    assert two.cache_bytes < one.cache_bytes


def test_the_vocabulary_comes_from_the_config_else_the_dataset():
    small = estimate(config(), MANIFEST, procs_per_node=1)
    bigger = estimate(config(vocab_size=128000), MANIFEST, procs_per_node=1)
    assert small is not None and bigger is not None
    assert bigger.checkpoint_bytes > small.checkpoint_bytes


def test_a_tiny_run_still_gets_the_minimum_margin():
    found = estimate(config(), {**MANIFEST, "splits": {"train": {"tokens": 1000}}}, procs_per_node=1)
    assert found is not None and found.cache_bytes >= 2 * GIB
    assert disk_options(found) == {"cache_size": "3Gi", "ephemeral_storage": "5Gi"}


def test_a_builder_model_has_no_size_here_and_is_not_sized():
    assert estimate(config(builder="mypkg.models:build"), MANIFEST, procs_per_node=8) is None
    assert disk_options(None) == {}


@pytest.mark.parametrize(("n", "quantity"), [(1, "1Gi"), (GIB, "1Gi"), (GIB + 1, "2Gi"), (10 * GIB, "10Gi")])
def test_sizes_round_up_to_whole_gib(n, quantity):
    assert gib(n) == quantity
