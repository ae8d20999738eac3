"""Warm start (``init.from``): a Hugging Face Llama folder loaded into the sharded model, each rank
its own rows; weights only; a committed checkpoint wins, so a preempted warm-started run
resumes bitwise."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from tests.trainer.helpers import (
    INSTRUMENTED,
    metrics_of,
    read_json,
    run_config,
    torchrun_argv,
    trainer_env,
)
from tests.trainer.test_train import start
from trainer.checkpoint import warm_start
from trainer.config import ConfigError
from trainer.export import hf
from trainer.models.builder import build_preset
from trainer.presets import PRESETS
from trainer.storage import open_storage


def write_hf_folder(folder: Path, *, preset: str = "tiny", vocab: int = 257, seed: int = 11, shards: int = 1):
    """A Llama folder of a random ``preset`` model (fp32, so a load can be compared exactly):
    one ``model.safetensors``, or ``shards`` files named by ``model.safetensors.index.json``.
    Returns the model's own state dict (our names, our RoPE order)."""
    args = PRESETS[preset].with_vocab(vocab)
    torch.manual_seed(seed)
    ours = {k: v.detach().clone() for k, v in build_preset(args).model.state_dict().items()}
    tensors = hf.to_hf_state_dict(ours, args)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf.hf_config(args, 64)))
    if shards == 1:
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
        return ours
    names, weight_map = sorted(tensors), {}
    for number in range(shards):
        file_name = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        part = names[number::shards]
        save_file({k: tensors[k].contiguous() for k in part}, folder / file_name)
        weight_map.update(dict.fromkeys(part, file_name))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return ours


def weights(training) -> dict[str, torch.Tensor]:
    from trainer.parallel import plain_name

    return {plain_name(k): v.full_tensor().detach().clone() for k, v in training.model.state_dict().items()}


# sharded sources, and a model whose parameter names carry the checkpoint wrapper's segment
@pytest.mark.parametrize("shards, options", [(1, ()), (3, ("train.activation_checkpointing=full",))])
def test_a_fresh_run_starts_from_the_folders_weights_with_a_fresh_optimizer(
    world_of_one, tmp_path, dataset_uri, shards, options
):
    ours = write_hf_folder(tmp_path / "source", shards=shards)
    training, attempt = start(
        tmp_path, dataset_uri, world_of_one, 1, f"init.from={(tmp_path / 'source').as_uri()}", *options
    )
    loaded = weights(training)
    assert sorted(loaded) == sorted(ours)
    for name, tensor in ours.items():
        assert torch.equal(loaded[name], tensor), name  # fp32 source: bit for bit, RoPE order undone
    assert (training.state.step, training.state.cursor, attempt.resumed_from_step) == (0, 0, None)
    assert not training.optimizer.state  # weights only: no moments until the first step
    cold, _ = start(tmp_path / "cold", dataset_uri, world_of_one, 1)
    assert not torch.equal(weights(cold)["output.weight"], ours["output.weight"])


def test_a_committed_checkpoint_wins_over_init_from(world_of_one, tmp_path, dataset_uri, monkeypatch):
    from trainer.runtime.preemption import StopFlag
    from trainer.train import train_loop

    source = tmp_path / "source"
    write_hf_folder(source)
    option = f"init.from={source.as_uri()}"
    training, _ = start(tmp_path, dataset_uri, world_of_one, 1, option, "train.max_steps=2")
    train_loop(training, StopFlag())
    trained = weights(training)
    calls = []
    monkeypatch.setattr(warm_start, "load_into", lambda *a: calls.append(a))
    relaunched, attempt = start(tmp_path, dataset_uri, world_of_one, 2, option, "train.max_steps=2")
    assert attempt.resumed_from_step == 2 and not calls  # the folder was not even read
    for name, tensor in weights(relaunched).items():
        assert torch.equal(tensor, trained[name]), name


