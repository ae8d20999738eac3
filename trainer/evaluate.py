"""``trainer evaluate``: token cross-entropy of models on the dataset's eval split.

A model URI is an export folder or a checkpoint: ``<run>/checkpoints/step_<N>`` (committed),
or ``<run>/checkpoints`` for the newest valid one (``trainer.export.folder.load_model``).

The split is cut into windows of ``seq_len + 1`` tokens that share only their boundary
token, so every token but the first is predicted exactly once. Each predicted token
belongs to the eval record whose [start, end) span contains it; per-slice figures
aggregate the tokens of records with the same slice value.

An ``sft`` dataset (``trainer.contract.tasks``) is scored as it is trained: each eval record is
one sample (``trainer.records.sample``), and only its response's tokens count. The model also
answers each eval prompt greedily (:func:`record_answers`), as many tokens as the reference
response has (its end of record or end of turn included; at most ``eval.max_new_tokens``), and
the report adds ``exact_match`` (the share of answers equal to their reference) and
``token_f1`` (the mean F1 of each answer's tokens against its reference's, as a bag of token
ids: SQuAD's F1 over the tokenizer's tokens instead of words). A
``classification`` dataset's eval records are each one sample too (``trainer.records.labelled_sample``):
its loss is the cross-entropy of the record's label, and the report adds accuracy, macro F1,
each label's figures and the confusion matrix (:func:`label_metrics`), the expected
calibration error (:func:`calibration_error`) and, for two labels, the AUROC
(:func:`binary_auroc`); ``tokens`` then counts records.

It runs on CUDA with bf16 autocast when a GPU is present (the loss itself in fp32), else on
the CPU in fp32; the windows go through the model ``eval.batch_size`` at a time. CPU figures
are exactly those of an unbatched fp32 run up to float summation order; bf16 autocast moves
them slightly (docs/trainer.md).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from trainer import data
from trainer.config import Config, resolved_eval_uris
from trainer.contract import (
    ENV_GPUS_PER_NODE,
    IGNORE_INDEX,
    RECORD_TASKS,
    TASK_CLASSIFICATION,
    dataset_labels,
    dataset_task,
)
from trainer.export.folder import load_model
from trainer.records import check_records, labelled_sample, read_records, sample, split_samples
from trainer.storage import open_storage

log = logging.getLogger("trainer.evaluate")

EVAL_FORMAT = "trainops.eval/v1"


# --- plain arithmetic -----------------------------------------------------------------
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


# --- model I/O --------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """Where evaluation runs: a torch device and the autocast dtype there (None: plain fp32)."""

    device: torch.device
    autocast: torch.dtype | None

    def describe(self) -> str:
        return f"{self.device.type}, {'fp32' if self.autocast is None else 'bf16 autocast'}"

    def autocast_context(self):
        """Autocast to :attr:`autocast` on this device; nothing for plain fp32."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)


def eval_device(cuda_available: bool, environ: Mapping[str, str] | None = None) -> Device:
    """CUDA with bf16 autocast when there is a GPU (the evaluate pod's), else the CPU in fp32 as
    before. A job launched with ``gpus_per_node=0`` (``$TRAINOPS_GPUS_PER_NODE`` is 0) stays on
    the CPU even where a GPU is visible (a GPU host's local cluster, a CUDA image with every
    device exposed): 0 means CPU, as the operator documents."""
    told = (environ if environ is not None else os.environ).get(ENV_GPUS_PER_NODE, "").strip()
    if cuda_available and told != "0":
        return Device(torch.device("cuda"), torch.bfloat16)
    return Device(torch.device("cpu"), None)


def eval_batches(
    windows: list[tuple[int, int]], seq_len: int, batch_size: int
) -> list[list[tuple[int, int]]]:
    """Full windows in batches of ``batch_size``, then each shorter window alone (a batch is one shape)."""
    full = [w for w in windows if w[1] - w[0] == seq_len + 1]
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    return batches + [[w] for w in windows if w[1] - w[0] != seq_len + 1]


@torch.no_grad()
def token_losses(
    model,
    stream: data.TokenStream,
    seq_len: int,
    batch_size: int,
    max_batches: int = 0,
    device: Device | None = None,
) -> np.ndarray:
    """Cross-entropy of each token position's prediction (NaN where not predicted).

    ``model`` must already be on ``device`` (default: the CPU, fp32). The loss is computed
    in fp32 from the logits in every case.
    """
    device = device or eval_device(False)
    batches = eval_batches(eval_windows(len(stream), seq_len), seq_len, batch_size)
    if max_batches:
        batches = batches[:max_batches]
    losses = np.full(len(stream), np.nan, dtype=np.float64)
    for batch in batches:
        tokens = torch.from_numpy(np.stack([stream.read(a, b) for a, b in batch]))
        tokens = tokens.to(device.device, non_blocking=True)
        with device.autocast_context():
            logits = model(tokens[:, :-1])
        ce = F.cross_entropy(logits.float().transpose(1, 2), tokens[:, 1:], reduction="none")
        for (a, b), row in zip(batch, ce.cpu().numpy(), strict=False):
            losses[a + 1 : b] = row
    return losses


