"""The retraining settings: one schema for the trigger form, the Variable and the run plan.

Settings are the same thirteen keys wherever they come from: the ``retrain_manual`` form (DAG
params), or the ``trainops_retrain`` Variable for the unattended DAGs. Every key has a default
that runs on the embedded default (``file://`` storage, the local cluster, a tiny model).

DAG files import this module when they are parsed: the heavy libraries it needs (jsonschema)
are imported inside the functions the tasks call (pyproject's banned-module-level-imports).
"""

from __future__ import annotations

import difflib
import re

from airflow.sdk import Param, Variable

from trainer.contract import join
from trainer.presets import PRESETS
from trainops.cluster.spec import CAPACITIES, MAX_RESTARTS_IN_PLACE
from trainops.recipes.pipeline import gate_checks
from trainops.settings import (
    SettingsError,  # raised here; imported from here as before
    resolve_storage_root,
)

DEMO_DATASET = "demo-text"
# The Airflow Variable (JSON) holding the unattended DAGs' settings; any key may be left out.
SETTINGS_VARIABLE = "trainops_retrain"

# One entry per setting: its JSON schema (what the form shows and Airflow validates when a run
# is triggered), title and description. `dataset_uri`'s default depends on the storage root,
# so it is filled in by `defaults()`.
SETTINGS: dict[str, dict] = {
    "dataset_uri": {
        "schema": {
            "type": "string",
            "pattern": r"^(file:///|s3://[^/\s]+)\S*$",
            "minLength": 8,
            "maxLength": 2048,
        },
        "title": "Raw data to train on",
        "description": "Parquet, JSONL or CSV at a file:///abs/path or s3://bucket/prefix URI: "
        "one object, a prefix or a glob. It is validated and staged before "
        "training. The default is the demo dataset under the storage root, "
        "generated on first use.",
    },
    "model_preset": {
        "schema": {"type": "string", "enum": list(PRESETS)},
        "default": "tiny",
        "title": "Model size",
        "description": "A built-in Llama-style preset (python -m trainer presets). 'tiny' "
        "trains in seconds on a CPU; the larger ones need GPUs.",
    },
    "hf_model": {
        "schema": {"type": "string", "pattern": r"^$|^(file:///|s3://[^/\s]+/)\S+$", "maxLength": 2048},
        "default": "",
        "title": "Hugging Face model",
        "description": "Empty: train the preset above. Else the file:/// or s3:// URI of a Hugging "
        "Face folder (config.json, safetensors weights, tokenizer files) of a Llama, Mistral or "
        "Qwen2 causal LM, or of a BERT or RoBERTa classifier: training starts from its weights (the "
        "trainer's model.hf), the data is tokenized with its tokenizer.json, and 'Warm start' auto "
        "or production starts from the production version of this model instead. Checked before "
        "launch: the family, the shape, the weights, the labels, and a vocabulary that holds the "
        "dataset's tokenizer.",
    },
    "task": {
        "schema": {"type": "string", "enum": ["causal_lm", "sft", "classification"]},
        "default": "causal_lm",
        "title": "Task",
        "description": "What the model learns from the raw data. causal_lm: next-token loss on a "
        "'text' column. sft: instruction tuning on 'prompt' and 'response' columns, the loss on the "
        "responses (with the tokenizer's chat template when it has one). classification: a 'text' "
        "and a 'label' column, for a BERT or RoBERTa 'Hugging Face model'; accuracy and F1 in "
        "the evaluation. Every source also needs an 'id' column.",
    },
    "nodes": {
        "schema": {"type": "integer", "minimum": 1, "maximum": 64},
        "default": 1,
        "title": "Nodes",
        "description": "Nodes (pods) in the training gang, 1 to 64. On the local cluster "
        "each node is a process group on this host.",
    },
    "gpus_per_node": {
        "schema": {"type": "integer", "minimum": 0, "maximum": 16},
        "default": 0,
        "title": "GPUs per node",
        "description": "0 to 16. 0 trains on CPU, one process per node (gloo); the local "
        "cluster has no GPUs unless this host has them.",
    },
    "capacity": {
        "schema": {"type": "string", "enum": list(CAPACITIES)},
        "default": "spot",
        "title": "Capacity",
        "description": "spot (cheap, can be preempted: the job resumes from its last "
        "checkpoint), on-demand, or spot-then-on-demand (moves to on-demand "
        "after repeated preemptions).",
    },
    "max_preemptions": {
        "schema": {"type": "integer", "minimum": 0, "maximum": 100},
        "default": 3,
        "title": "Preemption budget",
        "description": "Relaunches after spot preemptions before the training task fails, "
        "0 to 100. Separate from Airflow's task retries.",
    },
    "restarts_in_place": {
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_RESTARTS_IN_PLACE},
        "default": 2,
        "title": "Restarts in place",
        "description": f"How often a node's crashed worker processes restart in the same pods, "
        f"0 to {MAX_RESTARTS_IN_PLACE}, before the whole gang is relaunched: the gang resumes in "
        "seconds from its newest checkpoint, read from the node's own disk where it holds it. 0 "
        "relaunches the gang on every failure. A preempted or lost node always relaunches it.",
    },
    "lr": {
        "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "default": 0.003,
        "title": "Learning rate",
        "description": "Peak AdamW learning rate, above 0 and at most 1; linear warmup, then "
        "cosine decay to a tenth of it.",
    },
    "max_steps": {
        "schema": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "default": 60,
        "title": "Training steps",
        "description": "Optimizer steps, 1 to 1,000,000. The default trains the tiny model in seconds.",
    },
    "warm_start": {
        "schema": {
            "type": "string",
            "pattern": r"^(auto|none|production|(file:///|s3://[^/\s]+/)\S+)$",
            "maxLength": 2048,
        },
        "default": "auto",
        "title": "Warm start",
        "description": "The weights training starts from (the trainer's init.from): auto (the "
        "production model when there is one, else random), production (it must exist), none "
        "(random), or the file:/// or s3:// URI of a promoted version or any Hugging Face Llama "
        "folder. Weights only: optimizer and schedule start fresh. Checked before launch: shape, "
        "vocabulary and tokenizer must match the run's.",
    },
    "dry_run": {
        "schema": {"type": "boolean"},
        "default": False,
        "title": "Dry run",
        "description": "Only render what would be launched (the job spec, the resolved "
        "trainer config and the Kubernetes manifests) into the task log; "
        "stage, train, evaluate and promote nothing.",
    },
}


