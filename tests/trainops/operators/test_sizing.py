"""The pods' disk, estimated from the model preset and the dataset's manifest."""

import json

import pytest

from trainer.config import config_from_mapping
from trainer.presets import PRESETS, param_count
from trainops.cluster.spec import JobSpec
from trainops.operators.sizing import (
    DEFAULT_GPU,
    GIB,
    disk_options,
    estimate,
    fit_warnings,
    gib,
    gpu_memory,
    gpu_memory_of,
    pod_resources,
    sizing_record,
)

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
    # from (not one per rank), one being saved, and the newest committed one on the local tier
    assert found.resume_bytes == found.save_bytes == found.local_tier_bytes == found.checkpoint_bytes
    parts = (
        found.dataset_bytes
        + found.resume_bytes
        + found.save_bytes
        + found.local_tier_bytes
        + found.export_bytes
    )
    assert found.cache_bytes == parts + int(parts * 0.25) + (1 if parts * 0.25 % 1 else 0)
    options = disk_options(found)
    assert options == {"cache_size": gib(found.cache_bytes), "ephemeral_storage": gib(found.request_bytes)}
    # (50 Gi + 3 x 75.3 Gi + 25.1 Gi) x 1.25; 283Gi before the local tier, 847Gi before one cache a node
    assert options["cache_size"] == "377Gi"
    assert (
        "this node's share of the 76Gi checkpoint on resume (76Gi), while saving (76Gi) and kept on the "
        "node-local tier (76Gi)"
    ) in found.describe()


def test_on_several_nodes_each_node_holds_its_share_of_the_checkpoint():
    one = estimate(config(preset="7b"), MANIFEST, procs_per_node=8, nodes=1)
    two = estimate(config(preset="7b"), MANIFEST, procs_per_node=8, nodes=2)
    assert one is not None and two is not None
    checkpoint = one.checkpoint_bytes
    assert one.resume_bytes == one.save_bytes == checkpoint
    assert two.save_bytes == two.local_tier_bytes == checkpoint // 2  # its 8 ranks' files of 16
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


# ----------------------------------------------------------------------------- CPU, memory, shm


def train_config(preset, **train):
    return config_from_mapping(
        {"run_uri": "s3://b/r", "data_uri": "s3://b/d", "model": {"preset": preset}, "train": train}
    )


