"""The evaluation's arithmetic over plain arrays, no model and no I/O: token windows and their
owners, loss summaries per slice, a classifier's figures (accuracy, macro F1, each label's,
the confusion matrix, calibration, AUROC) and an answer's exact match and token F1."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Answer:
    """A greedy answer to an eval prompt and its reference, as token ids."""

    tokens: list[int]
    reference: list[int]


def eval_windows(total_tokens: int, seq_len: int) -> list[tuple[int, int]]:
    """``[start, stop)`` token windows covering the split; the last one may be shorter."""
    return [
        (start, min(start + seq_len + 1, total_tokens))
        for start in range(0, max(0, total_tokens - 1), seq_len)
    ]


def token_owners(records: list[dict], total_tokens: int) -> np.ndarray:
    """For each token position, the index of the record whose span holds it (-1: none)."""
    owners = np.full(total_tokens, -1, dtype=np.int64)
    for index, record in enumerate(records):
        owners[max(0, record["start"]) : min(total_tokens, record["end"])] = index
    return owners


def summary(losses: np.ndarray) -> dict:
    """Mean loss and perplexity; None for no tokens (JSON has no NaN)."""
    tokens = int(losses.size)
    if not tokens:
        return {"eval_loss": None, "perplexity": None, "tokens": 0}
    mean = float(losses.mean())
    return {"eval_loss": mean, "perplexity": math.exp(mean), "tokens": tokens}


def slice_summaries(losses: np.ndarray, owners: np.ndarray, records: list[dict], columns: list[str]) -> dict:
    """``{column: {value: summary}}`` over the positions where ``losses`` is not NaN."""
    scored = ~np.isnan(losses)
    out = {}
    for column in columns:
        values = np.array([str(r.get(column)) for r in records] + ["<none>"], dtype=object)
        per_token = values[owners]  # owner -1 picks "<none>", the padding entry
        out[column] = {
            value: summary(losses[scored & (per_token == value)]) for value in sorted(set(values[:-1]))
        }
    return out


def label_metrics(truth: np.ndarray, predicted: np.ndarray, labels: list[str]) -> dict:
    """A classifier's figures: ``{"accuracy", "f1_macro", "per_label": {label: {precision,
    recall, f1, support}}, "confusion": {"labels", "counts"}}`` of ``predicted`` against
    ``truth`` (label indices into ``labels``), as scikit-learn's ``classification_report`` and
    ``confusion_matrix`` define them (``zero_division=0``; ``counts[i][j]``: records of label
    ``i`` predicted ``j``); None figures for no records (JSON has no NaN). Macro F1 averages
    over every label of the set, present or not."""
    truth, predicted = np.asarray(truth, dtype=np.int64), np.asarray(predicted, dtype=np.int64)
    counts = np.zeros((len(labels), len(labels)), dtype=np.int64)
    np.add.at(counts, (truth, predicted), 1)
    confusion = {"labels": list(labels), "counts": counts.tolist()}
    if not truth.size:
        return {"accuracy": None, "f1_macro": None, "per_label": {}, "confusion": confusion}
    per_label, f1s = {}, []
    for index, label in enumerate(labels):
        hits = int(np.sum((predicted == index) & (truth == index)))
        said, support = int(np.sum(predicted == index)), int(np.sum(truth == index))
        precision = hits / said if said else 0.0
        recall = hits / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_label[label] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
        f1s.append(f1)
    return {
        "accuracy": float(np.mean(truth == predicted)),
        "f1_macro": float(np.mean(f1s)),
        "per_label": per_label,
        "confusion": confusion,
    }


def calibration_error(probabilities: np.ndarray, truth: np.ndarray, bins: int = 10) -> float | None:
    """Expected calibration error (Guo et al., 2017): the records binned by their top
    probability into ``bins`` equal-width bins, the record-weighted mean gap between each bin's
    accuracy and its mean top probability; 0 for a model exactly as sure as it is right, None
    for no records."""
    truth = np.asarray(truth, dtype=np.int64)
    if not truth.size:
        return None
    confidence = probabilities.max(axis=1)
    right = probabilities.argmax(axis=1) == truth
    which = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    gap = 0.0
    for b in np.unique(which):
        inside = which == b
        gap += abs(right[inside].mean() - confidence[inside].mean()) * inside.sum()
    return float(gap / truth.size)


def binary_auroc(probabilities: np.ndarray, truth: np.ndarray) -> float | None:
    """The area under the ROC curve of a two-label classifier, the second label the positive
    one, scored by its probability: the chance that a positive record outscores a negative one,
    ties counting half (Mann-Whitney's U over average ranks, as scikit-learn's
    ``roc_auc_score``). None for another number of labels, or when one label has no record."""
    truth = np.asarray(truth, dtype=np.int64)
    if probabilities.ndim != 2 or probabilities.shape[1] != 2:
        return None
    positive = truth == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return None
    scores = probabilities[:, 1]
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # rank (from 0) of the first record of each value
    ranks = first[inverse] + (counts[inverse] - 1) / 2 + 1  # average ranks, from 1
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def answer_scores(answer: list[int], reference: list[int]) -> tuple[float, float]:
    """``(exact match, token F1)`` of one greedy answer against its reference (token ids); F1
    over the two as bags of tokens, 1.0 for two empty ones."""
    exact = float(answer == reference)
    if not answer or not reference:
        return exact, exact
    common = sum((Counter(answer) & Counter(reference)).values())
    if not common:
        return exact, 0.0
    precision, recall = common / len(answer), common / len(reference)
    return exact, 2 * precision * recall / (precision + recall)


def answer_lengths(rows: np.ndarray, seq_len: int, max_new_tokens: int) -> np.ndarray:
    """How many tokens the model answers each record's prompt with (``rows``: an ``sft`` split's
    ``(start, length, prompt)``): its response's, at most ``max_new_tokens`` and at most what the
    trained context holds after the prompt (``seq_len + 1`` tokens a sample); 0 when the prompt
    fills the context, and such a record gets no answer."""
    prompts, responses = rows[:, 2], rows[:, 1] - rows[:, 2]
    room = np.maximum(seq_len + 1 - prompts, 0)
    return np.minimum(np.minimum(responses, max_new_tokens), room)


def record_batches(count: int, batch_size: int, max_batches: int = 0) -> list[list[int]]:
    """A record task's eval records in order, ``batch_size`` at a time; the first
    ``max_batches`` batches (0: all)."""
    batches = [list(range(i, min(i + batch_size, count))) for i in range(0, count, batch_size)]
    return batches[:max_batches] if max_batches else batches


def answer_figures(answered: list[Answer | None]) -> tuple[np.ndarray, np.ndarray]:
    """``(exact match, token F1)`` of each answer (:func:`answer_scores`); NaN for no answer."""
    exact, f1 = np.full(len(answered), np.nan), np.full(len(answered), np.nan)
    for index, answer in enumerate(answered):
        if answer is not None:
            exact[index], f1[index] = answer_scores(answer.tokens, answer.reference)
    return exact, f1


def slice_groups(unit_records: list[dict], columns: Sequence[str]) -> dict[str, dict[str, list[int]]]:
    """``{column: {value: [unit index, ...]}}``: the units of each slice value, a value as text
    (``str``, as :func:`slice_summaries` groups tokens), in value order. A unit the eval index
    does not hold (``{}``) is in no slice."""
    out: dict[str, dict[str, list[int]]] = {}
    for column in columns:
        groups: dict[str, list[int]] = {}
        for index, record in enumerate(unit_records):
            if record:
                groups.setdefault(str(record.get(column)), []).append(index)
        out[column] = dict(sorted(groups.items()))
    return out


def classifier_figures(truth: np.ndarray, probabilities: np.ndarray, labels: list[str]) -> dict:
    """A classifier's headline figures over some records: accuracy, macro F1, calibration
    error and (two labels) AUROC, from each record's label and label probabilities."""
    predicted = probabilities.argmax(axis=1)
    figures = label_metrics(truth, predicted, labels)
    return {
        "accuracy": figures["accuracy"],
        "f1_macro": figures["f1_macro"],
        "calibration_error": calibration_error(probabilities, truth),
        "auroc": binary_auroc(probabilities, truth),
    }


def answer_summary(exact: np.ndarray, f1: np.ndarray) -> dict:
    """Exact match and token F1 over the answered records (NaN: no answer); None for none."""
    hit = ~np.isnan(exact)
    if not hit.any():
        return {"exact_match": None, "token_f1": None, "answers": 0}
    return {
        "exact_match": float(exact[hit].mean()),
        "token_f1": float(f1[hit].mean()),
        "answers": int(hit.sum()),
    }
