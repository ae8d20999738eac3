"""The config: defaults < YAML file < overrides, checked with errors that name the key."""

import re

import pytest
import yaml

from tests.trainer.helpers import write_config
from trainer.config import (
    Config,
    ConfigError,
    accumulation_steps,
    all_keys,
    builder_parts,
    check_data_fit,
    config_from_mapping,
    dump_yaml,
    float_keys,
    get_key,
    load_config,
    replicate_degree,
    resolved_eval_uris,
    samples_in,
)
from trainer.presets import PRESETS

MINIMAL = {
    "run_uri": "file:///runs/r1",
    "data_uri": "file:///datasets/demo/v1",
    "seed": 3,
    "precision": "fp32",
    "model": {"preset": "tiny"},
    "train": {"max_steps": 7, "micro_batch_size": 2, "grad_accum_steps": 3, "seq_len": 16, "lr": 0.01},
    "checkpoint": {"every_steps": 5, "keep": 1},
}


def test_minimal_file_is_complete_and_keeps_defaults(tmp_path):
    config = load_config(str(write_config(tmp_path / "c.yaml", **MINIMAL)))
    assert (config.seed, config.precision, config.train.grad_accum_steps, config.checkpoint.keep) == (
        3,
        "fp32",
        3,
        1,
    )
    assert (config.resume, config.train.warmup_steps, config.metrics.flush_every, config.eval.batch_size) == (
        "auto",
        10,
        10,
        8,
    )
    assert config.model.vocab_size == 0 and config.model.builder is None


def test_precedence_defaults_then_file_then_overrides(tmp_path):
    path = write_config(tmp_path / "c.yaml", **MINIMAL)
    config = load_config(str(path), ["train.lr=3e-4", "seed=11", "train.log_every=2"])
    assert config.train.lr == pytest.approx(3e-4)  # "3e-4" is a string to YAML 1.1, still a number here
    assert config.seed == 11 and config.train.log_every == 2
    assert config.train.max_steps == 7  # from the file
    assert config.train.min_lr_ratio == 0.1  # default


def test_config_file_read_through_storage_uri(tmp_path):
    path = write_config(tmp_path / "c.yaml", **MINIMAL)
    assert load_config(path.as_uri()).train.seq_len == 16


def test_dump_yaml_round_trips(tmp_path):
    config = load_config(
        None, ["run_uri=file:///r", "data_uri=file:///d", "train.lr=0.5", "eval.max_batches=3"]
    )
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(config))
    assert load_config(str(path)) == config
    assert yaml.safe_load(dump_yaml(config))["train"]["lr"] == 0.5


def test_eval_uris_default_to_the_run_layout():
    config = load_config(None, ["run_uri=file:///r", "data_uri=file:///d"])
    assert resolved_eval_uris(config) == ("file:///r/export", "file:///r/eval/metrics.json")


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=fast", "train.lr: expected a number, got 'fast'"),
        ("train.lrr=1", "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
        ("trian.lr=1", "unknown key 'trian.lr' (did you mean 'train.lr'?)"),
        ("train.max_steps=2.5", "train.max_steps: expected an integer, got 2.5"),
        ("train.max_steps=0", "train.max_steps: expected a positive number, got 0"),
        ("precision=fp8", "precision: expected one of bf16, fp16, fp32, got 'fp8'"),
        ("model.preset=huge", f"model.preset: expected one of {', '.join(PRESETS)}, got 'huge'"),
        ("train=3", "train: expected a mapping of train.* keys, got 3"),
        ("seed", "override 'seed' must look like key=value, e.g. train.lr=0.001"),
        ("seed=-1", "seed: expected zero or more, got -1"),
        ("seed=4294967296", "seed: expected a whole number from 0 to 4294967295, got 4294967296"),
    ],
)
def test_bad_values_name_key_value_and_expectation(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["run_uri=file:///r", "data_uri=file:///d", override])
    assert str(info.value) == message


def test_unknown_key_in_file_is_reported(tmp_path):
    path = write_config(tmp_path / "c.yaml", **{**MINIMAL, "checkpoint": {"evry_steps": 5}})
    with pytest.raises(
        ConfigError, match=r"unknown key 'checkpoint.evry_steps' \(did you mean 'checkpoint.every_steps'\?\)"
    ):
        load_config(str(path))


