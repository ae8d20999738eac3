"""The train split as ``trainer.train.setup`` opens it: the dataset checked against the config
before any shard is downloaded (:func:`train_data`), the label set a classification dataset
fixes in the model's config (:func:`task_config`), and this rank's batches from the resumed
state on, fetching only the shards the remaining steps read (:func:`train_batches`)."""

from __future__ import annotations

import logging
from typing import Any

from trainer import data, parallel
from trainer.config import Config, check_data_fit, pin_labels
from trainer.contract import RECORD_TASKS, dataset_task, split_records, task_labels
from trainer.records import RecordBatches, check_records, read_records
from trainer.state import TrainState
from trainer.storage import Storage, open_storage

log = logging.getLogger("trainer.train")  # the loop's logger: these are its lines


def train_data(config: Config, env: parallel.DistEnv) -> tuple[Storage, dict[str, Any], int]:
    """The dataset's storage and manifest, and the model's vocabulary size.

    The dataset must fit the config by the operator's own rule (``check_data_fit``), checked
    on the manifest before any shard is downloaded or any model built.
    """
    data_storage = open_storage(config.data_uri)  # the dataset may live on another scheme than the run
    manifest = data.read_manifest(data_storage, config.data_uri)
    train_tokens, dataset_vocab = data.manifest_numbers(manifest, config.data_uri)
    try:
        task = dataset_task(manifest)
    except ValueError as exc:
        raise data.DataError(f"{config.data_uri}: {exc}") from None
    records = split_records(manifest, "train")
    check_data_fit(
        config,
        train_tokens=train_tokens,
        tokenizer_vocab=dataset_vocab,
        world_size=env.world_size,
        dataset_task=task,
        train_records=int(records.get("count", 0)) if records else None,
        labels=_labels(config, manifest),
    )
    return data_storage, manifest, config.model.vocab_size or dataset_vocab


def _labels(config: Config, manifest: dict[str, Any]) -> list[str] | None:
    """A ``classification`` dataset's label set (None for another task), a DataError naming the
    dataset when its manifest has none."""
    try:
        return task_labels(manifest)
    except ValueError as exc:
        raise data.DataError(f"{config.data_uri}: {exc}") from None


def task_config(config: Config, manifest: dict[str, Any]) -> Config:
    """``config`` with what the dataset fixes of its model: a ``classification`` run's label set
    (``trainer.config.pin_labels``), refused when the model's config names other labels."""
    labels = _labels(config, manifest)
    return pin_labels(config, labels) if labels is not None else config


def train_batches(
    config: Config,
    env: parallel.DistEnv,
    data_storage: Storage,
    manifest: dict[str, Any],
    state: TrainState,
    global_batch: int,
) -> data.TrainBatches | RecordBatches:
    """This rank's batches of the train split, from the resumed ``state`` on: only the shards the
    remaining steps read are fetched (each once per node; every shard for a record task); the
    shards must hold what the manifest says."""
    t = config.train
    train_tokens, _ = data.manifest_numbers(manifest, config.data_uri)
    shards = data.split_info(manifest, "train", config.data_uri)["shards"]
    only = None
    records = config.task.kind in RECORD_TASKS
    if not records and all("tokens" in shard for shard in shards):  # else: fetch every shard
        remaining = data.remaining_positions(state.cursor, state.step, t.max_steps, global_batch)
        only = data.shards_read([int(s["tokens"]) for s in shards], t.seq_len, config.seed, remaining)
        log.info("data: %d of %d train shards are read by the remaining steps", len(only), len(shards))
    stream = data.open_split(data_storage, config.data_uri, manifest, "train", only)
    if len(stream) != train_tokens:
        raise data.DataError(
            f"the train split of {config.data_uri} holds {len(stream)} tokens in its shards, but its "
            f"manifest says {train_tokens}; re-stage the dataset"
        )
    if records:
        rows = read_records(data_storage, config.data_uri, manifest, "train")
        labels = _labels(config, manifest)
        check_records(rows, len(stream), config.data_uri, len(labels) if labels is not None else None)
        return RecordBatches(
            stream,
            rows,
            config.task.kind,
            t.seq_len,
            config.seed,
            t.micro_batch_size,
            env.world_size,
            env.rank,
        )
    return data.TrainBatches(stream, t.seq_len, config.seed, t.micro_batch_size, env.world_size, env.rank)
