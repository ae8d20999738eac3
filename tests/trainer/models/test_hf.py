"""Hugging Face causal LMs from a config (trainer.models.hf): built on the meta device by
transformers, its own layers as blocks, initial values by transformers' own rule drawn shard by
shard, and trainable under FSDP2."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer import parallel
from trainer.config.hf import HF_CAUSAL_LM_TYPES, hf_config_problem, hf_shape, kv_heads
from trainer.models.hf import (
    build_hf_model,
    fill_buffers,
    init_rule,
    layer_names,
    padding_rows,
)
from trainer.presets import param_count

VOCAB = 300
# A tiny model of each supported family, as its config.json would hold it.
CONFIGS = {
    "llama": {"model_type": "llama", "num_key_value_heads": 2},
    "mistral": {"model_type": "mistral", "num_key_value_heads": 2, "sliding_window": None},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2, "tie_word_embeddings": True},
}
SHAPE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
}


def config(kind: str) -> dict:
    return {**SHAPE, **CONFIGS[kind]}


def materialised(kind: str, seed: int = 7):
    """The model built on meta and initialised in one process (no sharding)."""
    with torch.device("meta"):
        model, blocks = build_hf_model(config(kind))
    parallel.init_sharded(
        model,
        torch.device("cpu"),
        seed,
        init_rule(model),
        fill_buffers=fill_buffers,
        zero_rows=padding_rows(model),
    )
    return model, blocks


def test_every_supported_family_is_tested():
    assert sorted(CONFIGS) == sorted(HF_CAUSAL_LM_TYPES)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_blocks_are_the_models_own_decoder_layers(kind):
    with torch.device("meta"):
        model, blocks = build_hf_model(config(kind))
    assert blocks == ["hf.model.layers.0", "hf.model.layers.1"]
    assert blocks == layer_names(model)
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing allocated


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_initial_values_follow_transformers_own_rule(kind):
    from transformers import AutoModelForCausalLM

    from trainer.models.hf import hf_config

    model, _ = materialised(kind)
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(hf_config(config(kind)), attn_implementation="sdpa")
    ours = dict(model.hf.named_parameters())
    theirs = dict(reference.named_parameters())
    assert sorted(ours) == sorted(theirs)
    std = reference.config.initializer_range
    for name, value in theirs.items():
        mine = ours[name]
        assert mine.shape == value.shape, name
        if torch.all(value == 1):
            assert torch.all(mine == 1), name
        elif value.dim() == 1 and torch.all(value == 0):
            assert torch.all(mine == 0), name
        else:  # a normal draw: the same std, other values (another generator)
            assert mine.std().item() == pytest.approx(value.std().item(), rel=0.2), name
            assert mine.std().item() == pytest.approx(std, rel=0.2), name
    # The padding row starts at zero, as transformers leaves it
    assert torch.all(model.hf.model.embed_tokens.weight[0] == 0)
    # The rotary tables, computed by the model itself on the real device
    for name, buffer in reference.named_buffers():
        assert torch.equal(dict(model.hf.named_buffers())[name], buffer), name


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_logits_are_the_hf_models_and_its_own_loss_agrees(kind):
    model, _ = materialised(kind)
    tokens = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (2, 16, VOCAB)
    own = model.hf(input_ids=tokens, labels=tokens).loss  # transformers shifts the labels itself
    ours = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    assert ours.item() == pytest.approx(own.item(), abs=1e-5)


def test_the_same_seed_gives_the_same_model_and_another_seed_another():
    first, _ = materialised("llama", seed=1)
    again, _ = materialised("llama", seed=1)
    other, _ = materialised("llama", seed=2)
    for (name, a), b, c in zip(first.named_parameters(), again.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b), name
        if a.dim() == 2:
            assert not torch.equal(a, c), name


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # untied and tied embeddings
def test_sharded_with_fsdp2_it_starts_from_the_same_values_and_learns(kind):
    from torch.distributed.fsdp import fully_shard

    plain, _ = materialised(kind)
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="trainops-"), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with torch.device("meta"):
            model, blocks = build_hf_model(config(kind))
        for name in blocks:
            fully_shard(model.get_submodule(name))
        fully_shard(model)
        parallel.init_sharded(
            model,
            torch.device("cpu"),
            7,
            init_rule(model),
            fill_buffers=fill_buffers,
            zero_rows=padding_rows(model),
        )
        for (name, sharded), value in zip(model.named_parameters(), plain.parameters(), strict=True):
            assert torch.equal(sharded.full_tensor(), value), name

        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        tokens = torch.randint(1, VOCAB, (4, 17), generator=torch.Generator().manual_seed(0))
        losses = []
        for _ in range(8):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert losses[-1] < losses[0] - 0.5, losses  # it memorises the batch
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {**SHAPE, "model_type": "gpt2"},
            r"model_type 'gpt2' is not supported; trainops trains llama, mistral, qwen2",
        ),
        ({"hidden_size": 64}, r"model_type None is not supported"),
        (
            {**SHAPE, "model_type": "llama", "num_hidden_layers": 0},
            r"num_hidden_layers must be positive integers",
        ),
        ({**SHAPE, "model_type": "qwen2", "vocab_size": "300"}, r"vocab_size must be positive integers"),
        (["llama"], r"expected a JSON object of a transformers config, got list"),
    ],
)
def test_a_config_that_cannot_be_trained_is_refused_naming_the_value(values, message):
    import re

    problem = hf_config_problem(values)
    assert problem is not None and re.search(message, problem), problem
    with pytest.raises(ValueError, match=message):
        build_hf_model(values)


@pytest.mark.parametrize("kind", HF_CAUSAL_LM_TYPES)
def test_the_shape_the_airflow_side_sizes_by_counts_the_models_parameters(kind):
    """``hf_shape`` (torch-free, for memory and cost before launch) against the model transformers
    builds: exact but for Qwen2's q/k/v biases and a tied head, which it leaves out."""
    values = config(kind)
    with torch.device("meta"):
        model, _ = build_hf_model(values)
    built = sum(p.numel() for p in model.parameters())
    counted = param_count(hf_shape(values))
    biases = sum(p.numel() for n, p in model.named_parameters() if n.endswith(".bias"))
    tied = VOCAB * 64 if values.get("tie_word_embeddings") else 0
    assert counted == built - biases + tied


