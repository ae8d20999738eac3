"""A team's own evaluation metrics for trainops (``eval.metrics``; docs/promotion.md).

List them as ``EvaluateModelOperator(metrics=["team_metrics:worst_label_recall"])`` (or the
trainer config's ``eval.metrics``) with this folder on the evaluation job's ``PYTHONPATH``, or
the module installed in the trainer image. The evaluation calls each function over every scored
eval record, then over each slice's records, as::

    function(predictions, references, records) -> {"name": number, ...}

``predictions`` and ``references`` are a classifier's label names or an ``sft`` model's answers
as text, one per record; ``records`` are the records' eval index columns (``id``, slice
columns). Each returned name becomes a metric the gate can check; a check on it says which way
is better, e.g. ``{"kind": "threshold", "metric": "worst_label_recall",
"direction": "higher_is_better", "op": ">=", "value": 0.8}``.

Plain Python, no trainops import: a scorer is the team's code, tested on its own.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def worst_label_recall(
    predictions: list[str], references: list[str], records: list[dict]
) -> dict[str, float]:
    """A classifier's recall on the label it finds hardest (higher is better): a model that is
    right on average but misses one class every time is caught here, not by accuracy."""
    recalls = []
    for label in sorted(set(references)):
        hits = [p == r for p, r in zip(predictions, references, strict=True) if r == label]
        recalls.append(sum(hits) / len(hits))
    return {"worst_label_recall": min(recalls)}


def normalize(text: str) -> list[str]:
    """SQuAD's answer normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return _ARTICLES.sub(" ", text).split()


def word_f1(predictions: list[str], references: list[str], records: list[dict]) -> dict[str, float]:
    """SQuAD's exact match and F1 over normalized words (higher is better for both): what a QA
    team reports, where trainops' own ``token_f1`` counts the tokenizer's tokens."""
    exact, f1 = [], []
    for prediction, reference in zip(predictions, references, strict=True):
        said, truth = normalize(prediction), normalize(reference)
        exact.append(float(said == truth))
        common = sum((Counter(said) & Counter(truth)).values())
        if not said or not truth:
            f1.append(float(said == truth))
        elif not common:
            f1.append(0.0)
        else:
            precision, recall = common / len(said), common / len(truth)
            f1.append(2 * precision * recall / (precision + recall))
    count = max(len(exact), 1)
    return {"word_exact_match": sum(exact) / count, "word_f1": sum(f1) / count}
