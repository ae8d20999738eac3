"""Our decoder's names, config and RoPE order <-> Hugging Face Llama's, as pure mappings."""

import dataclasses

import pytest
import torch

from trainer.export.hf import (
    args_from_hf_config,
    from_hf_state_dict,
    half_to_interleaved,
    hf_config,
    interleaved_to_half,
    to_hf_state_dict,
)
from trainer.models.llama import Transformer
from trainer.presets import ModelArgs

# Grouped-query attention, so q and k are permuted with different head counts.
ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, rope_theta=500000.0)


def test_rope_permutation_round_trips_and_is_not_the_identity():
    weight = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)  # 2 heads of head_dim 4
    half = interleaved_to_half(weight, n_heads=2)
    assert half[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]  # rows 0,2,1,3 then 4,6,5,7
    assert torch.equal(half_to_interleaved(half, n_heads=2), weight)
    state = Transformer(ARGS).state_dict()
    back = from_hf_state_dict(to_hf_state_dict(state, ARGS), ARGS)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)


def test_the_llama_config_round_trips_to_the_same_args():
    config = hf_config(ARGS, max_position_embeddings=128)
    assert (config["num_key_value_heads"], config["head_dim"], config["max_position_embeddings"]) == (
        2,
        16,
        128,
    )
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    # the same model: config.json spells out the feed-forward width that ARGS derives
    assert args_from_hf_config(config) == dataclasses.replace(ARGS, ffn_hidden=ARGS.hidden)
    with pytest.raises(ValueError, match=r"config.json has model_type 'gpt2'; only 'llama' loads here"):
        args_from_hf_config({**config, "model_type": "gpt2"})


def test_names_outside_the_llama_layout_are_refused_by_name():
    state = Transformer(ARGS).state_dict()
    with pytest.raises(ValueError, match=r"parameter 'extra.weight' is not part of the Llama-style model"):
        to_hf_state_dict({**state, "extra.weight": torch.zeros(1)}, ARGS)
    tensors = to_hf_state_dict(state, ARGS)
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.mlp.bias' is not a Llama tensor"):
        from_hf_state_dict({**tensors, "model.layers.0.mlp.bias": torch.zeros(1)}, ARGS)
    # older Hugging Face checkpoints store the RoPE table: it is not a weight, and is skipped
    table = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)}
    assert from_hf_state_dict({**tensors, **table}, ARGS).keys() == state.keys()


def test_clean_name_drops_every_wrapper_segment():
    from trainer.export.hf import clean_name

    assert (
        clean_name("layers.0._checkpoint_wrapped_module.attention.wq.weight")
        == "layers.0.attention.wq.weight"
    )
    assert clean_name("_orig_mod.layers.1._fsdp_wrapped_module.ffn.w1.weight") == "layers.1.ffn.w1.weight"
    assert clean_name("tok_embeddings.weight") == "tok_embeddings.weight"


def test_the_config_carries_the_tokenizers_ids_so_llama_defaults_never_apply():
    transformers = pytest.importorskip("transformers")
    ids = {"bos_token_id": 256, "eos_token_id": 256}
    config = hf_config(ARGS, max_position_embeddings=128, token_ids=ids)
    assert {k: config[k] for k in ids} == ids and "pad_token_id" not in config
    loaded = transformers.LlamaConfig.from_dict(config)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (256, 256, None)
    # without them LlamaConfig assumes Llama's own tokenizer: BOS 1, EOS 2
    assert transformers.LlamaConfig.from_dict(hf_config(ARGS, 128)).eos_token_id == 2
