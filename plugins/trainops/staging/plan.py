"""What a staging run will produce, decided before any row is read: one source for both engines.

:func:`plan_stage` checks the options, resolves the suite and the tokenizer, lists the
source and names the version. The in-worker engine (:mod:`trainops.staging.stage`) and the
Spark engine (:mod:`trainops.staging.spark.stage`) both start here, so the same source with
the same options gets the same version on either engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.contract import MANIFEST_NAME, TASK_CAUSAL_LM, TASK_SFT, dataset_prefix, join
from trainer.storage import NotFound
from trainer.storage import open_storage as default_open_storage
from trainops.staging.encoders import load_tokenizer
from trainops.staging.options import check_dataset_name, check_options, check_quarantine, check_tokenizer
from trainops.staging.reach import check_reachable
from trainops.staging.reader import SourceObject, check_not_empty_parquet, list_source_objects
from trainops.staging.suite import resolve_suite
from trainops.staging.tokenize import split_rule
from trainops.staging.version import dataset_version, version_inputs


@dataclass(frozen=True)
class StagePlan:
    """The resolved inputs of one staging run and the version they name."""

    suite: list[dict]
    tokenizer: Any  # an encoder from trainops.staging.encoders
    split_rule: dict
    objects: list[SourceObject]
    identities: list[dict]
    slice_columns: list[str]
    quarantine: dict | None
    version: str
    prefix: str
    manifest_uri: str


def _read_or_none(open_storage: Callable, uri: str) -> bytes | None:
    """The bytes at ``uri``; None when nothing is there."""
    try:
        return open_storage(uri).get(uri)
    except NotFound:
        return None


def plan_stage(
    storage,
    root: str,
    source_uri: str,
    name: str,
    *,
    source_storage,
    expectations,
    eval_percent: int,
    slice_columns: Sequence[str],
    shard_tokens: int,
    tokenizer: str | dict | None,
    quarantine: dict | None,
    open_storage: Callable | None = None,
    task: str = TASK_CAUSAL_LM,
    labels: Sequence[str] | None = None,
) -> StagePlan:
    """Check everything that can be checked without reading rows; name the version.

    ``open_storage`` (``uri -> storage client``, default ``trainer.storage.open_storage``)
    opens the suite and tokenizer files."""
    if open_storage is None:
        open_storage = default_open_storage

    slice_columns = list(slice_columns)
    check_options(eval_percent=eval_percent, shard_tokens=shard_tokens, slice_columns=slice_columns)
    quarantine = check_quarantine(quarantine)
    tokenizer_spec = check_tokenizer(tokenizer)
    check_dataset_name(name)
    check_reachable(source_storage, source_uri)
    check_reachable(storage, root)
    suite = resolve_suite(expectations, open_storage=open_storage, task=task)
    tok = load_tokenizer(tokenizer_spec, open_storage)
    if task == TASK_SFT:  # prompt/response records as the model reads a conversation
        tok.use_chat_template(lambda uri: _read_or_none(open_storage, uri))
    rule = split_rule(eval_percent)

    objects = list_source_objects(source_storage, source_uri)
    check_not_empty_parquet(objects)  # before a version is named or reused
    identities = [o.identity() for o in objects]
    version = dataset_version(
        version_inputs(
            identities,
            expectations=suite,
            tokenizer=tok.config,
            split_rule=rule,
            shard_tokens=shard_tokens,
            slice_columns=slice_columns,
            quarantine=quarantine,
            task=task,
            labels=labels,
        )
    )
    prefix = dataset_prefix(root, name, version)
    return StagePlan(
        suite=suite,
        tokenizer=tok,
        split_rule=rule,
        objects=objects,
        identities=identities,
        slice_columns=slice_columns,
        quarantine=quarantine,
        version=version,
        prefix=prefix,
        manifest_uri=join(prefix, MANIFEST_NAME),
    )