def test_required_keys_and_user_builders():
    with pytest.raises(ConfigError, match=r"^data_uri: required"):
        load_config(None, ["run_uri=file:///r"])
    with pytest.raises(ConfigError, match=r"^model.builder: expected 'module:function', got 'pkg.mod.build'"):
        load_config(None, ["run_uri=file:///r", "data_uri=file:///d", "model.builder=pkg.mod.build"])
    config = load_config(None, ["run_uri=file:///r", "data_uri=file:///d", "model.builder=pkg.mod:build"])
    assert config.model.builder == "pkg.mod:build"  # imported when training starts, not here


def test_config_dataclass_defaults_match_the_spec():
    config = Config()
    assert (config.seed, config.precision, config.resume) == (1234, "bf16", "auto")
    t = config.train
    assert (t.max_steps, t.micro_batch_size, t.grad_accum_steps, t.seq_len, t.lr, t.warmup_steps) == (
        100,
        8,
        1,
        64,
        3e-3,
        10,
    )
    assert (t.min_lr_ratio, t.weight_decay, t.grad_clip, t.log_every) == (0.1, 0.1, 1.0, 10)
    assert (config.checkpoint.every_steps, config.checkpoint.keep, config.metrics.flush_every) == (25, 2, 10)


def base(*overrides):
    return load_config(None, ["run_uri=file:///r", "data_uri=file:///d", *overrides])


@pytest.mark.parametrize(
    "value, mode",
    [("full", "full"), ("selective", "selective"), ("none", "none"), ("true", "full"), ("false", "none")],
)
def test_activation_checkpointing_modes_and_old_booleans(value, mode):
    assert base(f"train.activation_checkpointing={value}").train.activation_checkpointing == mode


def test_activation_checkpointing_rejects_other_values():
    with pytest.raises(
        ConfigError,
        match=r"^train.activation_checkpointing: expected one of none, full, selective, got 'some'$",
    ):
        base("train.activation_checkpointing=some")


def test_new_train_keys_default_to_todays_behaviour():
    t = Config().train
    assert (t.global_batch_size, t.activation_checkpointing, t.skip_grad_sync_in_accum, t.compile) == (
        0,
        "none",
        False,
        False,
    )


@pytest.mark.parametrize(
    "overrides, world_size, steps",
    [
        ((), 4, 1),  # 0: grad_accum_steps as given
        (("train.grad_accum_steps=3",), 2, 3),
        (("train.global_batch_size=64", "train.micro_batch_size=8"), 2, 4),  # 64 / (8 x 2)
        (("train.global_batch_size=64", "train.micro_batch_size=8"), 8, 1),
        (
            ("train.global_batch_size=64", "train.micro_batch_size=8", "train.grad_accum_steps=4"),
            2,
            4,
        ),  # agree
    ],
)
def test_accumulation_is_derived_from_the_global_batch(overrides, world_size, steps):
    assert accumulation_steps(base(*overrides).train, world_size) == steps


def test_indivisible_global_batch_names_all_three_numbers():
    with pytest.raises(ConfigError) as info:
        accumulation_steps(base("train.global_batch_size=60", "train.micro_batch_size=8").train, 2)
    assert str(info.value) == (
        "train.global_batch_size=60 is not a multiple of train.micro_batch_size=8 x world size 2 (= 16 samples "
        "per micro-step); set train.global_batch_size to a multiple of 16 or change train.micro_batch_size"
    )


def test_global_batch_and_accumulation_that_disagree_name_both():
    train = base("train.global_batch_size=64", "train.micro_batch_size=8", "train.grad_accum_steps=2").train
    with pytest.raises(
        ConfigError,
        match=r"^train.grad_accum_steps=2 disagrees with train.global_batch_size=64, "
        r"which needs 4 accumulation steps",
    ):
        accumulation_steps(train, 2)


@pytest.mark.parametrize("key", ["train.lr", "train.min_lr_ratio", "train.weight_decay", "train.grad_clip"])
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e999"])
def test_float_settings_must_be_finite(key, value):
    """YAML's .nan and .inf, and a number too large for a float, are numbers, but train nothing."""
    assert key in float_keys()
    with pytest.raises(ConfigError) as info:
        base(f"{key}={value}")
    default = get_key(Config(), key)
    assert str(info.value).startswith(f"{key}: expected a finite number, got ")
    assert str(info.value).endswith(f"; set a number such as {default!r} (the default)")


