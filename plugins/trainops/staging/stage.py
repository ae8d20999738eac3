"""Stage a source into ``<root>/datasets/<name>/<version>/``: validate, pack, commit.

Commit protocol: shards and the eval index go to a temporary prefix
``datasets/<name>/_staging-<version>-<uuid>/``, are copied to the version prefix, then
``validation.json`` and finally ``manifest.json`` are written, the manifest with
If-None-Match. A version exists only once its manifest does, so a crash at any point
leaves nothing a reader would trust. A failed validation writes nothing at all.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone

from trainer.contract import MANIFEST_NAME, dataset_prefix, join, safe_segment
from trainer.storage import NotFound, PreconditionFailed
from trainops.staging.errors import DataValidationError, StagingError
from trainops.staging.expectations import normalize_expectations
from trainops.staging.manifest import VALIDATION_NAME, build_manifest
from trainops.staging.pack import pack_batches
from trainops.staging.reader import (
    DEFAULT_BATCH_ROWS,
    column_names,
    iter_batches,
    list_source_objects,
    local_paths,
)
from trainops.staging.tokenize import (
    DEFAULT_EVAL_PERCENT,
    DEFAULT_SHARD_TOKENS,
    TOKEN_DTYPE,
    TOKENIZER,
    split_rule,
)
from trainops.staging.validation import describe_failures, validate_batches
from trainops.staging.version import dataset_version, version_inputs

_log = logging.getLogger(__name__)
_RESERVED_INDEX_KEYS = ("id", "start", "end")


def check_options(*, eval_percent: int, shard_tokens: int, slice_columns: Sequence[str]) -> None:
    """Reject bad staging options before any I/O (cheap; the operator calls it at parse time)."""
    if isinstance(eval_percent, bool) or not isinstance(eval_percent, int) or not (
        1 <= eval_percent <= 50
    ):
        raise ValueError(f"eval_percent must be an integer from 1 to 50, got {eval_percent!r}")
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise ValueError(f"shard_tokens must be a positive integer, got {shard_tokens!r}")
    if isinstance(slice_columns, str):
        raise ValueError(
            f"slice_columns must be a list of column names, got the string {slice_columns!r}"
        )
    for col in slice_columns:
        if not isinstance(col, str) or col in _RESERVED_INDEX_KEYS:
            raise ValueError(
                f"slice column {col!r} is not allowed: use a column name other than "
                f"{', '.join(_RESERVED_INDEX_KEYS)}"
            )


def stage_dataset(storage, root: str, source_uri: str, name: str, *,
                  source_storage=None,
                  expectations: list[dict] | None = None,
                  eval_percent: int = DEFAULT_EVAL_PERCENT,
                  slice_columns: Sequence[str] = ("source",),
                  shard_tokens: int = DEFAULT_SHARD_TOKENS,
                  batch_rows: int = DEFAULT_BATCH_ROWS,
                  id_column: str = "id", text_column: str = "text",
                  log: logging.Logger | None = None) -> dict:
    """Stage ``source_uri`` as dataset ``name`` under ``root``; reuse an identical version.

    Returns ``{"dataset_name", "version", "uri", "manifest_uri", "rows", "train_tokens",
    "eval_tokens", "reused"}``; ``uri`` is the version prefix the trainer reads.
    Raises :class:`DataValidationError` (nothing written) when the data fails the suite,
    :class:`StagingError` when it cannot be staged as it is (missing columns, no rows),
    and :class:`SourceNotFound` when ``source_uri`` names nothing.
    """
    log = log or _log
    source_storage = source_storage or storage
    slice_columns = list(slice_columns)
    check_options(eval_percent=eval_percent, shard_tokens=shard_tokens,
                  slice_columns=slice_columns)
    suite = normalize_expectations(expectations)
    rule = split_rule(eval_percent)

    objects = list_source_objects(source_storage, source_uri)
    identities = [o.identity() for o in objects]
    version = dataset_version(version_inputs(
        identities, expectations=suite, tokenizer=TOKENIZER, split_rule=rule,
        shard_tokens=shard_tokens, slice_columns=slice_columns))
    prefix = dataset_prefix(root, name, version)
    manifest_uri = join(prefix, MANIFEST_NAME)
    existing = _read_manifest(storage, manifest_uri)
    if existing is not None:
        log.info("dataset %s version %s already staged at %s; reusing it", name, version, prefix)
        return _result(existing, prefix, manifest_uri, reused=True)

    with tempfile.TemporaryDirectory(prefix="trainops-stage-") as scratch:
        paths = local_paths(source_storage, objects, scratch)
        _check_columns(objects, paths, [id_column, text_column, *slice_columns])
        summary = validate_batches(iter_batches(objects, paths, batch_rows=batch_rows), suite,
                                   id_column=id_column)
        if not summary["success"]:
            raise DataValidationError(describe_failures(source_uri, summary), summary)
        out_dir = os.path.join(scratch, "out")
        packed = pack_batches(
            iter_batches(objects, paths, batch_rows=batch_rows,
                         columns=list(dict.fromkeys([id_column, text_column, *slice_columns]))),
            out_dir, eval_percent=eval_percent, shard_tokens=shard_tokens,
            slice_columns=slice_columns, id_column=id_column, text_column=text_column)
        if packed["rows"]["total"] == 0:
            raise StagingError(f"source {source_uri!r} has no rows: point it at non-empty data")
        if packed["splits"]["train"]["tokens"] == 0:
            raise StagingError(
                f"source {source_uri!r} put all {packed['rows']['total']} records in the eval "
                f"split, so there is nothing to train on: lower eval_percent ({eval_percent}) "
                "or add data"
            )
        if packed["rows"]["eval"] == 0:
            log.warning("dataset %s has no eval records (eval_percent=%s, %s rows)",
                        name, eval_percent, packed["rows"]["total"])
        manifest = build_manifest(
            name=name, version=version,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            source_uri=source_uri, objects=identities, tokenizer=TOKENIZER,
            token_dtype=TOKEN_DTYPE, splits=packed["splits"], split_rule=rule,
            eval_records=packed["eval_records"], slice_columns=slice_columns,
            rows=packed["rows"], validation=summary)
        committed = _publish(storage, root, name, version, out_dir, packed["files"], manifest,
                             summary, log)
    reused = committed is not manifest
    return _result(committed, prefix, manifest_uri, reused=reused)


def _publish(storage, root: str, name: str, version: str, out_dir: str, files: list[str],
             manifest: dict, summary: dict, log: logging.Logger) -> dict:
    """Upload, copy into place, commit the manifest; return the manifest that won."""
    prefix = dataset_prefix(root, name, version)
    staging = join(root, "datasets", safe_segment(name),
                   f"_staging-{version}-{uuid.uuid4().hex}")
    try:
        for rel in files:
            storage.upload_file(os.path.join(out_dir, rel), join(staging, rel))
        # Copy only once every upload has landed, so the version prefix never holds
        # a mix of this attempt's files and a half-finished upload.
        for rel in files:
            storage.copy(join(staging, rel), join(prefix, rel))
        storage.put_json(join(prefix, VALIDATION_NAME), summary)
        try:
            storage.put_json(join(prefix, MANIFEST_NAME), manifest, if_none_match=True)
        except PreconditionFailed:
            # A concurrent run staged the same version; its bytes are identical to ours.
            log.info("dataset %s version %s was committed concurrently; using it", name, version)
            return storage.get_json(join(prefix, MANIFEST_NAME))
        log.info("committed dataset %s version %s at %s", name, version, prefix)
        return manifest
    finally:
        try:
            storage.delete_prefix(staging)
        except Exception as exc:  # leftover temp files are harmless; the commit stands
            log.warning("could not delete temporary prefix %s: %s", staging, exc)


def _read_manifest(storage, uri: str) -> dict | None:
    try:
        return storage.get_json(uri)
    except NotFound:
        return None


def _check_columns(objects, paths: list[str], required: list[str]) -> None:
    for obj, path in zip(objects, paths):
        names = column_names(path, obj.format)
        missing = [c for c in dict.fromkeys(required) if c not in names]
        if missing:
            raise StagingError(
                f"source object {obj.uri!r} lacks columns {missing} (it has {names}): "
                "add them to the data or change slice_columns"
            )


def _result(manifest: dict, prefix: str, manifest_uri: str, *, reused: bool) -> dict:
    return {
        "dataset_name": manifest["name"],
        "version": manifest["version"],
        "uri": prefix,
        "manifest_uri": manifest_uri,
        "rows": int(manifest["rows"]["total"]),
        "train_tokens": int(manifest["splits"]["train"]["tokens"]),
        "eval_tokens": int(manifest["splits"]["eval"]["tokens"]),
        "reused": bool(reused),
    }