@pytest.mark.parametrize("lo,hi", [(0, 64), (0, 7), (5, 37), (33, 64), (16, 32)])
def test_each_rank_reads_only_its_rows_and_gets_what_the_whole_tensor_would_give(tmp_path, lo, hi):
    """A rank's rows of a q/k projection (a row range of any size, cutting heads anywhere) and of
    any other tensor: the rows of the whole converted tensor."""
    from safetensors import safe_open

    ours = write_hf_folder(tmp_path / "src")
    args = PRESETS["tiny"].with_vocab(257)
    with safe_open(str(tmp_path / "src" / "model.safetensors"), framework="pt") as handle:
        for name in (
            "layers.1.attention.wq.weight",
            "layers.0.attention.wk.weight",
            "layers.0.feed_forward.w1.weight",
        ):
            got = warm_start._rows(handle, hf.to_hf_name(name), name, lo, hi, args)
            assert torch.equal(got, ours[name][lo:hi]), name


@pytest.mark.slow
def test_a_source_of_another_shape_or_function_or_incomplete_is_refused_naming_both_sides(
    world_of_one, tmp_path, dataset_uri
):
    write_hf_folder(tmp_path / "small", preset="small", vocab=257)
    with pytest.raises(ConfigError, match=r"hidden_size 768 in the source, 64 in the run"):
        start(tmp_path / "a", dataset_uri, world_of_one, 1, f"init.from={(tmp_path / 'small').as_uri()}")
    write_hf_folder(tmp_path / "theta")  # the run's shape, trained with CodeLlama's RoPE theta
    config = json.loads((tmp_path / "theta" / "config.json").read_text())
    config["rope_theta"] = config["rope_parameters"]["rope_theta"] = 1e6
    (tmp_path / "theta" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError,
        match=r"rope_theta 1000000.0 in the source, 10000.0 in the run; "
        r"rope_parameters.rope_theta 1000000.0 in the source, 10000.0 in the run",
    ):
        start(tmp_path / "t", dataset_uri, world_of_one, 1, f"init.from={(tmp_path / 'theta').as_uri()}")
    write_hf_folder(tmp_path / "vocab", vocab=300)
    with pytest.raises(ConfigError, match=r"vocab_size 300 in the source, 257 in the run"):
        start(tmp_path / "b", dataset_uri, world_of_one, 1, f"init.from={(tmp_path / 'vocab').as_uri()}")
    write_hf_folder(tmp_path / "cut", shards=2)
    index = tmp_path / "cut" / "model.safetensors.index.json"
    document = json.loads(index.read_text())
    dropped = sorted(document["weight_map"])[0]
    del document["weight_map"][dropped]
    index.write_text(json.dumps(document))
    with pytest.raises(warm_start.WarmStartError, match=rf"lacks 1 tensor\(s\).*{dropped}"):
        start(tmp_path / "c", dataset_uri, world_of_one, 1, f"init.from={(tmp_path / 'cut').as_uri()}")
    with pytest.raises(warm_start.WarmStartError, match=r"holds no config.json"):
        start(tmp_path / "d", dataset_uri, world_of_one, 1, f"init.from={(tmp_path / 'nothing').as_uri()}")


@pytest.mark.parametrize("word", ["production", "auto"])
def test_production_is_the_operators_to_resolve(world_of_one, tmp_path, dataset_uri, word):
    with pytest.raises(ConfigError, match=r"resolved by the Airflow operator.*versions/<v>/"):
        start(tmp_path, dataset_uri, world_of_one, 1, f"init.from={word}")


