"""The trainer's configuration: dataclasses, loaded as defaults < YAML file < overrides.

Light on purpose (yaml and the standard library only): the CLI validates a config and
exits before torch is imported, and the Airflow side may resolve configs too. yaml is
imported where files are read or written, so the dataclasses alone need only the standard
library (``bench/gpu.py`` builds them on a device's bare torch install).
"""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from trainer.config.errors import ConfigError
from trainer.config.functions import function_parts
from trainer.config.hf import HF_CLASSIFIER_TYPES, hf_config_problem, hf_context, hf_shape, labelled_config
from trainer.contract import (
    RECORD_TASKS,
    TASK_CAUSAL_LM,
    TASK_CLASSIFICATION,
    TASK_KINDS,
    RunLayout,
)
from trainer.presets import PRESETS, ModelArgs
from trainer.storage import NotFound, open_storage

CHECKPOINT_AUTO = 0  # checkpoint.every_steps: auto, as the config holds it


@dataclass
class ModelConfig:
    preset: str = "tiny"
    builder: str | None = None  # "module:function" for a user model (docs/models.md); overrides preset
    vocab_size: int = 0  # 0: the dataset manifest's tokenizer vocab_size
    # A Hugging Face config (a config.json's keys; model_type one of trainer.config.hf.HF_TASK_TYPES's):
    # the model transformers builds from it, random initial weights (docs/models.md). Overrides
    # preset; its own vocab_size is the model's.
    hf_config: dict[str, Any] | None = None
    # The URI of a Hugging Face folder (config.json, safetensors weights, tokenizer files): the
    # model its config.json describes, starting from its weights. The operator pins the folder's
    # config.json into hf_config before launch; the trainer checks the folder still says the same.
    hf: str = ""


@dataclass
class TaskConfig:
    # What the run learns (trainer.contract.tasks): causal_lm, next-token loss on the staged token
    # stream; sft, prompt/response records, the loss on the response only; classification,
    # text/label records, an encoder's cross-entropy over the labels. The dataset must have been
    # staged for the same task.
    kind: str = TASK_CAUSAL_LM


@dataclass
class TrainConfig:
    max_steps: int = 100
    micro_batch_size: int = 8
    # 0: micro_batch_size * grad_accum_steps * world_size. Set, it fixes the samples per step on
    # any world size (accumulation is derived at run time), which makes elastic resume exact.
    global_batch_size: int = 0
    grad_accum_steps: int = 1
    seq_len: int = 64
    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 10  # the loss is read to the host (a device sync) only every N steps
    # none | full (every block) | selective (every second block); true/false mean full/none.
    activation_checkpointing: str = "none"
    # true: skip the gradient reduce-scatter on all but the last micro-step of a step. Faster
    # (one gradient sync per step, not one per micro-step), but every rank holds its unsharded
    # gradients between micro-steps: more memory, like training without FSDP's gradient sharding.
    skip_grad_sync_in_accum: bool = False
    # true: torch.compile each block before sharding (slow first steps while it compiles).
    compile: bool = False
    # Seconds a collective may wait for the other ranks before the process group fails it and
    # the rank crashes (NCCL's watchdog, with TORCH_NCCL_ASYNC_ERROR_HANDLING=1; gloo raises):
    # a hung or stopped rank then ends the attempt instead of holding the gang for PyTorch's
    # default 30 min. It must exceed the longest wait between ranks: a checkpoint download on
    # resume, rank 0's export at the end.
    collective_timeout_s: float = 600.0
    # Bad-loss recovery (trainer.runtime.bad_loss): a non-finite loss, or a spike, restores the
    # newest committed checkpoint and skips the steps trained since, at most this many times per
    # attempt (0: off; a bad loss then fails the attempt).
    rollback_budget: int = 3
    # A loss above this factor times the median of the last 100 is a spike (0: off, the default:
    # a spike is a judgement call; NaN and inf are always bad).
    loss_spike_factor: float = 0.0