def test_a_learning_rate_of_zero_is_refused():
    with pytest.raises(ConfigError, match=r"^train.lr: expected a positive number, got 0.0$"):
        base("train.lr=0")


@pytest.mark.parametrize(
    "builder",
    [
        "pkg.mod.build",
        "pkg.mod:",
        ":build",
        "my-models:build",
        "a..b:c",
        "a:b:c",
        "class:build",
        "pkg.mod:build()",
    ],
)
def test_a_builder_must_name_a_module_and_a_function(builder):
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"run_uri": "file:///r", "data_uri": "file:///d", "model": {"builder": builder}})
    assert str(info.value) == (
        f"model.builder: expected 'module:function', got {builder!r}; name an importable module and a "
        "function in it, e.g. 'custom_model:build'"
    )


def test_builder_parts():
    assert builder_parts("custom_model:build") == ("custom_model", "build")
    assert builder_parts("team.models.gpt:make_model") == ("team.models.gpt", "make_model")


def test_a_mapping_is_read_as_the_same_file_would_be(tmp_path):
    data = {**MINIMAL, "train": {**MINIMAL["train"], "lr": "3e-4"}, "model": {"builder": "m:b"}}
    assert config_from_mapping(data) == load_config(str(write_config(tmp_path / "c.yaml", **data)))
    with pytest.raises(ConfigError, match=r"unknown key 'train.lrr' \(did you mean 'train.lr'\?\)"):
        config_from_mapping({**MINIMAL, "train": {"lrr": 1}})


def fit(**overrides):
    config = base(*(f"{k}={v}" for k, v in overrides.items()))
    return lambda **numbers: check_data_fit(config, **{"tokenizer_vocab": 257, "world_size": 2, **numbers})


def test_a_dataset_that_can_feed_the_run_passes():
    fit(**{"train.seq_len": 64, "train.micro_batch_size": 4})(train_tokens=8 * 64 + 1)  # 8 samples, 2 x 4
    fit(**{"model.vocab_size": 512})(train_tokens=10_000)
    assert samples_in(8 * 64 + 1, 64) == 8 and samples_in(64, 64) == 0 and samples_in(0, 64) == 0


def test_a_window_longer_than_the_train_split_names_both_numbers():
    with pytest.raises(ConfigError) as info:
        fit(**{"train.seq_len": 64})(train_tokens=64)
    assert str(info.value) == (
        "train.seq_len=64 needs windows of 65 tokens, but the train split of file:///d has only 64 tokens; "
        "lower train.seq_len to at most 63, or stage more data"
    )


def test_too_few_samples_for_one_micro_step():
    with pytest.raises(ConfigError) as info:
        fit(**{"train.seq_len": 64, "train.micro_batch_size": 4})(train_tokens=8 * 64)  # 7 samples
    assert str(info.value) == (
        "the train split of file:///d has 512 tokens, 7 samples of train.seq_len=64, fewer than one micro-step "
        "takes (train.micro_batch_size=4 x world size 2 = 8); lower train.seq_len or train.micro_batch_size, "
        "or stage more data"
    )


def test_a_vocabulary_below_the_tokenizers_is_refused():
    with pytest.raises(ConfigError) as info:
        fit(**{"model.vocab_size": 256})(train_tokens=10_000)
    assert str(info.value) == (
        "model.vocab_size=256 is smaller than the vocabulary of the dataset's tokenizer (257, file:///d); set "
        "model.vocab_size=0 to take the dataset's, or at least 257"
    )


@pytest.mark.parametrize(
    "setting, world, local, replicas",
    [
        ("auto", 16, 8, 2),  # 2 nodes of 8 GPUs: one replica per node
        ("auto", 8, 8, 1),  # one node: flat
        ("auto", 4, 1, 1),  # one rank per node: nothing to shard within a node, flat
        ("auto", 12, 8, 1),  # ranks not in whole nodes: flat
        ("1", 16, 8, 1),
        ("4", 16, 8, 4),
    ],
)
def test_replicate_degree(setting, world, local, replicas):
    assert replicate_degree(setting, world, local) == replicas