def test_an_s3_source_is_fetched_once_per_node_and_again_when_it_changes(s3_root, tmp_path, monkeypatch):
    from tests.trainer.helpers import CountingDownloads

    write_hf_folder(tmp_path / "src")
    storage = open_storage(s3_root)
    uri = f"{s3_root}/models/m/versions/1"
    for path in (tmp_path / "src").iterdir():
        storage.upload_file(path, f"{uri}/{path.name}")
    monkeypatch.setenv("TRAINOPS_CACHE_DIR", str(tmp_path / "cache"))
    counting = CountingDownloads(storage)
    first = warm_start.local_file(counting, f"{uri}/model.safetensors")
    again = warm_start.local_file(counting, f"{uri}/model.safetensors")
    assert first == again and first.read_bytes() == (tmp_path / "src" / "model.safetensors").read_bytes()
    assert len(counting.downloads) == 1
    storage.put(f"{uri}/model.safetensors", b"other bytes")
    assert warm_start.local_file(counting, f"{uri}/model.safetensors").read_bytes() == b"other bytes"
    assert len(counting.downloads) == 2


# --- under torchrun: 2 ranks load their halves; preempted, the run resumes bitwise ------------------
@pytest.mark.slow
def test_a_preempted_warm_started_run_resumes_bitwise(tmp_path, dataset_uri, reference_run):
    """The shared 40-step run's export (bf16) starts 20-step runs on 2 ranks: one uninterrupted,
    one SIGTERMed in step 7 and relaunched (its step-8 checkpoint wins over init.from). Both
    exports are the same bytes; the first loss is the source's trained loss, not a cold one."""
    source = reference_run["run_uri"] + "/export"
    extra = {"init": {"from": source}}
    overrides = ("train.max_steps=20", "checkpoint.every_steps=5")
    exports = {}
    for name, plan in (("whole", [""]), ("preempted", [f"{6 * 16}:1", ""])):
        config, _ = run_config(tmp_path, dataset_uri, name, **extra)
        samples = tmp_path / f"samples-{name}"
        samples.mkdir()
        for attempt, sigterm_at in enumerate(plan, start=1):
            proc = subprocess.run(
                torchrun_argv(config, *overrides, module=INSTRUMENTED),
                env=trainer_env(tmp_path / "cache", attempt, samples_dir=str(samples), sigterm_at=sigterm_at),
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert proc.returncode == (1 if sigterm_at else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
        exports[name] = (tmp_path / name / "export" / "model.safetensors").read_bytes()
    second = read_json(tmp_path / "preempted" / "attempts" / "2.json")
    assert (second["outcome"], second["resumed_from_step"]) == ("completed", 8)
    assert exports["whole"] == exports["preempted"]
    reference_final = metrics_of(reference_run["run_dir"])[40]["loss"]
    warm_first = metrics_of(tmp_path / "whole")[1]["loss"]
    assert warm_first < reference_final + 0.3 < 4.0  # a cold tiny model starts near ln 257 = 5.55


# --- model.hf: a Hugging Face folder as the model and its initial weights --------------------------
HF_FAMILIES = {
    "llama": {"model_type": "llama", "num_key_value_heads": 2},
    "mistral": {"model_type": "mistral", "num_key_value_heads": 2, "sliding_window": None},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2, "tie_word_embeddings": True},
}


def save_hf_folder(folder: Path, kind: str, *, shards: bool = False):
    """A random model of family ``kind`` saved by transformers itself (fp32), as a team's folder
    would be; sharded with an index when ``shards``. Returns the model, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {
        "vocab_size": 300,  # more than the dataset tokenizer's 257
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        **HF_FAMILIES[kind],
    }
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values), attn_implementation="sdpa")
    model.save_pretrained(folder, max_shard_size="100KB" if shards else "5GB")
    return model.eval()


@pytest.mark.parametrize("kind, shards", [("llama", True), ("mistral", False), ("qwen2", False)])
def test_model_hf_starts_from_the_folders_weights_and_its_first_loss_is_what_transformers_computes(
    world_of_one, tmp_path, dataset_uri, kind, shards
):
    import torch.nn.functional as F

    from trainer.runtime.preemption import StopFlag
    from trainer.train import train_step

    folder = tmp_path / "team-model"
    theirs = save_hf_folder(folder, kind, shards=shards)
    assert (folder / "model.safetensors.index.json").exists() == shards
    training, attempt = start(tmp_path, dataset_uri, world_of_one, 1, f"model.hf={folder.as_uri()}")
    assert training.config.model.hf_config["model_type"] == kind  # pinned from the folder
    loaded = weights(training)
    for name, tensor in theirs.state_dict().items():
        if f"hf.{name}" in loaded:  # a tied head is the embedding, loaded once
            assert torch.equal(loaded[f"hf.{name}"], tensor), name
    windows = [training.batches.micro_batch(0, micro) for micro in range(training.accum)]
    with torch.no_grad():
        expected = sum(
            F.cross_entropy(theirs(input_ids=w[:, :-1]).logits.transpose(1, 2), w[:, 1:]).item()
            for w in windows
        ) / len(windows)
    first = train_step(training, StopFlag())
    assert first.loss.item() == pytest.approx(expected, rel=1e-5)
    assert attempt.resumed_from_step is None


def test_model_hf_whose_folder_changed_since_it_was_pinned_is_refused_naming_the_keys(
    world_of_one, tmp_path, dataset_uri
):
    folder = tmp_path / "team-model"
    save_hf_folder(folder, "qwen2")
    values = json.loads((folder / "config.json").read_text())
    # what the operator pinned at launch, as the run's config.yaml holds it
    pinned = yaml.safe_dump({**values, "num_hidden_layers": 3}, default_flow_style=True).strip()
    with pytest.raises(
        ConfigError, match=r"config.json changed since the run was launched \(num_hidden_layers differ"
    ):
        start(
            tmp_path, dataset_uri, world_of_one, 1, f"model.hf={folder.as_uri()}", f"model.hf_config={pinned}"
        )


# The encoder classifiers' folders: dropout off, so the first step's loss is the folder's own.
# The tiny encoder the classifier warm starts build (each adds its family's own keys).
TINY_ENCODER = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
HF_CLASSIFIERS = {
    "bert": {"model_type": "bert", "pad_token_id": 0},
    "roberta": {"model_type": "roberta", "pad_token_id": 1, "max_position_embeddings": 66},
}


@pytest.mark.parametrize("kind", sorted(HF_CLASSIFIERS))
def test_model_hf_of_a_classifier_starts_from_its_weights_and_its_first_loss_is_what_transformers_computes(
    world_of_one, tmp_path, kind
):
    """A team's classifier folder (its labels the dataset's), saved by transformers: every weight
    loaded bit for bit, and the first step's loss the folder's model computes on the same records."""
    import torch.nn.functional as F
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from tests.trainer.helpers import LABELS, write_classification_dataset
    from trainer.runtime.preemption import StopFlag
    from trainer.train import train_step

    values = {
        **TINY_ENCODER,
        "max_position_embeddings": 64,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "id2label": dict(enumerate(LABELS)),
        **HF_CLASSIFIERS[kind],
    }
    torch.manual_seed(5)
    theirs = AutoModelForSequenceClassification.from_config(
        AutoConfig.for_model(**values), attn_implementation="sdpa"
    )
    folder = tmp_path / "team-classifier"
    theirs.save_pretrained(folder)
    theirs.eval()
    uri = write_classification_dataset(tmp_path / "kinds", train_records=40, eval_records=4)
    training, _ = start(
        tmp_path,
        uri,
        world_of_one,
        1,
        f"model.hf={folder.as_uri()}",
        "task.kind=classification",
        "train.seq_len=48",
    )
    assert training.config.model.hf_config["id2label"] == {str(i): label for i, label in enumerate(LABELS)}
    loaded = weights(training)
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(loaded[f"hf.{name}"], tensor), name
    batches = [training.batches.split(training.batches.micro_batch(0, m)) for m in range(training.accum)]
    with torch.no_grad():
        expected = sum(
            F.cross_entropy(
                theirs(input_ids=inputs.clamp(min=0), attention_mask=(inputs >= 0).long()).logits, targets
            ).item()
            for inputs, targets in batches
        ) / len(batches)
    first = train_step(training, StopFlag())
    assert first.loss.item() == pytest.approx(expected, rel=1e-5)


def test_model_hf_warm_starts_from_a_version_of_itself_and_refuses_another_models(
    world_of_one, tmp_path, dataset_uri
):
    """Scheduled retraining of a team's model: ``model.hf`` says what the model is, ``init.from``
    (its production version, as the operator resolves ``auto``) gives the weights; a folder of
    another shape is refused before any weight is read, naming the key on both sides."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path / "team-model"
    save_hf_folder(folder, "qwen2")
    values = json.loads((folder / "config.json").read_text())
    torch.manual_seed(6)  # the version: the same model, other weights (as training left them)
    version = AutoModelForCausalLM.from_config(AutoConfig.for_model(**values), attn_implementation="sdpa")
    version.save_pretrained(tmp_path / "v3")
    training, attempt = start(
        tmp_path,
        dataset_uri,
        world_of_one,
        1,
        f"model.hf={folder.as_uri()}",
        f"init.from={(tmp_path / 'v3').as_uri()}",
    )
    loaded = weights(training)
    for name, tensor in version.state_dict().items():
        if f"hf.{name}" in loaded:
            assert torch.equal(loaded[f"hf.{name}"], tensor), name
    assert attempt.resumed_from_step is None
    other = AutoModelForCausalLM.from_config(AutoConfig.for_model(**{**values, "intermediate_size": 96}))
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(
        ConfigError, match=r"does not fit the run's model: intermediate_size 96 in the source, 128 in the run"
    ):
        start(
            tmp_path / "again",
            dataset_uri,
            world_of_one,
            1,
            f"model.hf={folder.as_uri()}",
            f"init.from={(tmp_path / 'other').as_uri()}",
        )


