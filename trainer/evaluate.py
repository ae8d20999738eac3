"""``trainer evaluate``: token cross-entropy of models on the dataset's eval split.

A model URI is an export folder or a checkpoint: ``<run>/checkpoints/step_<N>`` (committed),
or ``<run>/checkpoints`` for the newest valid one (``trainer.export.folder.load_model``).

The split is cut into windows of ``seq_len + 1`` tokens that share only their boundary
token, so every token but the first is predicted exactly once. Each predicted token
belongs to the eval record whose [start, end) span contains it; per-slice figures
aggregate the tokens of records with the same slice value.

An ``sft`` dataset (``trainer.contract.tasks``) is scored as it is trained: each eval record is
one sample (``trainer.records.sample``), and only its response's tokens count.

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
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from trainer import data
from trainer.config import Config, resolved_eval_uris
from trainer.contract import ENV_GPUS_PER_NODE, IGNORE_INDEX, RECORD_TASKS, dataset_task
from trainer.export.folder import load_model
from trainer.records import check_records, read_records, sample
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


# --- model I/O --------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """Where evaluation runs: a torch device and the autocast dtype there (None: plain fp32)."""

    device: torch.device
    autocast: torch.dtype | None

    def describe(self) -> str:
        return f"{self.device.type}, {'fp32' if self.autocast is None else 'bf16 autocast'}"


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
        autocast = (
            torch.autocast(device.device.type, dtype=device.autocast)
            if device.autocast is not None
            else contextlib.nullcontext()
        )
        with autocast:
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
    order = range(len(rows))
    batches = [list(order[i : i + batch_size]) for i in range(0, len(rows), batch_size)]
    for batch in batches[:max_batches] if max_batches else batches:
        samples = []
        for index in batch:
            start, length, prompt = (int(v) for v in rows[index])
            samples.append(sample(stream.read(start, start + min(length, seq_len + 1)), prompt, seq_len))
        windows = torch.from_numpy(np.stack(samples)).to(device.device, non_blocking=True)
        inputs, targets = data.inputs_and_targets(windows)
        autocast = (
            torch.autocast(device.device.type, dtype=device.autocast)
            if device.autocast is not None
            else contextlib.nullcontext()
        )
        with autocast:
            logits = model(inputs)
        ce = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none").cpu().numpy()
        scored = (targets != IGNORE_INDEX).cpu().numpy()
        for index, row, keep in zip(batch, ce, scored, strict=True):
            positions = int(rows[index][0]) + 1 + np.flatnonzero(keep)  # target j is token j + 1
            losses[positions] = row[keep]
    return losses


def evaluate_export(
    model_uri: str, stream, records, columns, config: Config, rows: np.ndarray | None = None
) -> dict:
    """Evaluate the model at ``model_uri``: an export folder or a checkpoint (``.../checkpoints[/step_<N>]``).

    :param rows: a record task's eval records (``trainer.records.read_records``): each scored as
        one sample, its response only; None: token windows over the whole split."""
    device = eval_device(torch.cuda.is_available())
    model, _ = load_model(open_storage(model_uri), model_uri)
    model = model.to(device.device)
    unit = "records" if rows is not None else "windows"
    log.info(
        "evaluate: %s on %s, batches of %d %s", model_uri, device.describe(), config.eval.batch_size, unit
    )
    t, e = config.train, config.eval
    if rows is not None:
        losses = record_token_losses(model, stream, rows, t.seq_len, e.batch_size, e.max_batches, device)
    else:
        losses = token_losses(model, stream, t.seq_len, e.batch_size, e.max_batches, device)
    owners = token_owners(records, len(stream))
    result = {
        "model_uri": model_uri,
        **summary(losses[~np.isnan(losses)]),
        "slices": slice_summaries(losses, owners, records, columns),
    }
    log.info(
        "evaluate: %s eval_loss %.4f perplexity %.3f over %d tokens",
        model_uri,
        result["eval_loss"],
        result["perplexity"],
        result["tokens"],
    )
    return result


def run_evaluate(config: Config) -> dict:
    model_uri, output_uri = resolved_eval_uris(config)
    data_storage = open_storage(config.data_uri)
    manifest = data.read_manifest(data_storage, config.data_uri)
    stream = data.open_split(data_storage, config.data_uri, manifest, "eval")
    rows = None
    if dataset_task(manifest) in RECORD_TASKS:  # scored as trained: each record, its response only
        rows = read_records(data_storage, config.data_uri, manifest, "eval")
        check_records(rows, len(stream), config.data_uri)
    records, columns = data.read_eval_index(data_storage, config.data_uri, manifest)
    candidate = evaluate_export(model_uri, stream, records, columns, config, rows)
    baseline = (
        evaluate_export(config.eval.baseline_uri, stream, records, columns, config, rows)
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