@torch.no_grad()
def record_token_losses(
    model,
    stream: data.TokenStream,
    rows: np.ndarray,
    seq_len: int,
    batch_size: int,
    max_batches: int = 0,
    device: Device | None = None,
) -> np.ndarray:
    """Cross-entropy of each response token of each record (``rows``: a record task's), one
    record per sample as in training; NaN at every other position (prompts, records' ends
    beyond ``seq_len + 1`` tokens)."""
    device = device or eval_device(False)
    losses = np.full(len(stream), np.nan, dtype=np.float64)
    for batch in record_batches(len(rows), batch_size, max_batches):
        samples = []
        for index in batch:
            start, length, prompt = (int(v) for v in rows[index])
            samples.append(sample(stream.read(start, start + min(length, seq_len + 1)), prompt, seq_len))
        windows = torch.from_numpy(np.stack(samples)).to(device.device, non_blocking=True)
        inputs, targets = data.inputs_and_targets(windows)
        with device.autocast_context():
            logits = model(inputs)
        ce = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none").cpu().numpy()
        scored = (targets != IGNORE_INDEX).cpu().numpy()
        for index, row, keep in zip(batch, ce, scored, strict=True):
            positions = int(rows[index][0]) + 1 + np.flatnonzero(keep)  # target j is token j + 1
            losses[positions] = row[keep]
    return losses


