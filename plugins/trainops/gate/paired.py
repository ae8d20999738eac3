"""A paired bootstrap of candidate minus production over the same eval records; pure (numpy).

On a small evaluation set a drop of a few tenths of a point is noise, and a gate that compares
two raw numbers flaps between runs. ``no_regression`` with ``confidence`` (0.95) asks instead:
resampling the eval records with replacement, the same records for both models each time
(paired: a record both get right or both get wrong moves neither), how far apart can the two
models' figures be? The check rejects only a regression whose whole interval lies beyond the
tolerance; the interval goes into the decision and onto the card.

The per-record figures come from the evaluation's ``records_uri``
(``trainer.evaluate.per_record``): each model's ``loss_sum`` and ``loss_tokens`` (for
``eval_loss`` and ``perplexity``), ``predicted`` and ``truth`` (``accuracy``, ``f1_macro``) and
``exact`` and ``token_f1`` (``exact_match``, ``token_f1``). A unit either model did not score is
left out of both. The resampling is seeded (:data:`SEED`), so the same inputs give the same
interval and the same decision. The interval is the percentile one over :data:`RESAMPLES`
resamples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

SEED = 20261205
RESAMPLES = 2000
# metric -> the per-record columns it is computed from
COLUMNS: dict[str, tuple[str, ...]] = {
    "eval_loss": ("loss_sum", "loss_tokens"),
    "perplexity": ("loss_sum", "loss_tokens"),
    "accuracy": ("predicted", "truth"),
    "f1_macro": ("predicted", "truth"),
    "exact_match": ("exact",),
    "token_f1": ("token_f1",),
}
PAIRED_METRICS = tuple(COLUMNS)


class PairedInputError(ValueError):
    """The per-record figures cannot be paired for a metric; says what is missing."""


@dataclass(frozen=True)
class Interval:
    """Candidate minus production: the full-set difference and its bootstrap interval."""

    difference: float
    low: float
    high: float
    confidence: float
    records: int  # the units both models scored


def _columns(table: Mapping[str, Any], metric: str, side: str) -> dict[str, np.ndarray]:
    import numpy as np

    out = {}
    for name in COLUMNS[metric]:
        values = table.get(name) if isinstance(table, Mapping) else None
        if not isinstance(values, list):
            raise PairedInputError(
                f"the {side}'s per-record figures lack {name!r}, which {metric} is computed from; "
                "re-run EvaluateModelOperator so both models are scored with this trainops"
            )
        out[name] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return out


def _values(metric: str, table: Mapping[str, np.ndarray], rows: np.ndarray, labels: int) -> Any:
    """The metric over each row of resampled unit indices ``rows`` (resamples x units)."""
    import numpy as np

    if metric in ("eval_loss", "perplexity"):
        loss = table["loss_sum"][rows].sum(axis=1) / table["loss_tokens"][rows].sum(axis=1)
        return np.exp(loss) if metric == "perplexity" else loss
    if metric in ("exact_match", "token_f1"):
        return table[COLUMNS[metric][0]][rows].mean(axis=1)
    predicted, truth = table["predicted"][rows].astype(np.int64), table["truth"][rows].astype(np.int64)
    if metric == "accuracy":
        return (predicted == truth).mean(axis=1)
    return _macro_f1(predicted, truth, labels)


def _macro_f1(predicted: np.ndarray, truth: np.ndarray, labels: int) -> np.ndarray:
    """Macro F1 over ``labels`` labels of each row, as the evaluation computes it (a label with
    no record and no prediction counts 0, scikit-learn's ``zero_division=0``)."""
    import numpy as np

    scores = np.zeros(predicted.shape[0])
    for label in range(labels):
        said, real = predicted == label, truth == label
        hits = (said & real).sum(axis=1)
        denominator = said.sum(axis=1) + real.sum(axis=1)
        scores += np.divide(2 * hits, denominator, out=np.zeros_like(scores), where=denominator > 0)
    return scores / labels


def paired_interval(
    metric: str,
    candidate: Mapping[str, Any],
    production: Mapping[str, Any],
    confidence: float,
    labels: int = 0,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """The ``confidence`` bootstrap interval of ``metric``(candidate) - ``metric``(production)
    over the units both scored (``candidate``/``production``: a records document's tables).

    :param labels: a classifier's label count, for ``f1_macro``."""
    import numpy as np

    if metric not in COLUMNS:
        raise PairedInputError(
            f"{metric} has no per-record figures; confidence works for {list(PAIRED_METRICS)}"
        )
    ours, theirs = _columns(candidate, metric, "candidate"), _columns(production, metric, "production")
    if len({len(v) for v in (*ours.values(), *theirs.values())}) != 1:
        raise PairedInputError("the candidate's and production's per-record figures cover different records")
    both = np.all([~np.isnan(v) for v in (*ours.values(), *theirs.values())], axis=0)
    count = int(both.sum())
    if count < 2:
        raise PairedInputError(
            f"only {count} eval record(s) were scored by both models; a bootstrap needs more"
        )
    ours = {k: v[both] for k, v in ours.items()}
    theirs = {k: v[both] for k, v in theirs.items()}
    if metric == "f1_macro":
        labels = max(labels, int(max(v.max() for v in (*ours.values(), *theirs.values()))) + 1)
    everything = np.arange(count)[None, :]
    difference = float(
        _values(metric, ours, everything, labels)[0] - _values(metric, theirs, everything, labels)[0]
    )
    rows = np.random.default_rng(seed).integers(0, count, size=(resamples, count))
    spread = _values(metric, ours, rows, labels) - _values(metric, theirs, rows, labels)
    tail = (1 - confidence) / 2
    low, high = np.quantile(spread, [tail, 1 - tail])
    return Interval(difference, float(low), float(high), confidence, count)


def regressed(interval: Interval, lower_is_better: bool, allowed: float) -> bool:
    """Whether the whole interval lies beyond the allowed change (``allowed`` >= 0, in the
    metric's units): above ``+allowed`` for a lower-is-better metric, below ``-allowed`` else."""
    return interval.low > allowed if lower_is_better else interval.high < -allowed


def label_count(candidate: Mapping[str, Any]) -> int:
    """A classifier's label count from its report (``per_label`` or ``confusion``), else 0."""
    confusion = candidate.get("confusion")
    if isinstance(confusion, Mapping) and isinstance(confusion.get("labels"), Sequence):
        return len(confusion["labels"])
    per_label = candidate.get("per_label")
    return len(per_label) if isinstance(per_label, Mapping) else 0