# --- a classifier from a base encoder's folder: its new head from the seed -------------------------
BERT_MLM = [  # a masked-LM checkpoint: the encoder under "bert.", its pre-training head, no pooler
    "bert.embeddings.word_embeddings.weight",
    "bert.encoder.layer.0.output.dense.weight",
    "cls.predictions.bias",
]
CLASSIFIER = [
    "bert.embeddings.word_embeddings.weight",
    "bert.encoder.layer.0.output.dense.weight",
    "bert.pooler.dense.weight",
    "classifier.weight",
    "classifier.bias",
]


def test_the_name_map_meets_a_folder_as_from_pretrained_and_keeps_only_a_whole_head_new():
    same = warm_start.hf_name_map(CLASSIFIER, CLASSIFIER, "bert", new_head=True)
    assert (same.source, same.fresh, same.unused) == ({n: n for n in CLASSIFIER}, [], [])

    mlm = warm_start.hf_name_map(CLASSIFIER, BERT_MLM, "bert", new_head=True)
    assert mlm.source == {n: n for n in CLASSIFIER[:2]}
    assert mlm.fresh == ["bert.pooler.dense.weight", "classifier.bias", "classifier.weight"]
    assert mlm.unused == ["cls.predictions.bias"]

    bare = [n.removeprefix("bert.") for n in CLASSIFIER[:3]]  # a BertModel saves no prefix
    encoder = warm_start.hf_name_map(CLASSIFIER, bare, "bert", new_head=True)
    assert encoder.source == {n: n.removeprefix("bert.") for n in CLASSIFIER[:3]}
    assert encoder.fresh == ["classifier.bias", "classifier.weight"] and encoder.unused == []

    # Not a base encoder's folder: nothing is new, so what it lacks is missing (the load refuses).
    assert warm_start.hf_name_map(CLASSIFIER, BERT_MLM, "bert", new_head=False).fresh == []
    half = warm_start.hf_name_map(CLASSIFIER, [*CLASSIFIER[:3], "classifier.weight"], "bert", new_head=True)
    assert half.fresh == [] and "classifier.bias" not in half.source  # half a head is no base encoder
    layerless = warm_start.hf_name_map(CLASSIFIER, BERT_MLM[:1], "bert", new_head=True)
    assert "bert.encoder.layer.0.output.dense.weight" not in {*layerless.source, *layerless.fresh}


