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

A team's own metrics (``eval.metrics``, :mod:`trainer.evaluate.user`) are scored on what the
model said (a classifier's labels, an ``sft`` model's answers decoded to text), overall and
per slice, and sit in the report beside the built-in ones. Each record's own figures go beside
the report (``records_uri``; :mod:`trainer.evaluate.per_record`), so a gate can compare the
two models on the same records.

It runs on CUDA with bf16 autocast when a GPU is present (the loss itself in fp32), else on
the CPU in fp32; the windows go through the model ``eval.batch_size`` at a time. CPU figures
are exactly those of an unbatched fp32 run up to float summation order; bf16 autocast moves
them slightly (docs/trainer.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from trainer import data
from trainer.config import Config, ConfigError, resolved_eval_uris
from trainer.contract import (
    ENV_GPUS_PER_NODE,
    IGNORE_INDEX,
    RECORD_TASKS,
    TASK_CLASSIFICATION,
    dataset_labels,
    dataset_task,
)
from trainer.evaluate import per_record
from trainer.evaluate.per_record import owner_loss_sums, record_loss_sums
from trainer.evaluate.scores import (
    Answer,
    answer_figures,
    answer_lengths,
    answer_summary,
    binary_auroc,
    calibration_error,
    classifier_figures,
    eval_windows,
    label_metrics,
    record_batches,
    slice_groups,
    slice_summaries,
    summary,
    token_owners,
)
from trainer.evaluate.user import Predictions, UserMetric, load_user_metrics
from trainer.evaluate.user import figures as user_figures
from trainer.export.folder import export_from_checkpoint, is_checkpoint_uri, load_model
from trainer.export.tokenizer_files import TOKENIZER_JSON, tokenizer_files
from trainer.records import check_records, labelled_sample, read_records, sample, split_samples
from trainer.storage import NotFound, open_storage

log = logging.getLogger("trainer.evaluate")

EVAL_FORMAT = "trainops.eval/v1"


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
) -> list[Answer | None]:
    """Greedy answers to an ``sft`` split's eval prompts, each with its reference (token ids):
    None for a record that gets no answer or lies past ``max_batches``. Records are batched by
    prompt and answer length, so a batch needs no padding and each answer is what the model
    gives the prompt alone."""
    device = device or eval_device(False)
    answered: list[Answer | None] = [None] * len(rows)
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
                answered[index] = Answer(answer.tolist(), reference.tolist())
    return answered


@dataclass
class Scored:
    """One model's evaluation: the report's figures, each scored unit's own figures
    (``trainer.evaluate.per_record``) and what user metrics are given (None: no predictions)."""

    result: dict
    units: dict[str, np.ndarray]
    given: Predictions | None = None


def _unit_columns(records: list[dict], owners: np.ndarray, positions: np.ndarray) -> list[dict]:
    """The eval index columns of the record holding each token position (its slice columns and
    id, without its token span; an empty dict where no record does)."""
    out = []
    for position in positions.tolist():
        owner = int(owners[position]) if 0 <= position < len(owners) else -1
        record = records[owner] if owner >= 0 else {}
        out.append({k: v for k, v in record.items() if k not in ("start", "end")})
    return out


def _answer_scored(
    model, stream, rows: np.ndarray, records, columns, config: Config, device, decode
) -> Scored:
    """An ``sft`` model's figures: response loss per record and its greedy answers."""
    t, e = config.train, config.eval
    losses = record_token_losses(model, stream, rows, t.seq_len, e.batch_size, e.max_batches, device)
    owners = token_owners(records, len(stream))
    answered = record_answers(
        model, stream, rows, t.seq_len, e.max_new_tokens, e.batch_size, e.max_batches, device
    )
    exact, f1 = answer_figures(answered)
    slices = slice_summaries(losses, owners, records, columns)
    unit_columns = _unit_columns(records, owners, rows[:, 0])
    for column, values in slice_groups(unit_columns, columns).items():
        for value, indices in values.items():  # exact match and token F1 per slice too
            figures = answer_summary(exact[indices], f1[indices])
            slices[column].setdefault(value, {}).update(
                exact_match=figures["exact_match"], token_f1=figures["token_f1"]
            )
    result = {
        **summary(losses[~np.isnan(losses)]),
        **answer_summary(exact, f1),
        "slices": slices,
    }
    sums, counts = record_loss_sums(losses, rows)
    units = {"loss_sum": sums, "loss_tokens": counts, "exact": exact, "token_f1": f1}
    given = None
    if decode is not None:
        chosen = [(i, a) for i, a in enumerate(answered) if a is not None]
        given = Predictions(
            [decode(a.tokens) for _, a in chosen],
            [decode(a.reference) for _, a in chosen],
            [unit_columns[i] for i, _ in chosen],
        )
    return Scored(result, units, given)