def demo_source_uri(root: str | None = None) -> str:
    """``<storage root>/raw/demo-text``: where the demo data lives (the demo DAG's too)."""
    return join(resolve_storage_root(root), "raw", DEMO_DATASET)


def defaults(root: str | None = None) -> dict:
    """Every setting's default value; ``dataset_uri`` is the demo data under the storage root."""
    values = {key: spec.get("default") for key, spec in SETTINGS.items()}
    values["dataset_uri"] = demo_source_uri(root)
    return values


def manual_params(root: str | None = None) -> dict[str, Param]:
    """The ``retrain_manual`` form: one Param per setting, with title, description and schema."""
    values = defaults(root)
    return {
        key: Param(values[key], title=spec["title"], description=spec["description"], **spec["schema"])
        for key, spec in SETTINGS.items()
    }


def check_settings(
    values: dict | None, *, source: str, allowed=tuple(SETTINGS), root: str | None = None
) -> dict:
    """``values`` over the defaults, validated against the settings' schemas.

    An unknown key (with the nearest known one) or an invalid value raises SettingsError
    naming ``source`` and the key. Airflow checks a triggered run's params itself, but it
    accepts keys it does not know, and Variables are not checked at all.
    """
    import jsonschema

    values = dict(values or {})
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        hints = [
            f"{k!r}"
            + (
                f" (did you mean {close[0]!r}?)"
                if (close := difflib.get_close_matches(k, allowed, n=1))
                else ""
            )
            for k in unknown
        ]
        raise SettingsError(
            f"{source}: unknown setting(s) {', '.join(hints)}; known settings: {', '.join(allowed)}"
        )
    merged = {**{k: v for k, v in defaults(root).items() if k in allowed}, **values}
    for key, value in merged.items():
        try:
            jsonschema.validate(value, SETTINGS[key]["schema"])
        except jsonschema.ValidationError as exc:
            raise SettingsError(f"{source}: {key}={value!r} is invalid: {exc.message}") from None
    if merged.get("task") == "classification" and not merged.get("hf_model"):
        raise SettingsError(
            f"{source}: task='classification' trains a Hugging Face BERT or RoBERTa classifier, but "
            "hf_model is empty (the presets are causal LMs): set hf_model to the classifier's folder"
        )
    return merged


