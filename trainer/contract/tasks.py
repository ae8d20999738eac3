"""The run contract, part 7: tasks, what a staged dataset's samples are and how they are scored.

- ``causal_lm`` (the default; a manifest without ``task`` is one): the split's token stream cut
  into windows of ``train.seq_len + 1`` tokens, every token a target.
- ``sft``: prompt/response records. Each is one sample, never split across samples nor packed
  with another: its tokens (prompt, response, end of text), truncated to ``seq_len + 1`` and
  padded; only the response's tokens are targets.
- ``classification``: text/label records, each one sample (its first ``seq_len`` tokens, the
  rest padding the model does not attend to), one cross-entropy over the labels per record. The
  label set is the manifest's ``task.labels`` (their order fixes each label's index, the
  classifier's output row, and the exported model's ``id2label``).

A record task's split lists its records beside its shards: ``splits.<split>.records`` =
``{"path": "<split>/records.bin", "count": n, "sha256": ...}``, a little-endian int64 array of
``n`` rows ``(start, length, aux)``: the record's first token in the split's stream, its tokens,
and ``aux``, the prompt's tokens (``sft``) or the label's index (``classification``). The
manifest's ``task`` is ``{"kind": ...}``, with ``"labels": [...]`` for ``classification``.

An ``sft`` dataset staged with a tokenizer whose folder holds a chat template records its sha256
in the manifest's ``tokenizer.chat_template_sha256``; :func:`chat_template_text` is where both
sides find that template (staging to render records, the export to ship it). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

TASK_CAUSAL_LM = "causal_lm"
TASK_SFT = "sft"
TASK_CLASSIFICATION = "classification"
TASK_KINDS = (TASK_CAUSAL_LM, TASK_SFT, TASK_CLASSIFICATION)
RECORD_TASKS = (TASK_SFT, TASK_CLASSIFICATION)  # one record, one sample
RECORD_FIELDS = ("start", "length", "aux")  # the columns of records.bin
RECORDS_DTYPE = "<i8"
# The metrics an evaluation reports of its own (``trainer evaluate``; the gate's table,
# ``trainops.gate.metrics``, says which way each is better), and the report's other figures: a
# team's own metric (``eval.metrics``) may take none of these names.
BUILTIN_METRICS = (
    "accuracy",
    "f1_macro",
    "auroc",
    "calibration_error",
    "exact_match",
    "token_f1",
    "eval_loss",
    "perplexity",
)
# A metric's name, a team's own included: what a gate check, a page and a YAML file all spell.
METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
EVAL_REPORT_KEYS = (
    "model_uri",
    "tokens",
    "records",
    "answers",
    "per_label",
    "confusion",
    "slices",
    "user_metrics",
)
# The gate's per-slice table's own columns (trainops.gate.slices): a slice row holds them beside
# each metric, so a metric may not be named like one.
SLICE_TABLE_KEYS = ("slice", "slice_column")
IGNORE_INDEX = -100  # a target position that carries no loss (a prompt's token, padding)
# Where a Hugging Face tokenizer folder keeps its chat template, as transformers reads it.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def dataset_task(manifest: Mapping[str, Any]) -> str:
    """The task a dataset was staged for (``causal_lm`` when its manifest names none);
    ValueError for a kind this trainer does not know."""
    task = manifest.get("task")
    kind = task.get("kind", TASK_CAUSAL_LM) if isinstance(task, Mapping) else TASK_CAUSAL_LM
    if kind not in TASK_KINDS:
        raise ValueError(
            f"the dataset was staged for task {kind!r}, which this trainer does not know "
            f"({', '.join(TASK_KINDS)}); stage it again, or upgrade the trainer"
        )
    return str(kind)


def split_records(manifest: Mapping[str, Any], split: str) -> Mapping[str, Any] | None:
    """A record task's ``splits.<split>.records`` entry; None for a token-stream dataset."""
    info = (manifest.get("splits") or {}).get(split) or {}
    records = info.get("records") if isinstance(info, Mapping) else None
    return records if isinstance(records, Mapping) else None


def task_labels(manifest: Mapping[str, Any]) -> list[str] | None:
    """A ``classification`` dataset's label set (:func:`dataset_labels`); None for another task."""
    return dataset_labels(manifest) if dataset_task(manifest) == TASK_CLASSIFICATION else None


def dataset_labels(manifest: Mapping[str, Any]) -> list[str]:
    """A ``classification`` dataset's label set, in index order; ValueError naming what is wrong
    when its manifest has none (or not a list of distinct strings)."""
    task = manifest.get("task")
    labels = task.get("labels") if isinstance(task, Mapping) else None
    if (
        not isinstance(labels, list)
        or len(labels) < 2
        or not all(isinstance(label, str) and label for label in labels)
        or len(set(labels)) != len(labels)
    ):
        raise ValueError(
            f"the dataset was staged for classification but its manifest's task.labels is {labels!r}, "
            "not a list of two or more distinct label names; stage it again"
        )
    return list(labels)


def chat_template_text(tokenizer_config: Mapping[str, Any], jinja: bytes | None) -> str | None:
    """The chat template a tokenizer folder holds, as transformers picks it: the text of its
    ``chat_template.jinja`` (``jinja``, None when there is none), else ``tokenizer_config.json``'s
    ``chat_template`` (a string, or a list of named templates: the one named ``default``); None
    when it has none."""
    if jinja is not None:
        return jinja.decode("utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def metric_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a team's own metric (None: it can): the form every page, YAML
    file and gate check can spell, and none of the names the evaluation or the gate's per-slice
    table use themselves (a built-in metric, a report key, ``production_*``, ``*_ratio``)."""
    if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
        return "a metric name is a letter, then letters, digits or underscores (at most 64)"
    if (
        name in BUILTIN_METRICS
        or name in EVAL_REPORT_KEYS
        or name in SLICE_TABLE_KEYS
        or name.startswith("production_")
        or name.endswith("_ratio")
    ):
        return f"{name!r} is a name the evaluation or the gate uses itself"
    return None