@dataclass
class CheckpointConfig:
    # Steps between async checkpoints, or auto (written 0 once read): the trainer picks the
    # interval from the measured save cost and the preemption rate (trainer.checkpoint.cadence).
    every_steps: int = 25
    keep: int = 2
    # The preemption rate auto plans for, when the run's own attempts show none higher.
    preemptions_per_hour: float = 1.0


@dataclass
class MetricsConfig:
    flush_every: int = 10


@dataclass
class EvalConfig:
    model_uri: str = ""  # "": <run_uri>/export
    baseline_uri: str = ""  # "": no baseline
    output_uri: str = ""  # "": <run_uri>/eval/metrics.json
    batch_size: int = 8
    max_batches: int = 0  # 0: the whole eval split
    # sft: the longest greedy answer to an eval prompt (exact match and token F1 are scored on
    # the reference's first max_new_tokens tokens)
    max_new_tokens: int = 32
    # a team's own scorers, each ``module:function`` (trainer.evaluate.user): called with the
    # predictions, the references and the eval records' columns, overall and per slice
    metrics: list[str] = field(default_factory=list)
    # Mid-run evaluation (EvaluateCheckpointsOperator): score every Nth regular checkpoint
    # (steps that are multiples of N * checkpoint.every_steps) in a job of its own, and keep
    # such a checkpoint, whatever checkpoint.keep says, until its score is written. 0: off.
    every_checkpoints: int = 0
    # With a checkpoint as model_uri: export it here first (as `trainer export` would), then
    # score the export, which is what is promoted if it is picked. "": score the checkpoint.
    export_uri: str = ""


@dataclass
class ExportConfig:
    dtype: str = "bf16"  # the export's floating tensors: bf16 (half the bytes) or fp32 (bit for bit)
    # above this many bytes the weights are split into model-0000i-of-0000N.safetensors files
    # with model.safetensors.index.json (Hugging Face's layout and default)
    max_shard_bytes: int = 5 * 1024**3


@dataclass
class ParallelConfig:
    # How many copies of the sharded model (HSDP: shard inside a group of ranks, replicate across
    # groups, so only the gradient all-reduce crosses groups). "auto": one per node when there
    # are several nodes of several ranks, else 1; 1: flat FSDP over every rank; N: N groups of
    # world size / N ranks (it must divide the world size). See :func:`replicate_degree`.
    replicate: str = "auto"


# ``init.from``'s words; anything else must be a storage URI of a Hugging Face Llama folder.
INIT_NONE = "none"
INIT_AUTO = "auto"
INIT_PRODUCTION = "production"
INIT_SCHEMES = ("file://", "s3://")


@dataclass
class InitConfig:
    # The weights a run starts from (docs/trainer.md, "Warm start"): none (random; the default),
    # production or auto (the operator resolves them into a version URI before launch: the
    # production version of its model_name; auto is none when there is none), or the URI of a
    # folder in the Hugging Face Llama layout (a promoted version, a run's export). Weights only:
    # the optimizer, step and schedule start fresh, and a committed checkpoint of the run wins.
    from_: str = INIT_NONE