def dataset_name_for(uri: str) -> str:
    """The dataset name staging files a raw URI under: its last path segment before any glob
    (``s3://raw/tickets/2026-*/*.parquet`` -> ``tickets``; ``.../demo-text`` -> ``demo-text``),
    without a file extension."""
    path = uri.split("://", 1)[-1]
    segments = [s for s in path.split("/") if s]
    segments = segments[1:] if uri.startswith("s3://") else segments  # not the bucket
    plain = []
    for segment in segments:
        if any(c in segment for c in "*?["):
            break
        plain.append(segment)
    if not plain:
        raise SettingsError(
            f"cannot name a dataset after {uri!r}: give a prefix with at least "
            "one path segment before any glob (s3://bucket/name/...)"
        )
    name = re.sub(r"\.(parquet|jsonl|json|csv)$", "", plain[-1])
    return re.sub(r"[^A-Za-z0-9._=-]", "_", name)


def trainer_config(
    model_preset: str,
    lr: float,
    max_steps: int,
    warm_start: str = "none",
    hf_model: str = "",
    task: str = "causal_lm",
) -> dict:
    """The trainer config for a retraining run: small batches of 64-token windows, bf16,
    a warmup of a tenth of the run (at most 100 steps), a checkpoint every quarter of the run
    (every 10 to 200 steps), so a preemption costs at most that many steps; ``warm_start`` is
    ``init.from`` (the training operator resolves ``auto`` and ``production``). ``hf_model``
    (``model.hf``) replaces the preset and starts from its own weights, or from a version of the
    same model that ``warm_start`` names (production, with ``auto``, once there is one): the
    trainer's rule checks it is that model before launch. ``task`` is ``task.kind``."""
    return {
        "init": {"from": warm_start},
        "task": {"kind": task},
        "precision": "bf16",
        "model": {"hf": hf_model} if hf_model else {"preset": model_preset},
        "train": {
            "max_steps": max_steps,
            "micro_batch_size": 8,
            "seq_len": 64,
            "lr": lr,
            "warmup_steps": min(100, max_steps // 10),
        },
        "checkpoint": {"every_steps": min(200, max(10, max_steps // 4)), "keep": 2},
        "metrics": {"flush_every": min(10, max_steps)},
    }


def training_kwargs(settings: dict) -> dict:
    """The training operator's run-time arguments (templated fields, fed from the plan task's
    XCom): ``nodes``, ``gpus_per_node``, ``capacity``, ``max_preemptions``,
    ``restarts_in_place``, ``trainer_config``;
    and the gate's ``gate_checks`` for the run's task (:func:`.pipeline.gate_checks`)."""
    return {
        "nodes": settings["nodes"],
        "gpus_per_node": settings["gpus_per_node"],
        "capacity": settings["capacity"],
        "max_preemptions": settings["max_preemptions"],
        "restarts_in_place": settings["restarts_in_place"],
        "trainer_config": trainer_config(
            settings["model_preset"],
            settings["lr"],
            settings["max_steps"],
            settings.get("warm_start", "none"),
            settings.get("hf_model", ""),
            settings.get("task", "causal_lm"),
        ),
        "gate_checks": gate_checks(settings.get("task", "causal_lm")),
        **staging_kwargs(settings),
    }


def staging_kwargs(settings: dict) -> dict:
    """The staging operator's run-time arguments: ``task``, and ``tokenizer``, the Hugging Face
    model's own ``tokenizer.json`` (None: the built-in byte tokenizer of the presets), so the data
    is tokenized as the model reads it (the training operator checks it before launch)."""
    hf_model = settings.get("hf_model", "")
    return {
        "task": settings.get("task", "causal_lm"),
        "tokenizer": join(hf_model, "tokenizer.json") if hf_model else None,
    }


def plan_run(settings: dict) -> dict:
    """What a run will do, from checked settings: the raw data, the dataset name it is staged
    as, whether it is a dry run, and the training arguments (:func:`training_kwargs`)."""
    return {
        "dataset_uri": settings["dataset_uri"],
        "dataset_name": dataset_name_for(settings["dataset_uri"]),
        "dry_run": bool(settings.get("dry_run", False)),
        **training_kwargs(settings),
    }


def variable_settings(*, allowed) -> dict:
    """The ``trainops_retrain`` Variable (JSON; absent: all defaults), checked like the form:
    only ``allowed`` keys, each valid. Called in a task, never at parse time."""
    value = Variable.get(SETTINGS_VARIABLE, default=None, deserialize_json=True)
    if value is not None and not isinstance(value, dict):
        raise SettingsError(
            f"Variable {SETTINGS_VARIABLE}: expected a JSON object of settings, got {value!r}"
        )
    return check_settings(value, source=f"Variable {SETTINGS_VARIABLE}", allowed=allowed)