def _classification_scored(
    model, stream, rows: np.ndarray, records, columns, config: Config, device: Device, labels: list[str]
) -> Scored:
    """A classifier's figures: the label loss per record, placed at the record's first token so
    that the slices group records as they group tokens."""
    t, e = config.train, config.eval
    per_record, probabilities = record_label_scores(
        model, stream, rows, t.seq_len, len(labels), e.batch_size, e.max_batches, device
    )
    scored = ~np.isnan(per_record)
    predicted = probabilities[scored].argmax(axis=1)  # of the scored records
    losses = np.full(len(stream), np.nan)
    losses[rows[scored, 0]] = per_record[scored]
    owners = token_owners(records, len(stream))
    slices = slice_summaries(losses, owners, records, columns)
    unit_columns = _unit_columns(records, owners, rows[scored, 0])
    truth, chances = rows[scored, 2], probabilities[scored]
    for column, values in slice_groups(unit_columns, columns).items():
        for value, indices in values.items():  # every figure per slice too
            slices[column][value].update(classifier_figures(truth[indices], chances[indices], labels))
    result = {
        **summary(per_record[scored]),
        "records": int(scored.sum()),
        **label_metrics(truth, predicted, labels),
        "calibration_error": calibration_error(chances, truth),
        "auroc": binary_auroc(chances, truth),
        "slices": slices,
    }
    chosen = np.full(len(rows), np.nan)
    chosen[scored] = predicted
    units = {
        "loss_sum": per_record,
        "loss_tokens": np.where(scored, 1.0, np.nan),
        "predicted": chosen,
        "truth": np.where(scored, rows[:, 2], np.nan).astype(np.float64),
    }
    given = Predictions(
        [labels[int(p)] for p in predicted],
        [labels[int(r)] for r in truth],
        unit_columns,
    )
    return Scored(result, units, given)


def evaluate_export(
    model_uri: str,
    stream,
    records,
    columns,
    config: Config,
    rows: np.ndarray | None = None,
    labels: list[str] | None = None,
    decode: Callable[[list[int]], str] | None = None,
) -> Scored:
    """Evaluate the model at ``model_uri``: an export folder or a checkpoint (``.../checkpoints[/step_<N>]``).

    :param rows: a record task's eval records (``trainer.records.read_records``): each scored as
        one sample, its response only; None: token windows over the whole split.
    :param labels: a ``classification`` dataset's label set: ``rows`` are then scored by their
        labels (:func:`record_label_scores`).
    :param decode: token ids to text, for user metrics of an ``sft`` model's answers (None: the
        answers are not decoded)."""
    device = eval_device(torch.cuda.is_available())
    model, _ = load_model(open_storage(model_uri), model_uri)
    model = model.to(device.device)
    unit = "records" if rows is not None else "windows"
    log.info(
        "evaluate: %s on %s, batches of %d %s", model_uri, device.describe(), config.eval.batch_size, unit
    )
    t, e = config.train, config.eval
    if rows is not None and labels is not None:
        scored = _classification_scored(model, stream, rows, records, columns, config, device, labels)
        log.info(
            "evaluate: %s eval_loss %.4f accuracy %.4f macro F1 %.4f over %d records",
            model_uri,
            scored.result["eval_loss"],
            scored.result["accuracy"],
            scored.result["f1_macro"],
            scored.result["records"],
        )
    elif rows is not None:
        scored = _answer_scored(model, stream, rows, records, columns, config, device, decode)
    else:
        losses = token_losses(model, stream, t.seq_len, e.batch_size, e.max_batches, device)
        owners = token_owners(records, len(stream))
        sums, counts = owner_loss_sums(losses, owners, len(records))
        scored = Scored(
            {
                **summary(losses[~np.isnan(losses)]),
                "slices": slice_summaries(losses, owners, records, columns),
            },
            {"loss_sum": sums, "loss_tokens": counts},
        )
    scored.result = {"model_uri": model_uri, **scored.result}
    if labels is None:
        _log_losses(model_uri, scored.result)
    return scored