@dataclass
class Config:
    run_uri: str = ""
    data_uri: str = ""
    seed: int = 1234
    precision: str = "bf16"
    resume: str = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    init: InitConfig = field(default_factory=InitConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as nested keys, spelt as a config file holds them (``init.from``)."""
        return _spelt(dataclasses.asdict(self))


def key_name(attribute: str) -> str:
    """A field's key in a config file: a Python keyword is an attribute with a trailing ``_``
    (``from_``), written without it (``init.from``)."""
    bare = attribute.removesuffix("_")
    return bare if bare != attribute and keyword.iskeyword(bare) else attribute


def attribute_name(key: str) -> str:
    """The dataclass attribute of a key part (``from`` -> ``from_``): :func:`key_name`'s inverse."""
    return f"{key}_" if keyword.iskeyword(key) else key


def _spelt(data: dict[str, Any]) -> dict[str, Any]:
    return {key_name(k): _spelt(v) if isinstance(v, dict) else v for k, v in data.items()}


CHOICES = {
    "precision": ("bf16", "fp16", "fp32"),
    "resume": ("auto", "never"),
    "model.preset": tuple(PRESETS),
    "train.activation_checkpointing": ("none", "full", "selective"),
    "export.dtype": ("bf16", "fp32"),
    "task.kind": TASK_KINDS,
}
# Values older configs used, read as their new spelling without a warning.
ALIASES = {"train.activation_checkpointing": {True: "full", False: "none"}}
# Words a number key also takes, and the number each stands for.
WORDS = {"checkpoint.every_steps": {"auto": CHECKPOINT_AUTO}}
# Keys that hold "auto" or a whole number: YAML gives the number as an int, kept as its string.
AUTO_OR_COUNT = ("parallel.replicate",)
REQUIRED = ("run_uri", "data_uri")
POSITIVE = (
    "train.max_steps",
    "train.lr",
    "train.micro_batch_size",
    "train.grad_accum_steps",
    "train.seq_len",
    "train.log_every",
    "train.collective_timeout_s",
    "checkpoint.keep",
    "checkpoint.preemptions_per_hour",
    "metrics.flush_every",
    "eval.batch_size",
    "eval.max_new_tokens",
    "export.max_shard_bytes",
)
NON_NEGATIVE = (
    "seed",
    "model.vocab_size",
    "train.global_batch_size",
    "train.warmup_steps",
    "train.weight_decay",
    "train.grad_clip",
    "train.rollback_budget",
    "checkpoint.every_steps",
    "train.loss_spike_factor",
    "eval.max_batches",
    "eval.every_checkpoints",
)

# The sample order seeds a generator with ``seed * 1_000_003 + epoch`` (``trainer.data``): a seed
# past 2**32 - 1 would overflow it at the first step, on the GPUs; numpy's range, which people know.
MAX_SEED = 2**32 - 1

# PyYAML follows YAML 1.1, where "3e-3" (no dot) is a string, not a float; people write it anyway.
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _hint(cls: object, name: str) -> Any:
    """The resolved type of field ``name`` of the dataclass ``cls``."""
    return typing.get_type_hints(cls)[name]


def all_keys() -> list[str]:
    """Every dotted key a config accepts."""
    keys = []
    for f in dataclasses.fields(Config):
        hint = _hint(Config, f.name)
        if dataclasses.is_dataclass(hint):
            keys += [f"{f.name}.{key_name(sub.name)}" for sub in dataclasses.fields(hint)]
        else:
            keys.append(f.name)
    return keys


def _unknown(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, all_keys(), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(all_keys())}"
    return ConfigError(f"unknown key {key!r}{hint}")


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """``value`` as the type ``hint`` wants, or a ConfigError naming key, value and type."""
    if isinstance(value, bool) and key in ALIASES:
        value = ALIASES[key][value]
    if isinstance(value, str) and key in WORDS:
        words = WORDS[key]
        if value.strip().lower() not in words:
            raise ConfigError(f"{key}: expected a whole number or {' or '.join(words)}, got {value!r}")
        value = words[value.strip().lower()]
    if key in AUTO_OR_COUNT and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return _as_type(key, value, hint)


def _as_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` as the (non-optional) type ``hint``, or a ConfigError naming key, value and type."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _NUMBER.match(value.strip()):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if typing.get_origin(hint) is list:
        if isinstance(value, str):  # one item, as a command line gives it: eval.metrics=pkg:fn
            value = [value] if value else []
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    if typing.get_origin(hint) is dict:
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping of names to values, got {value!r}")
    raise TypeError(f"config field {key} has an unsupported type {hint!r}")


def _apply(config: Config, data: object, source: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of config keys, got {data!r}")
    for name, value in data.items():
        name = str(name)
        if name not in {f.name for f in dataclasses.fields(Config)}:
            # Name the whole dotted key the user wrote, so the suggestion can be a dotted key.
            raise _unknown(f"{name}.{next(iter(value))}" if isinstance(value, dict) and value else name)
        hint = _hint(Config, name)
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: expected a mapping of {name}.* keys, got {value!r}")
            section = getattr(config, name)
            for sub, subvalue in value.items():
                key, attribute = f"{name}.{sub}", attribute_name(str(sub))
                if key_name(attribute) != str(sub) or attribute not in {
                    f.name for f in dataclasses.fields(hint)
                }:
                    raise _unknown(key)
                setattr(section, attribute, _coerce(key, subvalue, _hint(hint, attribute)))
        else:
            setattr(config, name, _coerce(name, value, hint))


def get_key(config: Config, key: str) -> Any:
    """The value at a dotted key (``train.lr``)."""
    obj: Any = config
    for part in key.split("."):
        obj = getattr(obj, attribute_name(part))
    return obj


def validate(config: Config) -> Config:
    for key in REQUIRED:
        if not get_key(config, key):
            raise ConfigError(f"{key}: required; set it in the config file or pass {key}=URI")
    for key, allowed in CHOICES.items():
        value = get_key(config, key)
        if value not in allowed:
            raise ConfigError(f"{key}: expected one of {', '.join(allowed)}, got {value!r}")
    defaults = Config()
    for key in float_keys():
        if not math.isfinite(get_key(config, key)):
            raise ConfigError(
                f"{key}: expected a finite number, got {get_key(config, key)!r}; "
                f"set a number such as {get_key(defaults, key)!r} (the default)"
            )
    for key in POSITIVE:
        if get_key(config, key) <= 0:
            raise ConfigError(f"{key}: expected a positive number, got {get_key(config, key)!r}")
    for key in NON_NEGATIVE:
        if get_key(config, key) < 0:
            raise ConfigError(f"{key}: expected zero or more, got {get_key(config, key)!r}")
    if config.seed > MAX_SEED:
        raise ConfigError(f"seed: expected a whole number from 0 to {MAX_SEED}, got {config.seed!r}")
    if not 0.0 <= config.train.min_lr_ratio <= 1.0:
        raise ConfigError(
            f"train.min_lr_ratio: expected a number between 0 and 1, got {config.train.min_lr_ratio!r}"
        )
    _check_checkpoints(config)
    _check_model(config)
    if config.task.kind == TASK_CLASSIFICATION and config.model.hf_config is None and not config.model.hf:
        raise ConfigError(
            f"task.kind='classification' trains a Hugging Face encoder ({', '.join(HF_CLASSIFIER_TYPES)}), but "
            f"the model is {model_label(config)}: set model.hf to a classifier's folder or model.hf_config "
            "to an encoder's config"
        )
    for key in AUTO_OR_COUNT:
        _auto_or_count(key, get_key(config, key))
    init_source(config.init.from_)
    check_user_metrics(config.eval.metrics)
    return config


def check_user_metrics(specs: object) -> list[str]:
    """``eval.metrics`` as a list: strings, each a ``module:function``, none twice; a
    ConfigError naming the value otherwise (the operator checks its ``metrics`` with it)."""
    if not isinstance(specs, (list, tuple)) or not all(isinstance(s, str) for s in specs):
        raise ConfigError(f"eval.metrics: expected a list of strings, got {specs!r}")
    specs = list(specs)
    for spec in specs:
        function_parts("eval.metrics", spec, USER_METRIC_EXAMPLE)
    twice = sorted({s for s in specs if specs.count(s) > 1})
    if twice:
        raise ConfigError(f"eval.metrics: {twice[0]!r} is listed twice; list each scorer once")
    return specs


def _check_checkpoints(config: Config) -> None:
    """Mid-run evaluation picks checkpoints by step multiples, which an auto interval has not."""
    if config.checkpoint.every_steps == CHECKPOINT_AUTO and config.eval.every_checkpoints:
        raise ConfigError(
            "eval.every_checkpoints needs a fixed checkpoint.every_steps (it scores the checkpoints of "
            "steps that are multiples of both), not auto; set checkpoint.every_steps to a number of steps, "
            "or eval.every_checkpoints to 0"
        )


def _check_model(config: Config) -> None:
    """The model source: a builder's ``module:function`` form, a ``model.hf_config``'s family,
    alone as the source, its context long enough for ``train.seq_len``."""
    model = config.model
    if model.builder is not None:
        builder_parts(model.builder)
    if model.hf:
        _check_hf_folder(config)
    if model.hf_config is None:
        return
    problem = hf_config_problem(model.hf_config, "model.hf_config", config.task.kind)
    if problem:
        raise ConfigError(problem)
    if model.builder is not None:
        raise ConfigError(
            f"model.hf_config and model.builder={model.builder!r} are both set; a run trains one model: "
            "unset one of them"
        )
    if model.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model.vocab_size} is not used with model.hf_config, whose vocab_size is "
            "the model's: set model.hf_config.vocab_size instead, and model.vocab_size=0"
        )
    context = hf_context(model.hf_config or {})
    if context is not None and context < config.train.seq_len:
        positions = (model.hf_config or {}).get("max_position_embeddings")
        raise ConfigError(
            f"train.seq_len={config.train.seq_len} is longer than the {context} tokens "
            f"model.hf_config.max_position_embeddings={positions} holds; lower train.seq_len or raise "
            "max_position_embeddings"
        )


def _check_hf_folder(config: Config) -> None:
    """``model.hf``: a folder's URI, alone as the model source and as the initial weights."""
    model, value = config.model, config.model.hf
    if not value.startswith(INIT_SCHEMES):
        raise ConfigError(
            f"model.hf={value!r} is not a folder URI: give the Hugging Face folder as "
            f"{' or '.join(s + '...' for s in INIT_SCHEMES)}"
        )
    if model.builder is not None:
        raise ConfigError(
            f"model.hf={value!r} and model.builder={model.builder!r} are both set; a run trains one "
            "model: unset one of them"
        )
    if model.vocab_size:
        raise ConfigError(
            f"model.vocab_size={model.vocab_size} is not used with model.hf, whose config.json fixes the "
            "vocabulary: set model.vocab_size=0"
        )


def pin_hf_config(config: Config, values: object) -> Config:
    """``config`` with ``model.hf_config`` pinned to ``values``, the ``config.json`` of the
    ``model.hf`` folder: what every attempt builds, whatever the folder says later. Refused,
    naming the folder, when the family cannot be trained, or when a config pinned earlier (by
    the operator, before launch) is not what the folder now says. Pure."""
    where = f"model.hf={config.model.hf!r}: config.json"
    problem = hf_config_problem(values, where, config.task.kind)
    if problem:
        raise ConfigError(problem)
    values = cast("Mapping[str, Any]", values)  # hf_config_problem said it is one
    pinned = config.model.hf_config
    if pinned is not None and dict(pinned) != dict(values):
        changed = sorted(k for k in {*pinned, *values} if pinned.get(k) != values.get(k))
        raise ConfigError(
            f"{where} changed since the run was launched ({', '.join(changed[:5])} differ from the "
            "config pinned then); a run trains one model: restore the folder, or start a new run"
        )
    model = dataclasses.replace(config.model, hf_config=dict(values))
    return validate(dataclasses.replace(config, model=model))


def pin_labels(config: Config, labels: list[str]) -> Config:
    """A ``classification`` run's ``config`` with the dataset's label set pinned into its model's
    config (``trainer.config.hf.labelled_config``: the classifier's outputs, the export's
    ``id2label``); refused, naming both, when the model's config names other labels. Pure: the
    operator pins before launch, the trainer again (the same labels) before building."""
    if config.task.kind != TASK_CLASSIFICATION or config.model.hf_config is None:
        return config
    where = model_label(config)
    model = dataclasses.replace(
        config.model, hf_config=labelled_config(config.model.hf_config, labels, where)
    )
    return dataclasses.replace(config, model=model)


def model_vocab(config: Config) -> int:
    """The model's vocabulary size as the config fixes it (``model.hf_config``'s, else
    ``model.vocab_size``); 0: the dataset tokenizer's."""
    if config.model.hf_config is not None:
        return int(config.model.hf_config["vocab_size"])
    return config.model.vocab_size


def model_shape(config: Config) -> ModelArgs | None:
    """The shape the run's model is counted by (parameters, FLOPs, memory), before it is built:
    the preset's, or a ``model.hf_config``'s (``trainer.config.hf.hf_shape``), with the config's
    vocabulary when it fixes one (else the preset's reference size); None for a ``model.builder``
    model, whose size nothing knows before it is built."""
    if config.model.builder is not None:
        return None
    if config.model.hf_config is not None:
        return hf_shape(config.model.hf_config)
    args = PRESETS[config.model.preset]
    return args.with_vocab(config.model.vocab_size) if config.model.vocab_size else args


def model_label(config: Config) -> str:
    """The run's model as messages name it: ``model.preset 'tiny'``, ``model.hf_config (qwen2)``,
    ``model.builder 'pkg.mod:build'``."""
    model = config.model
    if model.builder is not None:
        return f"model.builder {model.builder!r}"
    if model.hf:
        return f"model.hf {model.hf!r}"
    if model.hf_config is not None:
        return f"model.hf_config ({model.hf_config.get('model_type')})"
    return f"model.preset {model.preset!r}"


def check_init_model(config: Config, value: str) -> None:
    """Raise ConfigError when ``init.from=value`` (a folder's URI) cannot load into the run's
    model: warm start loads a Hugging Face Llama folder into a preset's model, or a Hugging Face
    folder of the run's own model (a promoted version of it) into a ``model.hf_config`` or
    ``model.hf`` model; never into a ``model.builder`` one. Both sides ask before anything is
    read."""
    if config.model.builder is not None:
        raise ConfigError(
            f"init.from={value!r} needs a built-in preset (model.preset): a model.builder model has no "
            "Hugging Face Llama layout to load; unset model.builder or set init.from=none"
        )


def init_source(value: str) -> str:
    """The kind of an ``init.from`` value: ``none``, ``production`` (``auto`` and
    ``production``, which the operator resolves) or ``uri``; ConfigError naming the value
    otherwise. Pure: whether the folder exists and fits is checked before launch."""
    if value == INIT_NONE:
        return INIT_NONE
    if value in (INIT_AUTO, INIT_PRODUCTION):
        return INIT_PRODUCTION
    if value.startswith(INIT_SCHEMES) and value.split("://", 1)[1].strip("/") and value.strip() == value:
        return "uri"
    raise ConfigError(
        f"init.from: expected none, auto, production or the file:// or s3:// URI of a Hugging Face "
        f"Llama folder (config.json and model.safetensors), got {value!r}; e.g. "
        "init.from=s3://bucket/models/retrain-lm/versions/3/"
    )


def _auto_or_count(key: str, value: str) -> int | None:
    """None for ``"auto"``, else the positive whole number ``value`` spells; ConfigError otherwise."""
    if value == "auto":
        return None
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise ConfigError(f"{key}: expected auto or a whole number of at least 1, got {value!r}")


def replicate_degree(setting: str, world_size: int, local_world_size: int) -> int:
    """How many replicas of the sharded model ``parallel.replicate`` gives on ``world_size`` ranks,
    ``local_world_size`` of them per node (torchrun's ``$WORLD_SIZE`` and ``$LOCAL_WORLD_SIZE``).

    ``auto`` is the number of nodes when there are several nodes of several ranks each (HSDP:
    shard inside a node, replicate across nodes), else 1 (flat FSDP). A number must divide the
    world size. Pure, so the operator can check a config against a gang before launching it.
    """
    count = _auto_or_count("parallel.replicate", setting)
    if count is None:
        nodes, rest = divmod(world_size, max(local_world_size, 1))
        return nodes if not rest and nodes > 1 and local_world_size > 1 else 1
    if world_size % count:
        raise ConfigError(
            f"parallel.replicate={count} does not divide the world size {world_size}: HSDP needs "
            f"{count} equal groups of ranks; set parallel.replicate to a divisor of {world_size}, or auto"
        )
    return count


def float_keys() -> list[str]:
    """Every dotted key that holds a float: each must be finite (NaN and infinity train nothing)."""
    floats = []
    for key in all_keys():
        section, _, name = key.rpartition(".")
        owner = _hint(Config, section) if section else Config
        if _hint(owner, attribute_name(name)) is float:
            floats.append(key)
    return floats


BUILDER_EXAMPLE = "custom_model:build"
USER_METRIC_EXAMPLE = "team_metrics:score"


def builder_parts(builder: object) -> tuple[str, str]:
    """``(module, function)`` of a ``model.builder`` value (``package.module:function``, every
    part a Python identifier); ConfigError naming the value otherwise. Pure: whether the module
    can be imported is for the trainer (and, where it can look, the operator) to find out."""
    return function_parts("model.builder", builder, BUILDER_EXAMPLE)


def config_from_mapping(data: Mapping[str, Any], source: str = "trainer_config") -> Config:
    """Defaults < ``data`` (nested keys, as a config file holds them), validated: what
    :func:`load_config` gives for a file holding ``data``, with no file and no yaml."""
    config = Config()
    _apply(config, dict(data), source)
    return validate(config)


def samples_in(tokens: int, seq_len: int) -> int:
    """Training samples in a split of ``tokens`` tokens: windows of ``seq_len + 1`` tokens that
    start at multiples of ``seq_len`` (``trainer.data`` reads them so)."""
    return max(0, (tokens - 1) // seq_len)


def check_data_fit(
    config: Config,
    *,
    train_tokens: int,
    tokenizer_vocab: int,
    world_size: int,
    dataset_task: str = TASK_CAUSAL_LM,
    train_records: int | None = None,
    labels: list[str] | None = None,
) -> None:
    """Raise ConfigError when the dataset ``config.data_uri`` cannot feed ``config`` on
    ``world_size`` ranks: staged for another task, a model vocabulary smaller than the
    tokenizer's, a window (``train.seq_len + 1`` tokens) longer than the train split, or fewer
    samples than one micro-batch takes (a record task's samples are its ``train_records``), or
    (``classification``) a model whose config names other ``labels`` than the dataset's.
    Pure: the numbers come from the dataset's manifest, so the operator can refuse before
    launching and the trainer before building the model."""
    data, t, vocab = config.data_uri, config.train, model_vocab(config)
    if dataset_task != config.task.kind:
        raise ConfigError(
            f"task.kind={config.task.kind!r}, but dataset {data} was staged for task {dataset_task!r}: "
            f"stage the data for {config.task.kind!r}, or set task.kind={dataset_task}"
        )
    if vocab and vocab < tokenizer_vocab:
        if config.model.hf_config is not None:
            raise ConfigError(
                f"model.hf_config.vocab_size={vocab} is smaller than the vocabulary of the dataset's "
                f"tokenizer ({tokenizer_vocab}, {data}); set it to at least {tokenizer_vocab}, or stage "
                "the data with the model's own tokenizer"
            )
        raise ConfigError(
            f"model.vocab_size={vocab} is smaller than the vocabulary of the dataset's tokenizer "
            f"({tokenizer_vocab}, {data}); set model.vocab_size=0 to take the dataset's, or at least "
            f"{tokenizer_vocab}"
        )
    if dataset_task == TASK_CLASSIFICATION:
        pin_labels(config, list(labels or ()))  # refused when the model names other labels
    if dataset_task in RECORD_TASKS:
        _check_records_fit(config, train_records or 0, world_size)
        return
    window = t.seq_len + 1
    if train_tokens < window:
        fix = (
            f"lower train.seq_len to at most {train_tokens - 1}"
            if train_tokens > 1
            else "lower train.seq_len"
        )
        raise ConfigError(
            f"train.seq_len={t.seq_len} needs windows of {window} tokens, but the train split of {data} "
            f"has only {train_tokens} tokens; {fix}, or stage more data"
        )
    samples, per_micro_step = samples_in(train_tokens, t.seq_len), t.micro_batch_size * world_size
    if samples < per_micro_step:
        raise ConfigError(
            f"the train split of {data} has {train_tokens} tokens, {samples} samples of train.seq_len="
            f"{t.seq_len}, fewer than one micro-step takes (train.micro_batch_size={t.micro_batch_size} x "
            f"world size {world_size} = {per_micro_step}); lower train.seq_len or train.micro_batch_size, "
            "or stage more data"
        )


def _check_records_fit(config: Config, records: int, world_size: int) -> None:
    t, per_micro_step = config.train, config.train.micro_batch_size * world_size
    if records < per_micro_step:
        raise ConfigError(
            f"the train split of {config.data_uri} has {records} records, fewer than one micro-step takes "
            f"(train.micro_batch_size={t.micro_batch_size} x world size {world_size} = {per_micro_step}); "
            "lower train.micro_batch_size, or stage more data"
        )


def accumulation_steps(train: TrainConfig, world_size: int) -> int:
    """Micro-steps per optimizer step on ``world_size`` ranks (pure; the operator can check it too).

    ``train.global_batch_size`` 0 keeps ``train.grad_accum_steps``. Set, the accumulation is
    ``global_batch_size / (micro_batch_size * world_size)``, which must be a whole number.
    """
    per_micro_step = train.micro_batch_size * world_size
    if not train.global_batch_size:
        return train.grad_accum_steps
    steps, rest = divmod(train.global_batch_size, per_micro_step)
    if rest or steps == 0:
        raise ConfigError(
            f"train.global_batch_size={train.global_batch_size} is not a multiple of train.micro_batch_size="
            f"{train.micro_batch_size} x world size {world_size} (= {per_micro_step} samples per micro-step); "
            f"set train.global_batch_size to a multiple of {per_micro_step} or change train.micro_batch_size"
        )
    if train.grad_accum_steps != 1 and train.grad_accum_steps != steps:
        raise ConfigError(
            f"train.grad_accum_steps={train.grad_accum_steps} disagrees with train.global_batch_size="
            f"{train.global_batch_size}, which needs {steps} accumulation steps at train.micro_batch_size="
            f"{train.micro_batch_size} on {world_size} ranks; unset train.grad_accum_steps (the global batch "
            f"decides it) or set train.global_batch_size=0"
        )
    return steps


def parse_override(text: str) -> dict[str, Any]:
    """``a.b=value`` as ``{"a": {"b": value}}``, the value parsed as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like key=value, e.g. train.lr=0.001")
    import yaml  # noqa: PLC0415 (the dataclasses alone need no yaml: see the module docstring)

    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"{key}: cannot parse {raw!r} as a value ({str(exc).splitlines()[0]})") from None
    parts = key.split(".")
    if len(parts) > 2:
        raise _unknown(key)
    return {parts[0]: {parts[1]: value}} if len(parts) == 2 else {key: value}


def read_text(path_or_uri: str) -> str:
    if "://" in path_or_uri:
        try:
            return open_storage(path_or_uri).get(path_or_uri).decode("utf-8")
        except NotFound:
            raise ConfigError(f"config file {path_or_uri!r} does not exist; check --config") from None
    try:
        with open(path_or_uri, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"config file {path_or_uri!r} does not exist; check --config") from None


def load_config(path_or_uri: str | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file (local path or storage URI; None for none), then overrides."""
    import yaml  # noqa: PLC0415 (as above)

    config = Config()
    if path_or_uri:
        try:
            data = yaml.safe_load(read_text(path_or_uri))
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"config file {path_or_uri!r} is not valid YAML: {str(exc).splitlines()[0]}"
            ) from None
        _apply(config, data or {}, path_or_uri)
    for text in overrides:
        _apply(config, parse_override(text), text)
    return validate(config)


def dump_yaml(config: Config) -> str:
    """The resolved config as YAML; :func:`load_config` reads it back to an equal Config."""
    import yaml  # noqa: PLC0415 (as above)

    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def resolved_eval_uris(config: Config) -> tuple[str, str]:
    """(model_uri, output_uri) with the run-relative defaults filled in."""
    layout = RunLayout(config.run_uri)
    return config.eval.model_uri or layout.export, config.eval.output_uri or layout.eval_metrics
