"""Each eval record's own figures, kept beside the report so that a gate can compare two models
on the same records (a paired bootstrap, ``trainops.gate.paired``); pure.

``eval/metrics.json`` holds aggregates; ``eval/metrics.records.json`` (the report's
``records_uri``) holds, for the candidate and the baseline alike, one entry per scored unit,
in the same order for both, so entry ``i`` of one model and entry ``i`` of the other are the
same record:

- a record task (``sft``, ``classification``): a unit is an eval record (``records.bin``);
- ``causal_lm``: a unit is a record of the dataset's eval index (the tokens its span holds).

Columns, each a list with ``null`` for a unit the model did not score (``eval.max_batches``,
a prompt that fills the context):

- ``loss_sum``, ``loss_tokens``: the unit's summed loss and its scored tokens (a classifier:
  the label's cross-entropy, 1), so ``eval_loss`` over any set of units is their ratio of sums;
- ``classification``: ``predicted`` and ``truth``, label indices;
- ``sft``: ``exact`` (1 or 0) and ``token_f1`` of the unit's greedy answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

RECORDS_FORMAT = "trainops.eval-records/v1"
UNIT_RECORD, UNIT_INDEX_RECORD = "eval record", "eval index record"


def records_uri(output_uri: str) -> str:
    """Where the per-record figures of the report at ``output_uri`` go: beside it,
    ``<name>.records.json`` (``eval/metrics.json`` -> ``eval/metrics.records.json``)."""
    stem = output_uri[: -len(".json")] if output_uri.endswith(".json") else output_uri
    return f"{stem}.records.json"


def owner_loss_sums(losses: np.ndarray, owners: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(summed loss, scored tokens)`` of each of ``count`` records from per-position ``losses``
    (NaN: not scored) and each position's record (``owners``, -1: none); NaN for a record with
    no scored token."""
    keep = ~np.isnan(losses) & (owners >= 0)
    sums = np.bincount(owners[keep], weights=losses[keep], minlength=count).astype(np.float64)
    tokens = np.bincount(owners[keep], minlength=count).astype(np.float64)
    empty = tokens == 0
    sums[empty], tokens[empty] = np.nan, np.nan
    return sums, tokens


def record_loss_sums(losses: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(summed loss, scored tokens)`` of each record ``rows`` holds (``(start, length, aux)``)
    from per-position ``losses``; NaN for a record with no scored token."""
    owners = np.full(len(losses), -1, dtype=np.int64)
    for index, (start, length, _) in enumerate(rows.tolist()):
        owners[start : start + length] = index
    return owner_loss_sums(losses, owners, len(rows))


def as_json(values: np.ndarray) -> list[float | None]:
    """A column as JSON numbers: ``null`` for NaN (JSON has no NaN)."""
    return [None if math.isnan(v) else v for v in np.asarray(values, dtype=np.float64).tolist()]


def document(record_task: bool, tables: Sequence[Mapping[str, np.ndarray]], models: Sequence[str]) -> dict:
    """The ``metrics.records.json`` body for the candidate's table and the baseline's (if any),
    naming the ``models`` they are of (a gate pairs only the models it compares)."""
    candidate, *baseline = [{name: as_json(values) for name, values in t.items()} for t in tables]
    return {
        "format": RECORDS_FORMAT,
        "unit": UNIT_RECORD if record_task else UNIT_INDEX_RECORD,
        "count": len(next(iter(candidate.values()), [])),
        "candidate_uri": models[0],
        "baseline_uri": models[1] if len(models) > 1 else None,
        "candidate": candidate,
        "baseline": baseline[0] if baseline else None,
    }