def test_a_4_by_8_gpu_1b_run_gets_cpu_memory_and_shm_for_eight_ranks_not_jobspecs_defaults():
    """The issue's case: 4 nodes x 8 GPUs of '1b' rendered pods with 1 CPU, 4Gi and 1Gi shm."""
    params = param_count(PRESETS["1b"])
    found = pod_resources(gpus_per_node=8, nodes=4, params=params)
    assert found.cpu == 24  # 3 per GPU
    assert found.shm_bytes == 16 * GIB  # 2 GiB per GPU
    assert found.process_bytes == 8 * 6 * GIB
    assert found.staging_bytes == -(-params * 12 * 8 // 32)  # this node's quarter of the checkpoint
    assert found.export_bytes == params * 4
    assert found.state_bytes == 0  # on the GPUs
    parts = found.process_bytes + found.staging_bytes + found.export_bytes
    assert found.memory_bytes == -(-parts * 5 // 4) + found.shm_bytes  # shm is charged to the pod's memory
    assert found.options() == {"cpu": "24", "memory": "85Gi", "shm_size": "16Gi"}
    assert "checkpoint staging 4Gi + export 5Gi" in found.describe()


def test_memory_follows_the_models_size_and_a_cpu_node_holds_its_training_state():
    small = pod_resources(gpus_per_node=8, nodes=1, params=param_count(PRESETS["1b"]))
    large = pod_resources(gpus_per_node=8, nodes=1, params=param_count(PRESETS["7b"]))
    assert large.memory_bytes > small.memory_bytes + 100 * GIB  # 7b's 81 Gi checkpoint staged, 27 Gi export
    cpu = pod_resources(gpus_per_node=0, nodes=2, params=param_count(PRESETS["1b"]))
    assert (cpu.cpu, cpu.shm_bytes) == (2, GIB)
    assert cpu.state_bytes == -(-param_count(PRESETS["1b"]) * 16 // 2)
    assert pod_resources(gpus_per_node=0, nodes=1, params=param_count(PRESETS["tiny"])).options() == {
        "cpu": "2",
        "memory": "4Gi",  # never below JobSpec's default
        "shm_size": "1Gi",
    }
    assert (
        pod_resources(gpus_per_node=1, nodes=1, params=None).options()["memory"] == "10Gi"
    )  # a builder model


# ----------------------------------------------------------------------------- fit


def test_7b_with_no_gpus_warns_with_its_state_and_step_time():
    (warning,) = fit_warnings(train_config("7b"), nodes=1, gpus_per_node=0)
    assert warning["check"] == "cpu-only"
    assert "model.preset '7b' (6.74B parameters) with gpus_per_node=0" in warning["message"]
    assert "101Gi of training state per node" in warning["message"]
    assert fit_warnings(train_config("1b"), nodes=1, gpus_per_node=0) == []  # slow, but it fits a node
    assert fit_warnings(train_config("7b"), nodes=1, gpus_per_node=8) == []


def test_7b_on_one_80gb_gpu_warns_with_the_bytes_per_gpu_and_the_gpus_it_needs():
    (warning,) = fit_warnings(train_config("7b"), nodes=1, gpus_per_node=1)
    assert warning["check"] == "gpu-memory"
    message = warning["message"]
    assert "an 80 GB A100 or H100 (the instance type is not known)" in message
    assert "training state 101Gi = 16 bytes/parameter over 1 GPU(s)" in message
    assert "use at least 2 GPUs of this size" in message
    assert fit_warnings(train_config("7b"), nodes=1, gpus_per_node=2) == []


def test_1b_on_one_24gb_gpu_fits_short_windows_but_not_2048_tokens_without_checkpointing():
    def warnings(**train):
        return fit_warnings(train_config("1b", **train), nodes=1, gpus_per_node=1, instance_type="g5.xlarge")

    assert warnings() == []  # 17.5 Gi: 16 bytes x 1.1B, two gathered layers, 8 x 64 tokens
    (warning,) = warnings(seq_len=2048)
    assert "g5.xlarge's A10G (24 GB)" in warning["message"]
    assert "no number of GPUs of this size holds one micro-batch's activations" in warning["message"]
    assert warnings(seq_len=2048, micro_batch_size=1, activation_checkpointing="full") == []


def test_the_instance_types_gpu_memory_decides_40gb_a100s_included():
    assert gpu_memory_of("p4de.24xlarge") == (80 * 10**9, "p4de.24xlarge's A100 (80 GB)")
    assert gpu_memory_of("p4d.24xlarge")[0] == 40 * 10**9
    assert gpu_memory_of("m5.xlarge") == gpu_memory_of(None) == (80 * 10**9, DEFAULT_GPU)
    config = train_config("7b")
    assert fit_warnings(config, nodes=1, gpus_per_node=2, instance_type="p4de.24xlarge") == []
    assert fit_warnings(config, nodes=1, gpus_per_node=2, instance_type="p4d.24xlarge") != []


def test_a_builder_model_has_no_size_to_check():
    config = config_from_mapping(
        {"run_uri": "s3://b/r", "data_uri": "s3://b/d", "model": {"builder": "mymodels.build:model"}}
    )
    assert fit_warnings(config, nodes=1, gpus_per_node=0) == []
    assert gpu_memory(config, world_size=8, instance_type=None) is None


def test_the_dry_runs_record_names_the_resources_the_gpu_and_the_warnings():
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=["python"],
        gpus_per_node=1,
        cpu="3",
        memory="40Gi",
        shm_size="2Gi",
        node_selector={"node.kubernetes.io/instance-type": "g6.xlarge"},
    )
    record = sizing_record(train_config("7b"), spec)
    assert record["resources"] == {"cpu": "3", "memory": "40Gi", "shm_size": "2Gi"}
    assert record["gpu_memory"]["gpu"] == "g6.xlarge's L4 (24 GB)"
    assert [w["check"] for w in record["warnings"]] == ["gpu-memory"]
    assert json.loads(json.dumps(record)) == record  # the dry run prints it as JSON


# A Qwen2-7B-shaped config.json: sized by its own shape, with its own vocabulary.
QWEN2_7B = {
    "model_type": "qwen2",
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
}


def test_an_hf_config_model_is_sized_by_its_own_shape_and_vocabulary():
    found = estimate(config(hf_config=QWEN2_7B), MANIFEST, procs_per_node=8)
    assert found is not None
    params = found.checkpoint_bytes // 12
    assert 7.60e9 < params < 7.62e9  # Qwen2-7B: 7.62B, its q/k/v biases (129,024) not counted
    (warning,) = fit_warnings(config(hf_config=QWEN2_7B), nodes=1, gpus_per_node=1)
    assert warning["check"] == "gpu-memory" and warning["message"].startswith(
        "model.hf_config (qwen2) (7.62B parameters) does not fit 1 x 1 GPU(s)"
    )
