"""Hugging Face encoder classifiers from a config (trainer.models.hf, ``task.kind:
classification``): BERT and RoBERTa built on the meta device by transformers as sequence
classifiers, their encoder layers as blocks, initial values by transformers' own rule, padding
masked out of attention, and the label set pinned into the config (trainer.config.hf)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainer import parallel
from trainer.config import ConfigError, config_from_mapping
from trainer.config.hf import HF_CLASSIFIER_TYPES, hf_config_problem, hf_context, labelled_config
from trainer.models.hf import ClassifierLogits, build_hf_model, fill_buffers, init_rule, padding_rows
from trainer.records import PADDING, labelled_sample, split_samples

VOCAB = 300
LABELS = ["billing", "login", "other"]
SHAPE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 66,
}
CONFIGS = {
    "bert": {"model_type": "bert", "pad_token_id": 0},
    "roberta": {"model_type": "roberta", "pad_token_id": 1},  # its positions start after its padding id
}


def config(kind: str) -> dict:
    return labelled_config({**SHAPE, **CONFIGS[kind]}, LABELS, "test")


def materialised(kind: str, seed: int = 7) -> ClassifierLogits:
    with torch.device("meta"):
        model, _ = build_hf_model(config(kind))
    parallel.init_sharded(
        model,
        torch.device("cpu"),
        seed,
        init_rule(model),
        fill_buffers=fill_buffers,
        zero_rows=padding_rows(model),
    )
    assert isinstance(model, ClassifierLogits)
    return model


def test_every_supported_encoder_is_tested():
    assert sorted(CONFIGS) == sorted(HF_CLASSIFIER_TYPES)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_blocks_are_the_encoder_layers_not_the_embeddings(kind):
    with torch.device("meta"):
        model, blocks = build_hf_model(config(kind))
    assert blocks == [f"hf.{kind}.encoder.layer.0", f"hf.{kind}.encoder.layer.1"]
    assert type(model.hf).__name__ == f"{'Bert' if kind == 'bert' else 'Roberta'}ForSequenceClassification"
    assert model.hf.config.id2label == dict(enumerate(LABELS)) and model.hf.num_labels == 3
    assert parallel.has_dropout(model.get_submodule(blocks[0]))  # so checkpointing replays its draws


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_initial_values_and_buffers_follow_transformers_own_rule(kind):
    from transformers import AutoModelForSequenceClassification

    from trainer.models.hf import hf_config

    model = materialised(kind)
    torch.manual_seed(0)
    reference = AutoModelForSequenceClassification.from_config(
        hf_config(config(kind)), attn_implementation="sdpa"
    )
    ours, theirs = dict(model.hf.named_parameters()), dict(reference.named_parameters())
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        mine = ours[name]
        if torch.all(value == 1):
            assert torch.all(mine == 1), name
        elif value.dim() == 1 and torch.all(value == 0):
            assert torch.all(mine == 0), name
        else:
            assert mine.std().item() == pytest.approx(value.std().item(), rel=0.2), name
    pad = CONFIGS[kind]["pad_token_id"]
    assert torch.all(model.hf.get_submodule(f"{kind}.embeddings.word_embeddings").weight[pad] == 0)
    for name, buffer in reference.named_buffers():  # position and token type ids
        assert torch.equal(dict(model.hf.named_buffers())[name], buffer), name


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_padded_record_scores_as_it_does_alone_and_the_loss_is_transformers(kind):
    model = materialised(kind).eval()
    first = torch.randint(5, VOCAB, (20,), generator=torch.Generator().manual_seed(0))
    second = torch.randint(5, VOCAB, (9,), generator=torch.Generator().manual_seed(1))
    windows = torch.from_numpy(
        np.stack([labelled_sample(t.numpy(), label, 24) for t, label in ((first, 2), (second, 0))])
    )
    inputs, targets = split_samples(windows, "classification")
    assert inputs.shape == (2, 24) and targets.tolist() == [2, 0]
    assert int((inputs[1] == PADDING).sum()) == 24 - 9
    with torch.no_grad():
        logits = model(inputs)
        alone = model.hf(input_ids=second[None]).logits
        own = model.hf(input_ids=first[None], labels=torch.tensor([2])).loss
    assert logits.shape == (2, 3)
    assert (logits[1:] - alone).abs().max().item() <= 1e-5
    assert F.cross_entropy(logits[:1], targets[:1]).item() == pytest.approx(own.item(), abs=1e-5)


def test_roberta_holds_two_positions_fewer_than_it_states():
    assert hf_context({**SHAPE, **CONFIGS["roberta"]}) == 64
    assert hf_context({**SHAPE, **CONFIGS["bert"]}) == 66


@pytest.mark.parametrize(
    ("values", "task", "message"),
    [
        (
            {**SHAPE, "model_type": "bert"},
            "causal_lm",
            r"model_type 'bert' does not train task.kind 'causal_lm' \(it trains classification\); set task.kind=classification",
        ),
        (
            {**SHAPE, "model_type": "llama"},
            "classification",
            r"model_type 'llama' does not train task.kind 'classification'.* pick a bert, roberta model",
        ),
        (
            {**SHAPE, "model_type": "t5"},
            None,
            r"model_type 't5' is not supported; .* bert, roberta sequence classifiers",
        ),
    ],
)
def test_a_family_of_another_task_is_refused_naming_both(values, task, message):
    import re

    problem = hf_config_problem(values, "model.hf_config", task)
    assert problem is not None and re.search(message, problem), problem


def test_the_labels_pinned_into_a_config_and_a_folder_with_other_labels_refused():
    pinned = labelled_config({**SHAPE, "model_type": "bert", "num_labels": 3}, LABELS, "w")
    assert pinned["id2label"] == {"0": "billing", "1": "login", "2": "other"} and "num_labels" not in pinned
    assert labelled_config(pinned, LABELS, "w") == pinned  # pinning again changes nothing
    # transformers' placeholders name nothing: replaced
    assert (
        labelled_config({**SHAPE, "id2label": {"0": "LABEL_0", "1": "LABEL_1"}}, LABELS, "w")["id2label"]
        == pinned["id2label"]
    )
    with pytest.raises(
        ConfigError,
        match=r"w: id2label \['spam', 'ham'\] is not the dataset's label set \['billing', 'login', 'other'\]",
    ):
        labelled_config({**SHAPE, "id2label": {"0": "spam", "1": "ham"}}, LABELS, "w")
    with pytest.raises(ConfigError, match=r"w: num_labels 2 is not the dataset's 3 labels"):
        labelled_config({**SHAPE, "num_labels": 2}, LABELS, "w")


def test_classification_needs_an_encoder_and_an_encoder_needs_classification():
    base = {"run_uri": "file:///r", "data_uri": "file:///d"}
    with pytest.raises(
        ConfigError,
        match=r"task.kind='classification' trains a Hugging Face encoder \(bert, roberta\), but the model is "
        r"model.preset 'tiny'",
    ):
        config_from_mapping({**base, "task": {"kind": "classification"}})
    encoder = {**base, "model": {"hf_config": {**SHAPE, "model_type": "bert"}}}
    with pytest.raises(
        ConfigError, match=r"model.hf_config: model_type 'bert' does not train task.kind 'causal_lm'"
    ):
        config_from_mapping(encoder)
    assert config_from_mapping({**encoder, "task": {"kind": "classification"}}).task.kind == "classification"