def _log_losses(model_uri: str, result: dict) -> None:
    log.info(
        "evaluate: %s eval_loss %.4f perplexity %.3f over %d tokens",
        model_uri,
        result["eval_loss"],
        result["perplexity"],
        result["tokens"],
    )
    if result.get("answers"):
        log.info(
            "evaluate: %s exact match %.4f token F1 %.4f over %d greedy answers",
            model_uri,
            result["exact_match"],
            result["token_f1"],
            result["answers"],
        )


def _with_user_figures(scored: Scored, metrics: list[UserMetric], columns: list[str]) -> dict:
    """The report's figures with the user metrics' (overall and per slice) and their sources."""
    result = scored.result
    if not metrics or scored.given is None:
        return result
    overall, per_slice, sources = user_figures(metrics, scored.given, columns)
    for column, values in per_slice.items():
        for value, figures in values.items():
            result["slices"].setdefault(column, {}).setdefault(value, {}).update(figures)
    log.info(
        "evaluate: %s user metrics %s",
        result["model_uri"],
        ", ".join(f"{name} {value:.4g}" for name, value in overall.items()),
    )
    return {**result, **overall, "user_metrics": sources}


def _decoder(data_storage, manifest: dict, seq_len: int) -> Callable[[list[int]], str]:
    """Token ids to text with the dataset's own tokenizer (special tokens left out)."""
    from tokenizers import Tokenizer  # noqa: PLC0415 (only for user metrics of sft answers)

    def read(uri: str) -> bytes | None:
        try:
            return open_storage(uri).get(uri)
        except NotFound:
            return None

    files = tokenizer_files(manifest.get("tokenizer") or {}, seq_len, read)
    tokenizer = Tokenizer.from_str(files.files[TOKENIZER_JSON].decode("utf-8"))
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def run_evaluate(config: Config) -> dict:
    model_uri, output_uri = resolved_eval_uris(config)
    metrics = load_user_metrics(config.eval.metrics)  # first: a typo costs seconds, not a scoring
    if config.eval.export_uri:  # a checkpoint, scored as it would be promoted: exported
        if not is_checkpoint_uri(model_uri):
            raise ConfigError(
                f"eval.export_uri {config.eval.export_uri!r} exports a checkpoint, but eval.model_uri "
                f"{model_uri!r} is not one: name .../checkpoints/step_<N>, or drop eval.export_uri"
            )
        export_from_checkpoint(config, model_uri, config.eval.export_uri)
        model_uri = config.eval.export_uri
    data_storage = open_storage(config.data_uri)
    manifest = data.read_manifest(data_storage, config.data_uri)
    stream = data.open_split(data_storage, config.data_uri, manifest, "eval")
    rows, labels = None, None
    task = dataset_task(manifest)
    if metrics and task not in RECORD_TASKS:
        raise ConfigError(
            f"eval.metrics {config.eval.metrics}: dataset {config.data_uri} is staged for {task}, "
            "which predicts nothing per record to score; user metrics score sft answers or "
            "classification labels (drop eval.metrics, or stage the data for one of those tasks)"
        )
    if task == TASK_CLASSIFICATION:
        labels = dataset_labels(manifest)
    if task in RECORD_TASKS:  # scored as trained: each record, its response (or label) only
        rows = read_records(data_storage, config.data_uri, manifest, "eval")
        check_records(rows, len(stream), config.data_uri, len(labels) if labels else None)
    records, columns = data.read_eval_index(data_storage, config.data_uri, manifest)
    decode = (
        _decoder(data_storage, manifest, config.train.seq_len)
        if metrics and task != TASK_CLASSIFICATION
        else None
    )
    models = [model_uri] + ([config.eval.baseline_uri] if config.eval.baseline_uri else [])
    # Every figure before anything is written: a user metric that fails leaves no report. Each
    # model's user figures right after its scoring: a failing scorer fails before the next model.
    scored, results = [], []
    for uri in models:
        scored.append(evaluate_export(uri, stream, records, columns, config, rows, labels, decode))
        results.append(_with_user_figures(scored[-1], metrics, columns))
    candidate, *baseline = results
    records_uri = per_record.records_uri(output_uri)
    open_storage(records_uri).put_json(
        records_uri, per_record.document(rows is not None, [s.units for s in scored], models)
    )
    report = {
        "format": EVAL_FORMAT,
        "data_uri": config.data_uri,
        "split": "eval",
        "candidate": candidate,
        "baseline": baseline[0] if baseline else None,
        "records_uri": records_uri,
    }
    open_storage(output_uri).put_json(output_uri, report)
    log.info("evaluate: wrote %s (each record's figures: %s)", output_uri, records_uri)
    return report
