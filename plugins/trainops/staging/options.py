"""Staging options checked before any I/O: cheap and import-free, so an operator can call
them at DAG-parse time and a bad value fails the DAG file, not a task hours later."""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainer.contract import TASK_CAUSAL_LM, TASK_CLASSIFICATION, TASK_SFT, check_name

RESERVED_INDEX_KEYS = ("id", "start", "end")
DEFAULT_QUARANTINE_SAMPLE_ROWS = 100
URI_SCHEMES = ("file://", "s3://")


def check_dataset_name(name: object) -> str:
    """A dataset name: one folder under ``<root>/datasets/``; ValueError naming it otherwise.
    ``.`` and ``..`` are path steps, not names (``..`` would write beside ``datasets/``), and a
    dataset name holds no ``/`` (it names one folder, not a path). Otherwise it is a name as
    :func:`trainer.contract.check_name` has it, as a model's is: at most 128 characters, no
    control or invisible characters, no whitespace at either end."""
    if not isinstance(name, str):
        raise ValueError(f"dataset_name must be a string such as 'demo', got {name!r}")
    if not name.strip():
        raise ValueError(f"dataset_name {name!r} is empty: give the dataset a name such as 'demo'")
    if name in (".", ".."):
        raise ValueError(
            f"dataset_name {name!r} is a path step, not a name (it would be stored outside datasets/): "
            "give the dataset a name such as 'demo'"
        )
    if "/" in name or "\\" in name:
        instead = re.sub(r"[\\/]+", "-", name).strip("-") or "demo"
        raise ValueError(
            f"dataset_name {name!r} holds a path separator, but a dataset name is one folder under "
            f"datasets/: use '-' instead, such as {instead!r}"
        )
    return check_name(name, "dataset_name")


def check_options(*, eval_percent: int, shard_tokens: int, slice_columns: Sequence[str]) -> None:
    """Reject bad split, shard and slice options."""
    if isinstance(eval_percent, bool) or not isinstance(eval_percent, int) or not (1 <= eval_percent <= 50):
        raise ValueError(f"eval_percent must be an integer from 1 to 50, got {eval_percent!r}")
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"shard_tokens must be a positive integer, got {shard_tokens!r}")
    if isinstance(slice_columns, str):
        raise ValueError(f"slice_columns must be a list of column names, got the string {slice_columns!r}")
    for col in slice_columns:
        if not isinstance(col, str) or col in RESERVED_INDEX_KEYS:
            raise ValueError(
                f"slice column {col!r} is not allowed: use a column name other than "
                f"{', '.join(RESERVED_INDEX_KEYS)}"
            )