def test_a_built_hf_model_carries_its_rebuild_spec_and_sharded_init():
    from trainer.models.builder import build_from_spec, build_model

    with torch.device("meta"):
        built = build_model("tiny", None, 999, 32, hf_config=config("qwen2"))  # its own vocabulary
    assert (built.source, built.args, built.spec) == ("hf qwen2", None, {"hf_config": config("qwen2")})
    assert built.block_names == ["hf.model.layers.0", "hf.model.layers.1"]
    assert built.meta_init is not None and built.meta_init.zero_rows == {"hf.model.embed_tokens.weight": 0}
    assert built.attention == (2, 64)
    again = build_from_spec(built.spec)  # what an export or a checkpoint rebuilds, on the CPU
    assert [n for n, _ in again.model.named_parameters()] == [n for n, _ in built.model.named_parameters()]


@pytest.mark.parametrize("kind", HF_CAUSAL_LM_TYPES)
def test_the_key_value_heads_a_config_leaves_out_are_the_installed_transformers_default(kind):
    from transformers import AutoConfig

    values = {**SHAPE, "model_type": kind, "num_attention_heads": 32, "hidden_size": 256}
    assert kv_heads(values) == AutoConfig.for_model(**values).num_key_value_heads


def test_a_config_whose_default_key_value_heads_cannot_divide_its_heads_is_refused():
    problem = hf_config_problem({**SHAPE, "model_type": "qwen2"}, "model.hf_config")
    assert problem == (
        "model.hf_config: num_key_value_heads 32 (not set: a qwen2 config's default) must be a positive "
        "divisor of num_attention_heads 4; set num_key_value_heads"
    )