BASE_ENCODERS = {  # transformers' class a hub's base checkpoint is saved from, and its head
    ("bert", "AutoModelForMaskedLM"): ["classifier.bias", "classifier.weight"],
    ("bert", "AutoModel"): ["classifier.bias", "classifier.weight"],
    ("roberta", "AutoModelForMaskedLM"): [
        "classifier.dense.bias",
        "classifier.dense.weight",
        "classifier.out_proj.bias",
        "classifier.out_proj.weight",
    ],
}


@pytest.mark.parametrize("kind, saved_as", sorted(BASE_ENCODERS))
def test_model_hf_of_a_base_encoder_trains_a_classifier_whose_new_head_starts_from_the_seed(
    world_of_one, tmp_path, kind, saved_as, caplog
):
    """``bert-base-uncased`` as a team starts from it: a folder with no classification head. The
    encoder comes from the folder bit for bit, under the classifier's names; the head (and BERT's
    pooler, which a masked-LM checkpoint leaves out) is what the seed gives a model built from
    the same config; the log names both, and the folder's unused pre-training head."""
    import logging

    import transformers
    from transformers import AutoConfig

    from tests.trainer.helpers import write_classification_dataset

    values = {
        **TINY_ENCODER,
        **HF_CLASSIFIERS[kind],
        "max_position_embeddings": 66,
    }
    torch.manual_seed(5)
    base = getattr(transformers, saved_as).from_config(
        AutoConfig.for_model(**values), attn_implementation="sdpa"
    )
    folder = tmp_path / "base-encoder"
    base.save_pretrained(folder)
    encoder = base.base_model.state_dict()  # the bare encoder's own names
    data = write_classification_dataset(tmp_path / "kinds", train_records=40, eval_records=4)
    options = ("task.kind=classification", "train.seq_len=48")
    with caplog.at_level(logging.INFO, logger="trainer.warm_start"):
        training, _ = start(tmp_path, data, world_of_one, 1, f"model.hf={folder.as_uri()}", *options)
    loaded = weights(training)
    prefix = f"hf.{kind}."
    pooler = (
        [] if kind == "roberta" or saved_as == "AutoModel" else ["pooler.dense.bias", "pooler.dense.weight"]
    )
    assert (
        sorted(k.removeprefix("hf.") for k in loaded if not k.startswith(prefix))
        == BASE_ENCODERS[kind, saved_as]
    )
    for name in loaded:
        if name.startswith(prefix) and name.removeprefix(prefix) not in pooler:
            assert torch.equal(loaded[name], encoder[name.removeprefix(prefix)]), name

    pinned = yaml.safe_dump(training.config.model.hf_config, default_flow_style=True).strip()
    scratch, _ = start(tmp_path / "scratch", data, world_of_one, 1, f"model.hf_config={pinned}", *options)
    from_seed = weights(scratch)
    new = [f"hf.{n}" for n in BASE_ENCODERS[kind, saved_as]] + [f"{prefix}{n}" for n in pooler]
    for name in new:
        assert torch.equal(loaded[name], from_seed[name]), name
    said = caplog.text
    assert "holds a base encoder without this task's head: " in said and "start from the seed" in said
    assert all(n.removeprefix("hf.") in said for n in new[:4])
    if saved_as == "AutoModelForMaskedLM":
        assert "tensor(s) of the folder unused (not this model's): " in said
        assert ("cls.predictions" if kind == "bert" else "lm_head.") in said
