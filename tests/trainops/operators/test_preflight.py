"""What an attempt needs that only the running task can see: the dataset version in storage
(file:// and moto's S3 over HTTP), the config against it, the builder, this host's GPUs."""

import pytest

from tests.trainops.operators.helpers import staged_dataset
from trainer.config import ConfigError, config_from_mapping
from trainer.storage import open_storage
from trainops.operators.preflight import (
    check_builder,
    check_fit,
    check_gpus,
    dataset_manifest,
    missing_dataset,
)


@pytest.fixture(params=["file", "s3"])
def data_root(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path}/data"
    return request.getfixturevalue("s3_root").replace("/root", "/data")


def test_a_staged_version_gives_its_manifest(data_root):
    uri = staged_dataset(f"{data_root}/datasets/demo/v1", train_tokens=4096)
    manifest = dataset_manifest(open_storage(uri), uri)
    assert manifest["splits"]["train"]["tokens"] == 4096 and manifest["tokenizer"]["vocab_size"] == 257


def test_what_is_there_instead_of_a_version_is_said(data_root):
    storage = open_storage(data_root)
    with pytest.raises(ValueError, match=f"dataset '{data_root}/nothing' does not exist"):
        dataset_manifest(storage, f"{data_root}/nothing")
    storage.put_json(f"{data_root}/datasets/demo/bad/validation.json", {"success": False})
    with pytest.raises(ValueError, match=r"holds 1 object\(s\) .* but no manifest.json"):
        dataset_manifest(storage, f"{data_root}/datasets/demo/bad")
    staged_dataset(f"{data_root}/datasets/demo/v1")
    with pytest.raises(ValueError, match=r"is not one dataset version but holds 1 of them"):
        dataset_manifest(storage, f"{data_root}/datasets/demo")
    storage.put_json(f"{data_root}/datasets/demo/v2/manifest.json", {"format": "something/v9"})
    with pytest.raises(
        ValueError, match=r"v2/manifest.json is not a trainops.dataset/v1 manifest: point dataset at"
    ):
        dataset_manifest(storage, f"{data_root}/datasets/demo/v2")
    assert storage.list(f"{data_root}/nothing") == []  # looking writes nothing


def test_the_missing_dataset_message_names_a_version_it_holds():
    stored = [f"file:///d/demo/{v}/{f}" for v in ("a1", "b2") for f in ("manifest.json", "train/s0.bin")]
    assert missing_dataset("file:///d/demo", stored) == (
        "dataset 'file:///d/demo' is not one dataset version but holds 2 of them, such as 'file:///d/demo/b2': "
        "point dataset at one version folder"
    )


def config(**train):
    return config_from_mapping({"run_uri": "file:///r", "data_uri": "file:///d/v1", "train": train})


def test_the_config_is_checked_against_the_manifest_numbers():
    manifest = {"splits": {"train": {"tokens": 1000}}, "tokenizer": {"vocab_size": 257}}
    check_fit(config(seq_len=64, micro_batch_size=2), manifest, world_size=2)  # 15 samples, 4 a micro-step
    with pytest.raises(ConfigError, match=r"15 samples of train.seq_len=64, fewer than one micro-step takes"):
        check_fit(config(seq_len=64, micro_batch_size=8), manifest, world_size=2)
    with pytest.raises(
        ValueError,
        match=r"manifest of dataset 'file:///d/v1' lacks splits.train.tokens or tokenizer.vocab_size: re-stage",
    ):
        check_fit(config(), {"splits": {}}, world_size=1)


def test_a_dataset_staged_for_another_task_or_too_few_records_is_refused_before_launch():
    sft = {
        "task": {"kind": "sft"},
        "splits": {"train": {"tokens": 5000, "records": {"path": "train/records.bin", "count": 6}}},
        "tokenizer": {"vocab_size": 257},
    }
    with pytest.raises(ValueError, match=r"task.kind='causal_lm', but dataset .* was staged for task 'sft'"):
        check_fit(config(), sft, world_size=1)
    sft_config = config_from_mapping(
        {
            "run_uri": "file:///r",
            "data_uri": "file:///d",
            "task": {"kind": "sft"},
            "train": {"micro_batch_size": 4},
        }
    )
    check_fit(sft_config, sft, world_size=1)  # 6 records feed micro-steps of 4
    with pytest.raises(ValueError, match=r"has 6 records, fewer than one micro-step takes"):
        check_fit(sft_config, sft, world_size=2)
    with pytest.raises(ValueError, match=r"staged for task 'translation', which this trainer does not know"):
        check_fit(config(), {**sft, "task": {"kind": "translation"}}, world_size=1)


def test_a_classifier_whose_labels_are_not_the_datasets_is_refused_before_launch():
    labelled = {
        "task": {"kind": "classification", "labels": ["ham", "spam"]},
        "splits": {"train": {"tokens": 5000, "records": {"path": "train/records.bin", "count": 6}}},
        "tokenizer": {"vocab_size": 257},
    }
    bert = {
        "model_type": "bert",
        "vocab_size": 300,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
    }

    def classifier(**hf_config):
        return config_from_mapping(
            {
                "run_uri": "file:///r",
                "data_uri": "file:///d",
                "task": {"kind": "classification"},
                "model": {"hf_config": {**bert, **hf_config}},
                "train": {"micro_batch_size": 2},
            }
        )

    check_fit(classifier(), labelled, world_size=1)
    check_fit(classifier(id2label={"0": "ham", "1": "spam"}), labelled, world_size=1)
    with pytest.raises(
        ValueError, match=r"id2label \['spam', 'ham'\] is not the dataset's label set \['ham', 'spam'\]"
    ):
        check_fit(classifier(id2label={"0": "spam", "1": "ham"}), labelled, world_size=1)
    with pytest.raises(ValueError, match=r"num_labels 3 is not the dataset's 2 labels"):
        check_fit(classifier(num_labels=3), labelled, world_size=1)
    unlabelled = {**labelled, "task": {"kind": "classification"}}
    with pytest.raises(
        ValueError, match=r"task.labels is None, not a list of two or more distinct label names"
    ):
        check_fit(classifier(), unlabelled, world_size=1)


def test_builders_and_gpus_are_left_alone_where_this_host_cannot_tell():
    check_builder(None, "local", env={})
    check_builder("image_only_model:build", "kubernetes", env={})  # not here: in the image
    check_gpus("kubernetes", nodes=4, gpus_per_node=8, env={})  # the cluster's nodes, not this host
    check_gpus("local", nodes=4, gpus_per_node=0, env={})
    with pytest.raises(ValueError, match=r"gpus_per_node=8 on 4 local node\(s\) needs 32 GPU\(s\)"):
        check_gpus("local", nodes=4, gpus_per_node=8, env={"CUDA_VISIBLE_DEVICES": ""})


def test_the_local_cluster_looks_for_a_builder_with_the_jobs_own_environment(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "job_model.py").write_text("def build(vocab_size, seq_len): ...\n")
    with pytest.raises(ValueError, match="no module 'job_model' on the local cluster's Python path"):
        check_builder("job_model:build", "local", env={})
    check_builder("job_model:build", "local", env={"PYTHONPATH": str(tmp_path / "models")})
