"""The config: defaults < YAML file < overrides, checked with errors that name the key."""

import re

import pytest
import yaml

from tests.trainer.helpers import TINY_QWEN2, write_config
from trainer.config import (
    Config,
    ConfigError,
    accumulation_steps,
    all_keys,
    check_data_fit,
    check_init_model,
    config_from_mapping,
    dump_yaml,
    float_keys,
    get_key,
    load_config,
    model_label,
    model_shape,
    model_vocab,
    pin_hf_config,
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


# --- model.hf_config ---------------------------------------------------------------------------
QWEN2 = {**TINY_QWEN2, "vocab_size": 300}


def with_hf(values=QWEN2, **model):
    return config_from_mapping(
        {"run_uri": "file:///r", "data_uri": "file:///d", "model": {"hf_config": values, **model}}
    )


def test_an_hf_config_is_a_mapping_read_from_a_file_and_from_an_override_alike(tmp_path):
    from_file = load_config(
        str(write_config(tmp_path / "c.yaml", **{**MINIMAL, "model": {"hf_config": QWEN2}}))
    )
    overridden = base(f"model.hf_config={dict(QWEN2)}")
    assert from_file.model.hf_config == overridden.model.hf_config == QWEN2
    assert load_config(None, ["run_uri=file:///r", "data_uri=file:///d"]).model.hf_config is None
    again = yaml.safe_load(dump_yaml(from_file))
    assert again["model"]["hf_config"] == QWEN2  # the resolved config the pods get keeps it
    assert (model_label(from_file), model_label(base())) == ("model.hf_config (qwen2)", "model.preset 'tiny'")


@pytest.mark.parametrize(
    "values, model, message",
    [
        ("qwen2", {}, "model.hf_config: expected a mapping of names to values, got 'qwen2'"),
        (
            {**QWEN2, "model_type": "gpt2"},
            {},
            "model.hf_config: model_type 'gpt2' is not supported; trainops trains llama, mistral, qwen2",
        ),
        (
            {**QWEN2, "intermediate_size": 0},
            {},
            "model.hf_config: intermediate_size must be positive integers",
        ),
        (
            {**QWEN2, "num_key_value_heads": 3},
            {},
            "num_key_value_heads 3 must be a positive divisor of num_attention_heads 4; set num_key_value_heads",
        ),
        (
            QWEN2,
            {"builder": "pkg.mod:build"},
            "model.hf_config and model.builder='pkg.mod:build' are both set",
        ),
        (QWEN2, {"vocab_size": 512}, "model.vocab_size=512 is not used with model.hf_config"),
        (
            {**QWEN2, "max_position_embeddings": 8},
            {},
            "train.seq_len=64 is longer than the 8 tokens model.hf_config.max_position_embeddings=8 holds",
        ),
    ],
)
def test_an_hf_config_that_cannot_train_is_refused_naming_the_value(values, model, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        with_hf(values, **model)


def test_an_hf_models_vocabulary_is_its_configs_and_must_hold_the_tokenizers():
    config = with_hf()
    assert model_vocab(config) == 300
    shape = model_shape(config)
    assert shape is not None and (shape.dim, shape.n_layers, shape.hidden, shape.vocab_size) == (
        64,
        2,
        128,
        300,
    )
    check_data_fit(config, train_tokens=10_000, tokenizer_vocab=300, world_size=1)
    with pytest.raises(ConfigError) as info:
        check_data_fit(config, train_tokens=10_000, tokenizer_vocab=301, world_size=1)
    assert str(info.value).startswith(
        "model.hf_config.vocab_size=300 is smaller than the vocabulary of the dataset's tokenizer (301, file:///d)"
    )


def test_warm_start_into_an_hf_config_model_is_a_version_of_it_whose_fit_is_checked_later():
    check_init_model(with_hf(), "s3://b/models/m/versions/3/")  # trainer.config.hf.check_hf_init_fit
    check_init_model(base(), "s3://b/models/m/versions/3/")  # a preset: the folder's fit is checked later


def test_a_version_of_another_hf_model_is_refused_naming_each_key_on_both_sides():
    from trainer.config.hf import check_hf_init_fit

    run = {
        "model_type": "bert",
        "hidden_size": 64,
        "id2label": {"0": "ham", "1": "spam"},
        "layer_norm_eps": 1e-12,
    }
    exported = {
        **run,
        "id2label": {0: "ham", 1: "spam"},
        "layer_norm_eps": 1.0000000000000001e-12,
        "eos_token_id": 3,
        "architectures": ["BertForSequenceClassification"],
        "transformers_version": "5.24.0",
        "vocab_size": 512,
    }
    check_hf_init_fit(run, exported, "s3://b/v/")  # read back from JSON, with what export fills in: fits
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "id2label {'0': 'spam', '1': 'ham'} in the source, {'0': 'ham', '1': 'spam'} in the run"
        ),
    ):
        check_hf_init_fit(run, {**exported, "id2label": {"0": "spam", "1": "ham"}}, "s3://b/v/")
    with pytest.raises(
        ConfigError,
        match=re.escape("init.from='s3://b/v/' holds a 'roberta' model, the run trains a 'bert' one"),
    ):
        check_hf_init_fit(run, {**exported, "model_type": "roberta"}, "s3://b/v/")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["model.hf=/models/qwen"],
            "model.hf='/models/qwen' is not a folder URI: give the Hugging Face folder as file://... or s3://...",
        ),
        (
            ["model.hf=s3://b/m/", "model.builder=pkg.mod:build"],
            "model.hf='s3://b/m/' and model.builder='pkg.mod:build' are both set",
        ),
        (["model.hf=s3://b/m/", "model.vocab_size=300"], "model.vocab_size=300 is not used with model.hf"),
    ],
)
def test_a_model_hf_that_cannot_be_the_model_is_refused_naming_the_value(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        base(*overrides)


def test_a_model_hf_folders_config_is_pinned_once_and_a_changed_one_refused():
    config = base("model.hf=s3://b/m/")
    assert (config.model.hf_config, model_shape(config) is not None) == (
        None,
        True,
    )  # a preset's until pinned
    pinned = pin_hf_config(config, QWEN2)
    assert (pinned.model.hf_config, model_vocab(pinned), model_label(pinned)) == (
        QWEN2,
        300,
        "model.hf 's3://b/m/'",
    )
    assert pin_hf_config(pinned, dict(QWEN2)) == pinned  # the same folder again: nothing changes
    with pytest.raises(
        ConfigError, match=re.escape("config.json changed since the run was launched (hidden_size differ")
    ):
        pin_hf_config(pinned, {**QWEN2, "hidden_size": 128})
    with pytest.raises(
        ConfigError, match=re.escape("model.hf='s3://b/m/': config.json: model_type 't5' is not supported")
    ):
        pin_hf_config(config, {**QWEN2, "model_type": "t5"})


@pytest.mark.parametrize("value", ["auto", "AUTO", "0"])
def test_checkpoint_every_steps_auto_is_held_as_0(value):
    config = base(f"checkpoint.every_steps={value}")
    assert config.checkpoint.every_steps == 0 and config.checkpoint.preemptions_per_hour == 1.0


def test_checkpoint_every_steps_names_auto_when_the_value_is_neither_and_refuses_it_with_mid_run_eval():
    with pytest.raises(
        ConfigError, match=r"^checkpoint.every_steps: expected a whole number or auto, got 'often'$"
    ):
        base("checkpoint.every_steps=often")
    with pytest.raises(ConfigError, match=r"eval\.every_checkpoints needs a fixed checkpoint\.every_steps"):
        base("checkpoint.every_steps=auto", "eval.every_checkpoints=2")