def check_quarantine(quarantine: dict | None) -> dict | None:
    """``None`` (bad rows fail the task) or ``{"max_fraction": f, "sample_rows": n}``.

    ``max_fraction`` is the largest share of the rows read that may be dropped, 0 <= f < 1;
    ``sample_rows`` how many dropped rows are written aside for people to look at.
    """
    if quarantine is None:
        return None
    if not isinstance(quarantine, dict):
        raise ValueError(
            f"quarantine must be None or a dict such as {{'max_fraction': 0.01}}, got {quarantine!r}"
        )
    unknown = set(quarantine) - {"max_fraction", "sample_rows"}
    if unknown:
        raise ValueError(
            f"quarantine has unknown keys {sorted(unknown)}: use 'max_fraction' and 'sample_rows'"
        )
    if "max_fraction" not in quarantine:
        raise ValueError(
            "quarantine needs 'max_fraction', the largest share of rows that may be "
            "dropped, e.g. {'max_fraction': 0.01}"
        )
    fraction = quarantine["max_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (0 <= fraction < 1):
        raise ValueError(
            f"quarantine max_fraction must be a number from 0 up to (not including) 1, got {fraction!r}"
        )
    sample = quarantine.get("sample_rows", DEFAULT_QUARANTINE_SAMPLE_ROWS)
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(f"quarantine sample_rows must be a non-negative integer, got {sample!r}")
    return {"max_fraction": float(fraction), "sample_rows": sample}


def check_tokenizer(tokenizer: str | dict | None) -> dict:
    """``{"kind": "byte"}`` or ``{"kind": "huggingface", "uri": ..., "eos_token": ...}``.

    Accepts ``None`` or ``"byte"`` (the built-in byte-level tokenizer), the URI of a Hugging
    Face ``tokenizer.json``, or ``{"uri": ..., "eos_token": ...}`` to name the end-of-record
    token (by default the first of ``</s>``, ``<|endoftext|>``, ``<eos>`` the vocabulary has).
    """
    if tokenizer is None or tokenizer == "byte":
        return {"kind": "byte"}
    spec = {"uri": tokenizer} if isinstance(tokenizer, str) else tokenizer
    if not isinstance(spec, dict):
        raise ValueError(f"tokenizer must be None, 'byte', a tokenizer.json URI or a dict, got {tokenizer!r}")
    unknown = set(spec) - {"uri", "eos_token"}
    if unknown:
        raise ValueError(f"tokenizer has unknown keys {sorted(unknown)}: use 'uri' and 'eos_token'")
    uri = spec.get("uri")
    if not isinstance(uri, str) or not uri.startswith(URI_SCHEMES):
        raise ValueError(
            f"tokenizer uri must be a file:// or s3:// URI of a Hugging Face tokenizer.json, got {uri!r}"
        )
    eos = spec.get("eos_token")
    if eos is not None and (not isinstance(eos, str) or not eos):
        raise ValueError(f"tokenizer eos_token must be a non-empty string, got {eos!r}")
    return {"kind": "huggingface", "uri": uri, "eos_token": eos}


ENGINES = ("worker", "spark")


def check_engine(engine: object, *, spark_remote: object = None) -> str:
    """``"worker"`` (the default: one process in the worker or a staging job) or ``"spark"``;
    ValueError naming the value otherwise, or for an option the chosen engine does not use."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    if spark_remote is not None:
        if engine != "spark":
            raise ValueError(
                f"spark_remote {spark_remote!r} is only used with engine='spark', got {engine!r}"
            )
        if not isinstance(spark_remote, str) or not spark_remote.startswith("sc://"):
            raise ValueError(
                f"spark_remote must be a Spark Connect URL such as 'sc://spark-connect:15002', got {spark_remote!r}"
            )
    return engine


STAGED_TASKS = (TASK_CAUSAL_LM, TASK_SFT, TASK_CLASSIFICATION)  # what staging can stage a source for
DEFAULT_SLICE_COLUMNS = {TASK_CAUSAL_LM: ("source",), TASK_SFT: (), TASK_CLASSIFICATION: ()}


def check_labels(labels: object, task: object) -> list[str] | None:
    """A classification's fixed label set (None: the data's); ValueError naming the value and
    what to do otherwise. The order given is the labels' indices, the classifier's outputs."""
    if labels is None:
        return None
    if task != TASK_CLASSIFICATION:
        raise ValueError(f"labels {labels!r} are only used with task='classification', got task {task!r}")
    if (
        isinstance(labels, (str, bytes))
        or not isinstance(labels, (list, tuple))
        or len(labels) < 2
        or not all(isinstance(label, str) and label for label in labels)
        or len(set(labels)) != len(labels)
    ):
        raise ValueError(
            f"labels must be a list of two or more distinct, non-empty label names, got {labels!r}"
        )
    return list(labels)


def check_task(task: object, engine: str) -> str:
    """A task staging can stage for (``trainer.contract.tasks``) on ``engine``; ValueError naming
    the value and what to do otherwise."""
    if task not in STAGED_TASKS:
        raise ValueError(f"task {task!r} cannot be staged: pick one of {', '.join(STAGED_TASKS)}")
    if task != TASK_CAUSAL_LM and engine != "worker":
        raise ValueError(
            f"task {task!r} stages on the worker engine only for now: set engine='worker' (a source "
            "over job_threshold_bytes still stages as a job)"
        )
    return str(task)