@torch.no_grad()
def record_label_scores(
    model,
    stream: data.TokenStream,
    rows: np.ndarray,
    seq_len: int,
    classes: int,
    batch_size: int,
    max_batches: int = 0,
    device: Device | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A classifier's cross-entropy of each eval record's label and its probability of each of
    the ``classes`` labels (``rows``: a ``classification`` split's records), one record per
    sample as in training; NaN for the records past ``max_batches``."""
    device = device or eval_device(False)
    losses, probabilities = np.full(len(rows), np.nan), np.full((len(rows), classes), np.nan)
    for batch in record_batches(len(rows), batch_size, max_batches):
        samples = []
        for index in batch:
            start, length, label = (int(v) for v in rows[index])
            samples.append(labelled_sample(stream.read(start, start + min(length, seq_len)), label, seq_len))
        windows = torch.from_numpy(np.stack(samples)).to(device.device, non_blocking=True)
        inputs, targets = split_samples(windows, TASK_CLASSIFICATION)
        with device.autocast_context():
            logits = model(inputs).float()
        losses[batch] = F.cross_entropy(logits, targets, reduction="none").cpu().numpy()
        probabilities[batch] = torch.softmax(logits, dim=-1).cpu().numpy()
    return losses, probabilities


@torch.no_grad()
def record_answers(
    model,
    stream: data.TokenStream,
    rows: np.ndarray,
    seq_len: int,
    max_new_tokens: int,
    batch_size: int,
    max_batches: int = 0,
    device: Device | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy answers to an ``sft`` split's eval prompts, scored against the references:
    ``(exact match, token F1)`` per record (:func:`answer_scores`), NaN for a record that gets
    no answer or lies past ``max_batches``. Records are batched by prompt and answer length, so
    a batch needs no padding and each answer is what the model gives the prompt alone."""
    device = device or eval_device(False)
    exact, f1 = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    wanted = answer_lengths(rows, seq_len, max_new_tokens)
    chosen = [i for batch in record_batches(len(rows), batch_size, max_batches) for i in batch]
    groups: dict[tuple[int, int], list[int]] = {}
    for index in chosen:
        if wanted[index] > 0:
            groups.setdefault((int(rows[index, 2]), int(wanted[index])), []).append(index)
    for (prompt, length), indices in sorted(groups.items()):
        for at in range(0, len(indices), batch_size):
            batch = indices[at : at + batch_size]
            starts = [int(rows[i, 0]) for i in batch]
            tokens = torch.from_numpy(
                np.stack([stream.read(s, s + prompt).astype(np.int64) for s in starts])
            ).to(device.device)
            for _ in range(length):
                with device.autocast_context():
                    logits = model(tokens)[:, -1].float()
                tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)
            answers = tokens[:, prompt:].cpu().numpy()
            for index, start, answer in zip(batch, starts, answers, strict=True):
                reference = stream.read(start + prompt, start + prompt + length).astype(np.int64)
                exact[index], f1[index] = answer_scores(answer.tolist(), reference.tolist())
    return exact, f1


def _answer_result(model, stream, rows: np.ndarray, config: Config, device: Device) -> dict:
    """``evaluate_export``'s answer figures for an ``sft`` split (None when no record got one)."""
    t, e = config.train, config.eval
    exact, f1 = record_answers(
        model, stream, rows, t.seq_len, e.max_new_tokens, e.batch_size, e.max_batches, device
    )
    answered = ~np.isnan(exact)
    if not answered.any():
        return {"exact_match": None, "token_f1": None, "answers": 0}
    return {
        "exact_match": float(exact[answered].mean()),
        "token_f1": float(f1[answered].mean()),
        "answers": int(answered.sum()),
    }


def _classification_result(
    model, stream, rows: np.ndarray, records, columns, config: Config, device: Device, labels: list[str]
) -> dict:
    """``evaluate_export``'s figures for a classifier: the label loss per record, placed at the
    record's first token so that the slices group records as they group tokens."""
    t, e = config.train, config.eval
    per_record, probabilities = record_label_scores(
        model, stream, rows, t.seq_len, len(labels), e.batch_size, e.max_batches, device
    )
    scored = ~np.isnan(per_record)
    predicted = probabilities[scored].argmax(axis=1)  # of the scored records
    losses, right = np.full(len(stream), np.nan), np.full(len(stream), np.nan)
    losses[rows[scored, 0]] = per_record[scored]
    right[rows[scored, 0]] = predicted == rows[scored, 2]
    owners = token_owners(records, len(stream))
    slices = slice_summaries(losses, owners, records, columns)
    for column, values in slice_summaries(right, owners, records, columns).items():
        for value, hits in values.items():  # a record's "loss" 1 when right: the mean is accuracy
            slices[column][value]["accuracy"] = hits["eval_loss"]
    return {
        **summary(per_record[scored]),
        "records": int(scored.sum()),
        **label_metrics(rows[scored, 2], predicted, labels),
        "calibration_error": calibration_error(probabilities[scored], rows[scored, 2]),
        "auroc": binary_auroc(probabilities[scored], rows[scored, 2]),
        "slices": slices,
    }


def evaluate_export(
    model_uri: str,
    stream,
    records,
    columns,
    config: Config,
    rows: np.ndarray | None = None,
    labels: list[str] | None = None,
) -> dict:
    """Evaluate the model at ``model_uri``: an export folder or a checkpoint (``.../checkpoints[/step_<N>]``).

    :param rows: a record task's eval records (``trainer.records.read_records``): each scored as
        one sample, its response only; None: token windows over the whole split.
    :param labels: a ``classification`` dataset's label set: ``rows`` are then scored by their
        labels (:func:`record_label_scores`)."""
    device = eval_device(torch.cuda.is_available())
    model, _ = load_model(open_storage(model_uri), model_uri)
    model = model.to(device.device)
    unit = "records" if rows is not None else "windows"
    log.info(
        "evaluate: %s on %s, batches of %d %s", model_uri, device.describe(), config.eval.batch_size, unit
    )
    t, e = config.train, config.eval
    if rows is not None and labels is not None:
        result = {
            "model_uri": model_uri,
            **_classification_result(model, stream, rows, records, columns, config, device, labels),
        }
        log.info(
            "evaluate: %s eval_loss %.4f accuracy %.4f macro F1 %.4f over %d records",
            model_uri,
            result["eval_loss"],
            result["accuracy"],
            result["f1_macro"],
            result["records"],
        )
        return result
    if rows is not None:
        losses = record_token_losses(model, stream, rows, t.seq_len, e.batch_size, e.max_batches, device)
    else:
        losses = token_losses(model, stream, t.seq_len, e.batch_size, e.max_batches, device)
    owners = token_owners(records, len(stream))
    result = {
        "model_uri": model_uri,
        **summary(losses[~np.isnan(losses)]),
        **(_answer_result(model, stream, rows, config, device) if rows is not None else {}),
        "slices": slice_summaries(losses, owners, records, columns),
    }
    log.info(
        "evaluate: %s eval_loss %.4f perplexity %.3f over %d tokens",
        model_uri,
        result["eval_loss"],
        result["perplexity"],
        result["tokens"],
    )
    if rows is not None and result["answers"]:
        log.info(
            "evaluate: %s exact match %.4f token F1 %.4f over %d greedy answers",
            model_uri,
            result["exact_match"],
            result["token_f1"],
            result["answers"],
        )
    return result


def run_evaluate(config: Config) -> dict:
    model_uri, output_uri = resolved_eval_uris(config)
    data_storage = open_storage(config.data_uri)
    manifest = data.read_manifest(data_storage, config.data_uri)
    stream = data.open_split(data_storage, config.data_uri, manifest, "eval")
    rows, labels = None, None
    task = dataset_task(manifest)
    if task == TASK_CLASSIFICATION:
        labels = dataset_labels(manifest)
    if task in RECORD_TASKS:  # scored as trained: each record, its response (or label) only
        rows = read_records(data_storage, config.data_uri, manifest, "eval")
        check_records(rows, len(stream), config.data_uri, len(labels) if labels else None)
    records, columns = data.read_eval_index(data_storage, config.data_uri, manifest)
    candidate = evaluate_export(model_uri, stream, records, columns, config, rows, labels)
    baseline = (
        evaluate_export(config.eval.baseline_uri, stream, records, columns, config, rows, labels)
        if config.eval.baseline_uri
        else None
    )
    report = {
        "format": EVAL_FORMAT,
        "data_uri": config.data_uri,
        "split": "eval",
        "candidate": candidate,
        "baseline": baseline,
    }
    open_storage(output_uri).put_json(output_uri, report)
    log.info("evaluate: wrote %s", output_uri)
    return report
