"""Hugging Face ``config.json`` judgments, pure and torch-free (both sides run them before launch):

- which families the trainer builds from a config, for which task (:data:`HF_CAUSAL_LM_TYPES`,
  :data:`HF_CLASSIFIER_TYPES`, :func:`hf_config_problem`), and how long a context each holds
  (:func:`hf_context`);
- a classifier's label set pinned into its config (:func:`labelled_config`);
- whether a Llama folder can warm-start a preset's model (:func:`check_init_fit`): the keys by
  which a ``config.json`` fixes what the model computes, named on both sides when they differ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainer.config.errors import ConfigError
from trainer.contract import TASK_CAUSAL_LM, TASK_CLASSIFICATION, TASK_SFT
from trainer.presets import ModelArgs

# The Hugging Face causal LM families the trainer builds (trainer.models.hf), by the
# ``model_type`` of their config.json. Each is tested (tests/trainer/models/test_hf.py).
HF_CAUSAL_LM_TYPES = ("llama", "mistral", "qwen2")
# The encoder families it trains as sequence classifiers (``AutoModelForSequenceClassification``).
HF_CLASSIFIER_TYPES = ("bert", "roberta")
# Which families each task trains.
HF_TASK_TYPES = {
    TASK_CAUSAL_LM: HF_CAUSAL_LM_TYPES,
    TASK_SFT: HF_CAUSAL_LM_TYPES,
    TASK_CLASSIFICATION: HF_CLASSIFIER_TYPES,
}
# What transformers' config of each family takes for ``num_key_value_heads`` left out (None: as
# many as the attention heads); a test holds these to the installed transformers.
KV_HEADS_DEFAULTS: dict[str, int | None] = {
    "llama": None,
    "mistral": 8,
    "qwen2": 32,
    "bert": None,
    "roberta": None,
}
_HF_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def hf_config_problem(values: object, where: str = "config.json", task: str | None = None) -> str | None:
    """Why the Hugging Face config ``values`` (a config.json's keys) cannot be trained (for
    ``task``, when given), naming the value and what to do; None when it can. Pure: both sides
    judge it before any model."""
    if not isinstance(values, Mapping):
        return f"{where}: expected a JSON object of a transformers config, got {type(values).__name__}"
    kind = values.get("model_type")
    if kind not in (*HF_CAUSAL_LM_TYPES, *HF_CLASSIFIER_TYPES):
        return (
            f"{where}: model_type {kind!r} is not supported; trainops trains "
            f"{', '.join(HF_CAUSAL_LM_TYPES)} causal LMs (task.kind {TASK_CAUSAL_LM} or {TASK_SFT}) and "
            f"{', '.join(HF_CLASSIFIER_TYPES)} sequence classifiers (task.kind {TASK_CLASSIFICATION})"
        )
    if task is not None and kind not in HF_TASK_TYPES.get(task, ()):
        fits = [t for t, kinds in HF_TASK_TYPES.items() if kind in kinds]
        return (
            f"{where}: model_type {kind!r} does not train task.kind {task!r} (it trains {' or '.join(fits)}); "
            f"set task.kind={fits[0]}, or pick a {', '.join(HF_TASK_TYPES.get(task, ()))} model"
        )
    missing = [
        key
        for key in _HF_REQUIRED
        if not isinstance(values.get(key), int) or isinstance(values[key], bool) or values[key] < 1
    ]
    if missing:
        return f"{where}: {', '.join(missing)} must be positive integers (a {kind} config sets them)"
    heads, kv = values["num_attention_heads"], kv_heads(values)
    if not isinstance(kv, int) or kv < 1 or heads % kv:
        unset = "" if "num_key_value_heads" in values else f" (not set: a {kind} config's default)"
        return (
            f"{where}: num_key_value_heads {kv!r}{unset} must be a positive divisor of num_attention_heads "
            f"{heads}; set num_key_value_heads"
        )
    if values["hidden_size"] % heads and not values.get("head_dim"):
        return (
            f"{where}: hidden_size {values['hidden_size']} is not a multiple of num_attention_heads {heads}; "
            "set head_dim or another head count"
        )
    return None


def hf_context(values: Mapping[str, Any]) -> int | None:
    """The longest sequence a supported config's model takes (None: its config does not say):
    ``max_position_embeddings``, less RoBERTa's position offset (its positions start after its
    padding id, so a 512-token RoBERTa states 514)."""
    positions = values.get("max_position_embeddings")
    if not isinstance(positions, int) or isinstance(positions, bool):
        return None
    if values.get("model_type") == "roberta":
        pad = values.get("pad_token_id")
        return positions - (int(pad) if isinstance(pad, int) else 1) - 1
    return positions


def labelled_config(values: Mapping[str, Any], labels: list[str], where: str) -> dict[str, Any]:
    """A classifier's config with the dataset's label set pinned (``id2label``, ``label2id``,
    ``num_labels``: what its output rows mean, as the export's config.json states them). A config
    that already names other labels (a fine-tuned classifier's folder) is refused, naming both
    sides: its head was trained for those. Pure."""
    stated = values.get("id2label")
    want = {str(i): label for i, label in enumerate(labels)}
    if isinstance(stated, Mapping) and not _default_labels(stated):
        have = {str(k): v for k, v in stated.items()}
        if have != want:
            raise ConfigError(
                f"{where}: id2label {[have[k] for k in sorted(have, key=int)]} is not the dataset's label set "
                f"{labels}: the classifier's head was trained for its labels; stage the data with those "
                "labels, or start from a config (model.hf_config) without id2label"
            )
    num = values.get("num_labels")
    if isinstance(num, int) and num != len(labels) and not isinstance(stated, Mapping):
        raise ConfigError(
            f"{where}: num_labels {num} is not the dataset's {len(labels)} labels {labels}; "
            "drop num_labels (the dataset sets it) or stage the data with its labels"
        )
    return {
        **{k: v for k, v in values.items() if k != "num_labels"},
        "id2label": want,
        "label2id": {label: i for i, label in enumerate(labels)},
    }


def _default_labels(stated: Mapping[Any, Any]) -> bool:
    """transformers' placeholder labels (``LABEL_0``, ``LABEL_1``), which name nothing."""
    return all(str(v) == f"LABEL_{k}" for k, v in stated.items())


# config.json keys that say how a folder was saved or which tokenizer ids it was exported with,
# not what its model computes: a warm start's source may state them otherwise.
_NOT_FUNCTION = (
    "architectures",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "bos_token_id",
    "eos_token_id",
)


def check_hf_init_fit(run: Mapping[str, Any], source: Mapping[str, Any], source_uri: str) -> None:
    """Raise ConfigError when the Hugging Face folder at ``source_uri`` (``init.from``: a promoted
    version, a run's export), whose ``config.json`` is ``source``, is not the run's model ``run``
    (``model.hf_config``, pinned): another family, or any key the run's config states (its labels
    included) that the source states otherwise, named on both sides. A key only the source states
    is one transformers filled in on export (the run's default). Pure: the operator refuses
    before launch and the trainer before loading; the load itself checks every tensor's shape."""
    if source.get("model_type") != run.get("model_type"):
        raise ConfigError(
            f"init.from={source_uri!r} holds a {source.get('model_type')!r} model, the run trains a "
            f"{run.get('model_type')!r} one (model.hf_config): warm start from a version of this model, "
            "or set init.from=none"
        )
    differ = []
    for key, want in run.items():
        if key in _NOT_FUNCTION or key not in source:
            continue
        got = source[key]
        if isinstance(want, Mapping) and isinstance(got, Mapping):
            same = {str(k): v for k, v in want.items()} == {str(k): v for k, v in got.items()}
        elif isinstance(want, float) or isinstance(got, float):
            same = _close(got, float(want)) if isinstance(want, int | float) else got == want
        else:
            same = got == want
        if not same:
            differ.append(f"{key} {got!r} in the source, {want!r} in the run")
    if differ:
        raise ConfigError(
            f"init.from={source_uri!r} does not fit the run's model: {'; '.join(differ[:6])}; warm start "
            "from a version trained with this model.hf_config (and these labels), or set init.from=none"
        )


def kv_heads(values: Mapping[str, Any]) -> Any:
    """The key/value heads of a supported config: its ``num_key_value_heads``, else its family's
    default (:data:`KV_HEADS_DEFAULTS`)."""
    stated = values.get("num_key_value_heads")
    if stated is not None:
        return stated
    return KV_HEADS_DEFAULTS.get(str(values.get("model_type"))) or values.get("num_attention_heads")


def hf_shape(values: Mapping[str, Any]) -> ModelArgs:
    """The decoder shape of a supported config (:func:`hf_config_problem` passed), as ``ModelArgs``:
    what the Airflow side sizes memory, FLOPs and cost by before launch. Biases (Qwen2's q/k/v)
    and tied embeddings are not counted: a few per mille of a real model."""
    return ModelArgs(
        dim=int(values["hidden_size"]),
        n_layers=int(values["num_hidden_layers"]),
        n_heads=int(values["num_attention_heads"]),
        n_kv_heads=int(kv_heads(values)),
        ffn_hidden=int(values["intermediate_size"]),
        vocab_size=int(values["vocab_size"]),
    )


# ``ModelArgs`` fields as a Hugging Face Llama ``config.json`` names them (``trainer.export.hf.hf_config``
# writes them; a test holds the two to the same names), for the check before a warm start.
HF_SHAPE_KEYS = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "hidden": "intermediate_size",
}

# What transformers' ``LlamaConfig`` takes for a key a ``config.json`` leaves out, so what a
# folder without it was trained to compute (transformers 5: ``configuration_llama.py``, RoPE theta
# from ``modeling_rope_utils.RotaryEmbeddingConfigMixin.default_theta``; a test holds these to the
# installed transformers). Its ``num_key_value_heads`` and ``head_dim`` defaults follow the heads.
LLAMA_DEFAULTS: dict[str, Any] = {
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}
# transformers' activation table maps both names to the same SiLU.
_SAME_ACTIVATION = {"swish": "silu"}
# Floats read back from JSON, or rounded through float32 by another exporter, are the same value.
_REL_TOL = 1e-6


def llama_config_keys(args: ModelArgs) -> dict[str, Any]:
    """The keys of a Hugging Face Llama ``config.json`` that fix what the model ``args`` computes,
    with its values: every shape, and what ``trainer.models.llama`` is beyond them (RMSNorm with
    ``norm_eps``, plain RoPE with ``rope_theta`` and no scaling, SwiGLU with SiLU, no biases,
    untied embeddings, full causal attention: no sliding window). ``trainer.export.hf.hf_config``
    writes them all on export (a test holds the two together)."""
    return {
        **{theirs: getattr(args, ours) for ours, theirs in HF_SHAPE_KEYS.items()},
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    }


def _close(got: Any, want: float) -> bool:
    number = isinstance(got, int | float) and not isinstance(got, bool)
    return number and math.isclose(float(got), want, rel_tol=_REL_TOL)


def _shape_differences(args: ModelArgs, source: Mapping[str, Any]) -> list[str]:
    """``"key <source's> in the source, <run's> in the run"`` for each shape that differs."""
    run, differ = llama_config_keys(args), []
    for theirs in (*HF_SHAPE_KEYS.values(), "head_dim"):
        want, got = run[theirs], source.get(theirs)
        if theirs == "num_key_value_heads" and got is None:  # HF's default: as many as the heads
            got = source.get("num_attention_heads")
        if theirs == "head_dim" and got is None:  # HF's default: the hidden size over the heads
            hidden, heads = source.get("hidden_size"), source.get("num_attention_heads")
            got = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else want
        if got != want:
            differ.append(f"{theirs} {got!r} in the source, {want!r} in the run")
    return differ


def _rope_type(value: Any) -> Any:
    """The RoPE type a ``rope_scaling``/``rope_parameters`` value names (transformers 4 spells the
    key ``type``); ``default`` is plain RoPE, every other type rescales it."""
    return value.get("rope_type", value.get("type", "default")) if isinstance(value, Mapping) else value


def _function_differences(args: ModelArgs, source: Mapping[str, Any]) -> list[str]:
    """``"key <source's> in the source, <run's> in the run"`` for each key of the source's
    ``config.json`` by which its model computes another function than the run's, a key left out
    being transformers' default (:data:`LLAMA_DEFAULTS`)."""
    run = llama_config_keys(args)
    differ = []

    def say(key: str, got: Any, want: Any) -> None:
        unset = "" if key.split(".")[0] in source else " (not set: transformers' LlamaConfig default)"
        differ.append(f"{key} {got!r} in the source{unset}, {want!r} in the run")

    # RoPE theta, wherever the folder states it: transformers 4 (and trainer.export.hf) read it flat,
    # transformers 5 from rope_parameters (or rope_scaling). Each place must say the run's.
    stated = [
        (f"{holder}.rope_theta" if holder else "rope_theta", where["rope_theta"])
        for holder, where in (
            ("", source),
            *((k, source.get(k)) for k in ("rope_parameters", "rope_scaling")),
        )
        if isinstance(where, Mapping) and where.get("rope_theta") is not None
    ]
    for key, got in stated or [("rope_theta", LLAMA_DEFAULTS["rope_theta"])]:
        if not _close(got, run["rope_theta"]):
            say(key, got, run["rope_theta"])
    # The run's RoPE is plain: any scaling (linear, dynamic, yarn, llama3, ...) is another model.
    for key in ("rope_scaling", "rope_parameters"):
        value = source.get(key)
        if value is not None and _rope_type(value) != _rope_type(run["rope_parameters"]):
            differ.append(f"{key} {value!r} in the source, none in the run (plain RoPE)")
    got = source.get("rms_norm_eps", LLAMA_DEFAULTS["rms_norm_eps"])
    if not _close(got, run["rms_norm_eps"]):
        say("rms_norm_eps", got, run["rms_norm_eps"])
    got = source.get("hidden_act", LLAMA_DEFAULTS["hidden_act"])
    if (_SAME_ACTIVATION.get(got, got) if isinstance(got, str) else got) != run["hidden_act"]:
        say("hidden_act", got, run["hidden_act"])
    for key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
        got = source.get(key, LLAMA_DEFAULTS[key])
        if got is not run[key]:
            say(key, got, run[key])
    # A sliding window (Mistral's spelling: sliding_window alone; Qwen2's: use_sliding_window with
    # it) masks what full causal attention sees. A window declared with use_sliding_window false is
    # off.
    window, use = source.get("sliding_window"), source.get("use_sliding_window")
    if use:
        differ.append(f"use_sliding_window {use!r} in the source, False in the run (full causal attention)")
    elif window is not None and use is None:
        differ.append(f"sliding_window {window!r} in the source, none in the run (full causal attention)")
    return differ


def check_init_fit(args: ModelArgs, source_config: Mapping[str, Any], source_uri: str) -> None:
    """Raise ConfigError when the weights at ``source_uri`` (``init.from``), whose ``config.json``
    is ``source_config``, cannot start the model ``args`` describes (the preset with the run's
    vocabulary): another architecture, any dimension that differs, or any key by which the source
    computes another function (RoPE theta and scaling, the norm's epsilon, the activation, biases,
    tied embeddings, a sliding window; a key left out is transformers' default), named on both
    sides. Pure and torch-free, so the operator refuses before launch and the trainer before
    loading."""
    if source_config.get("model_type") != "llama":
        raise ConfigError(
            f"init.from={source_uri!r} holds a {source_config.get('model_type')!r} model, not a Llama one; "
            "warm start loads the Hugging Face Llama layout only: set init.from to a Llama folder or none"
        )
    shapes = _shape_differences(args, source_config)
    function = _function_differences(args, source_config)
    if not shapes and not function:
        return
    fixes = []
    if shapes:
        fixes.append(
            "pick the preset (model.preset, model.vocab_size) the source was trained with, a source of this shape"
        )
    if function:
        fixes.append(
            "warm start from a source trained with the run's "
            f"{', '.join(dict.fromkeys(key.split(' ')[0] for key in function))} (every preset's model is a Llama with "
            f"rope_theta {args.rope_theta}, no RoPE scaling, rms_norm_eps {args.norm_eps}, SiLU, no biases, "
            "untied embeddings and full causal attention, and no setting changes them)"
        )
    raise ConfigError(
        f"init.from={source_uri!r} does not fit the run's model: {'; '.join(shapes + function)}; "
        f"{', or '.join(fixes)}, or set init.from=none"
    )