def test_parallel_replicate_takes_auto_or_a_whole_number_and_must_divide_the_world():
    assert config_from_mapping(MINIMAL).parallel.replicate == "auto"
    assert config_from_mapping({**MINIMAL, "parallel": {"replicate": 2}}).parallel.replicate == "2"
    for bad in (0, "two", -1, 1.5):
        with pytest.raises(ConfigError, match=r"parallel.replicate"):
            config_from_mapping({**MINIMAL, "parallel": {"replicate": bad}})
    with pytest.raises(ConfigError, match=r"parallel.replicate=3 does not divide the world size 16"):
        replicate_degree("3", 16, 8)


# --- init.from (warm start) -------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, kind",
    [
        ("none", "none"),
        ("production", "production"),
        ("auto", "production"),
        ("s3://bucket/models/retrain-lm/versions/3/", "uri"),
        ("file:///runs/r1/export", "uri"),
    ],
)
def test_init_from_takes_none_production_auto_or_a_folder_uri(value, kind, tmp_path):
    from trainer.config import init_source

    config = base(f"init.from={value}")
    assert config.init.from_ == value and init_source(value) == kind
    # written and read back as a config file spells it: init: {from: ...}
    assert yaml.safe_load(dump_yaml(config))["init"] == {"from": value}
    assert load_config(str(write_config(tmp_path / "c.yaml", **yaml.safe_load(dump_yaml(config))))) == config
    assert get_key(config, "init.from") == value
    assert config_from_mapping({**MINIMAL, "init": {"from": value}}).init.from_ == value


def test_init_from_defaults_to_none_and_a_config_without_it_still_loads(tmp_path):
    assert Config().init.from_ == "none"
    assert load_config(str(write_config(tmp_path / "old.yaml", **MINIMAL))).init.from_ == "none"
    assert "init.from" in all_keys()


@pytest.mark.parametrize("value", ["prod", "http://host/model", "file://", "s3://", "/abs/path", " none"])
def test_a_bad_init_from_names_the_value_and_the_choices(value):
    with pytest.raises(
        ConfigError,
        match=rf"init.from: expected none, auto, production or the file:// or s3:// URI.*got {value!r}",
    ):
        base(f"init.from={value!r}")


def test_init_from_is_spelt_without_the_attributes_underscore():
    with pytest.raises(ConfigError, match=r"unknown key 'init.from_' \(did you mean 'init.from'\?\)"):
        base("init.from_=none")


def our_export(args):
    """The ``config.json`` our export writes for ``args`` (``trainer.export.hf.hf_config``)."""
    from trainer.export import hf

    return hf.hf_config(args, 64, token_ids={"bos_token_id": 256, "eos_token_id": 256})


def test_a_source_whose_shape_differs_is_named_on_both_sides():
    from trainer.config import check_init_fit

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
    from trainer.config import check_init_fit

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
    from trainer.config import check_init_fit

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
    from trainer.config import check_init_fit

    args = PRESETS["tiny"].with_vocab(257)
    check_init_fit(args, change(our_export(args)), "s3://b/v/1")


def test_what_a_config_json_leaves_out_is_the_installed_transformers_llama_default():
    transformers = pytest.importorskip("transformers")
    from trainer.config import LLAMA_DEFAULTS

    default = transformers.LlamaConfig()
    for key, value in LLAMA_DEFAULTS.items():
        got = default.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(default, key)
        assert got == value, key
    assert default.rope_parameters["rope_type"] == "default"
    assert getattr(default, "sliding_window", None) is None


def test_the_keys_the_check_compares_are_the_ones_the_export_writes():
    from trainer.config import HF_SHAPE_KEYS, llama_config_keys
    from trainer.export import hf

    for preset in PRESETS.values():
        written = hf.hf_config(preset, 64)
        assert {theirs: written[theirs] for theirs in HF_SHAPE_KEYS.values()} == {
            theirs: getattr(preset, ours) for ours, theirs in HF_SHAPE_KEYS.items()
        }
        assert {key: written[key] for key in llama_config_keys(preset)} == llama_config_keys(preset)
        assert hf.args_from_hf_config(written).kv_heads == preset.kv_heads
