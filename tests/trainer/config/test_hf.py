"""``trainer.config.hf``: the Hugging Face ``config.json`` judgments, on both sides before launch."""

import re

import pytest

from trainer.config import ConfigError
from trainer.presets import PRESETS


def our_export(args):
    """The ``config.json`` our export writes for ``args`` (``trainer.export.hf.hf_config``)."""
    from trainer.export import hf

    return hf.hf_config(args, 64, token_ids={"bos_token_id": 256, "eos_token_id": 256})


def test_a_source_whose_shape_differs_is_named_on_both_sides():
    from trainer.config.hf import check_init_fit

    args = PRESETS["tiny"].with_vocab(257)
    same = our_export(args)
    check_init_fit(args, same, "s3://b/v/1")
    check_init_fit(args, {k: v for k, v in same.items() if k != "num_key_value_heads"}, "s3://b/v/1")
    check_init_fit(args, {k: v for k, v in same.items() if k != "head_dim"}, "s3://b/v/1")
    with pytest.raises(
        ConfigError, match=r"num_hidden_layers 4 in the source, 2 in the run; pick the preset"
    ):
        check_init_fit(args, {**same, "num_hidden_layers": 4}, "s3://b/v/1")
    with pytest.raises(ConfigError, match=r"head_dim 32 in the source, 16 in the run; pick the preset"):
        check_init_fit(args, {**same, "head_dim": 32}, "s3://b/v/1")
    with pytest.raises(ConfigError, match=r"holds a 'gpt2' model, not a Llama one"):
        check_init_fit(args, {**same, "model_type": "gpt2"}, "s3://b/v/1")


def test_our_own_export_of_every_preset_fits_its_run():
    from trainer.config.hf import check_init_fit

    for preset in PRESETS.values():
        check_init_fit(preset.with_vocab(257), our_export(preset.with_vocab(257)), "file:///v/1")


def without(config, *keys):
    return {k: v for k, v in config.items() if k not in keys}


# Each key a Llama config.json sets that changes what the weights compute, beyond their shapes:
# (what the folder says instead of our export, the words of the refusal).
FUNCTION_MISMATCHES = {
    "rope_theta (CodeLlama's, flat)": (
        lambda c: {**without(c, "rope_parameters"), "rope_theta": 1e6},
        r"rope_theta 1000000.0 in the source, 10000.0 in the run",
    ),
    "rope_theta flat only, rope_parameters ours": (
        lambda c: {**c, "rope_theta": 1e6},
        r"rope_theta 1000000.0 in the source, 10000.0 in the run",
    ),
    "rope_theta under rope_parameters": (
        lambda c: {
            **without(c, "rope_theta"),
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
        },
        r"rope_parameters.rope_theta 500000.0 in the source, 10000.0 in the run",
    ),
    "rope_scaling linear (transformers 4)": (
        lambda c: {**c, "rope_scaling": {"type": "linear", "factor": 2.0}},
        r"rope_scaling \{'type': 'linear', 'factor': 2.0\} in the source, none in the run",
    ),
    "rope_scaling llama3 under rope_parameters (transformers 5)": (
        lambda c: {**c, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0}},
        r"rope_parameters \{'rope_type': 'llama3'.*\} in the source, none in the run",
    ),
    "rms_norm_eps": (
        lambda c: {**c, "rms_norm_eps": 1e-6},
        r"rms_norm_eps 1e-06 in the source, 1e-05 in the run",
    ),
    "rms_norm_eps not set": (
        lambda c: without(c, "rms_norm_eps"),
        r"rms_norm_eps 1e-06 in the source \(not set: transformers' LlamaConfig default\), 1e-05 in the run",
    ),
    "tie_word_embeddings": (
        lambda c: {**c, "tie_word_embeddings": True},
        r"tie_word_embeddings True in the source, False in the run",
    ),
    "hidden_act": (
        lambda c: {**c, "hidden_act": "gelu"},
        r"hidden_act 'gelu' in the source, 'silu' in the run",
    ),
    "attention_bias": (
        lambda c: {**c, "attention_bias": True},
        r"attention_bias True in the source, False in the run",
    ),
    "mlp_bias": (lambda c: {**c, "mlp_bias": True}, r"mlp_bias True in the source, False in the run"),
    "sliding_window": (
        lambda c: {**c, "sliding_window": 4096},
        r"sliding_window 4096 in the source, none in the run",
    ),
    "use_sliding_window": (
        lambda c: {**c, "sliding_window": 4096, "use_sliding_window": True},
        r"use_sliding_window True in the source, False in the run",
    ),
}


@pytest.mark.parametrize("change, message", list(FUNCTION_MISMATCHES.values()), ids=list(FUNCTION_MISMATCHES))
def test_a_source_that_computes_another_function_is_refused_naming_the_key_both_values_and_the_fix(
    change, message
):
    from trainer.config.hf import check_init_fit

    args = PRESETS["tiny"].with_vocab(257)
    with pytest.raises(ConfigError) as refused:
        check_init_fit(args, change(our_export(args)), "s3://b/codellama/")
    said = str(refused.value)
    assert re.search(message, said), said
    assert said.startswith("init.from='s3://b/codellama/' does not fit the run's model")
    assert "warm start from a source trained with the run's" in said and "or set init.from=none" in said


@pytest.mark.parametrize(
    "change",
    [
        # float32 rounding of the same numbers, and transformers' own spellings of the same function
        lambda c: {**c, "rms_norm_eps": 9.999999747378752e-06, "rope_theta": 10000.000000001},
        lambda c: {**c, "rope_scaling": None, "hidden_act": "swish"},
        lambda c: {**c, "rope_scaling": {"rope_type": "default", "rope_theta": 10000.0}},
        # a window that is declared but switched off (Qwen2's spelling)
        lambda c: {**c, "sliding_window": 4096, "use_sliding_window": False},
        # a plain Llama config.json: what it leaves out is transformers' default, which is the run's
        lambda c: without(
            c,
            "rope_theta",
            "rope_parameters",
            "hidden_act",
            "tie_word_embeddings",
            "attention_bias",
            "mlp_bias",
            "head_dim",
        ),
    ],
    ids=["float32 rounding", "swish is silu", "default rope_scaling", "window off", "defaults"],
)
def test_a_source_that_says_the_runs_function_otherwise_fits(change):
    from trainer.config.hf import check_init_fit

    args = PRESETS["tiny"].with_vocab(257)
    check_init_fit(args, change(our_export(args)), "s3://b/v/1")


def test_what_a_config_json_leaves_out_is_the_installed_transformers_llama_default():
    transformers = pytest.importorskip("transformers")
    from trainer.config.hf import LLAMA_DEFAULTS

    default = transformers.LlamaConfig()
    for key, value in LLAMA_DEFAULTS.items():
        got = default.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(default, key)
        assert got == value, key
    assert default.rope_parameters["rope_type"] == "default"
    assert getattr(default, "sliding_window", None) is None


def test_the_keys_the_check_compares_are_the_ones_the_export_writes():
    from trainer.config.hf import HF_SHAPE_KEYS, llama_config_keys
    from trainer.export import hf

    for preset in PRESETS.values():
        written = hf.hf_config(preset, 64)
        assert {theirs: written[theirs] for theirs in HF_SHAPE_KEYS.values()} == {
            theirs: getattr(preset, ours) for ours, theirs in HF_SHAPE_KEYS.items()
        }
        assert {key: written[key] for key in llama_config_keys(preset)} == llama_config_keys(preset)
        assert hf.args_from_hf_config(written).kv_heads == preset.kv_heads
