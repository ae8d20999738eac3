"""Stage a source into ``<root>/datasets/<name>/<version>/``: validate, pack, commit.

One pass over the source: every record batch is validated by GX, its rows fed to the
dataset-level aggregates and tokenized into local shards. Memory holds one batch; local
disk holds the shards, the uniqueness spill and one downloaded source object.

Commit protocol: shards and the eval index go to a temporary prefix
``datasets/<name>/_staging-<version>-<uuid>/``, are copied to the version prefix, then
``validation.json`` and finally ``manifest.json`` are written, the manifest with
If-None-Match. A version exists only once its manifest does, so a crash at any point
leaves nothing a reader would trust. Data that fails validation leaves only its report
(``validation.json``, and with quarantine ``quarantine/sample.jsonl``) in the version
prefix, never a manifest.

This is a plain function over storage clients, so it can run in an Airflow worker (the
operator) or, for large data, as a CPU job with the same arguments.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from trainer.contract import MANIFEST_NAME, TASK_CAUSAL_LM, dataset_prefix, join, safe_segment
from trainer.storage import NotFound, PreconditionFailed
from trainops.staging.errors import DataValidationError, QuarantineExceeded, StagingError
from trainops.staging.manifest import VALIDATION_NAME, build_manifest, check_manifest_name
from trainops.staging.options import DEFAULT_SLICE_COLUMNS, check_options
from trainops.staging.plan import plan_stage
from trainops.staging.quarantine import SAMPLE_PATH, over_limit
from trainops.staging.reader import DEFAULT_BATCH_ROWS
from trainops.staging.single_pass import (
    TaskLog,  # defined below stage, where the pass logs too
    run_pass,
)
from trainops.staging.tokenize import DEFAULT_EVAL_PERCENT, DEFAULT_SHARD_TOKENS
from trainops.staging.validation import describe_failures

__all__ = ["check_options", "stage_dataset"]

_log = logging.getLogger(__name__)


def stage_dataset(
    storage,
    root: str,
    source_uri: str,
    name: str,
    *,
    source_storage=None,
    expectations=None,
    eval_percent: int = DEFAULT_EVAL_PERCENT,
    slice_columns: Sequence[str] | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    id_column: str = "id",
    text_column: str = "text",
    tokenizer: str | dict | None = None,
    quarantine: dict | None = None,
    open_storage: Callable | None = None,
    scratch_dir: str | None = None,
    log: TaskLog | None = None,
    task: str = TASK_CAUSAL_LM,
    labels: list[str] | None = None,
) -> dict:
    """Stage ``source_uri`` as dataset ``name`` under ``root``; reuse an identical version.

    :param slice_columns: the eval index's columns (default: ``source`` for ``causal_lm``, none
        for ``sft``).
    :param task: ``causal_lm`` (a ``text`` column) or ``sft`` (``prompt`` and ``response``
        columns; ``trainer.contract.tasks``): the records' shape, the default suite, and what
        the manifest says the data is for.
    :param labels: a ``classification`` source's fixed label set, in index order (None: the
        labels the data holds, sorted); a record with another label is not staged (quarantined,
        or the staging fails naming it).
    :param expectations: the suite: a list, a callable returning one, or the URI of a
        suite JSON file (see :mod:`trainops.staging.suite`); None for the default suite.
    :param tokenizer: None for the built-in byte tokenizer, or a Hugging Face
        ``tokenizer.json`` URI (or ``{"uri", "eos_token"}``).
    :param quarantine: None (bad rows fail the task) or ``{"max_fraction", "sample_rows"}``.
    :param open_storage: ``uri -> storage client`` for the suite and tokenizer files.
    :param scratch_dir: where local shards and spill files go (default: the temp dir).

    Returns ``{"dataset_name", "version", "uri", "manifest_uri", "rows", "train_tokens",
    "eval_tokens", "reused", "validation_uri", "quarantined_rows"}``; ``uri`` is the
    version prefix the trainer reads. Raises :class:`DataValidationError` (only the report
    written) when the data fails the suite, :class:`QuarantineExceeded` when too many rows
    are bad, :class:`StagingError` when it cannot be staged as it is (missing columns,
    unreadable files, no rows), :class:`SourceNotFound` when ``source_uri`` names nothing
    and :class:`SourceUnreachable` when its store does not answer.
    """
    log = log or _log
    source_storage = source_storage or storage
    slice_columns = DEFAULT_SLICE_COLUMNS.get(task, ()) if slice_columns is None else slice_columns
    plan = plan_stage(
        storage,
        root,
        source_uri,
        name,
        source_storage=source_storage,
        expectations=expectations,
        eval_percent=eval_percent,
        slice_columns=slice_columns,
        shard_tokens=shard_tokens,
        tokenizer=tokenizer,
        quarantine=quarantine,
        open_storage=open_storage,
        task=task,
        labels=labels,
    )
    suite, tok, rule, quarantine = plan.suite, plan.tokenizer, plan.split_rule, plan.quarantine
    slice_columns, objects, identities, version = (
        plan.slice_columns,
        plan.objects,
        plan.identities,
        plan.version,
    )
    prefix, manifest_uri = plan.prefix, plan.manifest_uri
    existing = read_manifest(storage, manifest_uri, name)
    if existing is not None:
        log.info("dataset %s version %s already staged at %s; reusing it", name, version, prefix)
        return stage_result(existing, prefix, manifest_uri, reused=True)

    with tempfile.TemporaryDirectory(prefix="trainops-stage-", dir=scratch_dir) as scratch:
        out_dir = os.path.join(scratch, "out")
        done = run_pass(
            source_storage,
            objects,
            suite,
            tok,
            scratch=scratch,
            out_dir=out_dir,
            eval_percent=eval_percent,
            shard_tokens=shard_tokens,
            slice_columns=slice_columns,
            batch_rows=batch_rows,
            id_column=id_column,
            text_column=text_column,
            quarantine=quarantine,
            log=log,
            task=task,
            labels=labels,
        )
        summary, packed, qsum = done["summary"], done["packed"], done["quarantine"]
        sample = os.path.join(out_dir, SAMPLE_PATH) if qsum and qsum["sample"] else None
        failure = failure_of(source_uri, summary, qsum)
        if failure is not None:
            error, message = failure
            summary["success"] = False
            report = write_report(storage, prefix, summary, sample, log)
            raise error(f"{message}. Full report: {report}" if report else message, summary, report)
        if done["problem"]:
            raise StagingError(done["problem"])
        check_packed(source_uri, name, packed, eval_percent, log)
        if "labels" in packed:
            check_labels(source_uri, name, packed["labels"], packed["label_counts"], log)
        manifest = build_manifest(
            name=name,
            version=version,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            source_uri=source_uri,
            objects=identities,
            tokenizer=tok.config,
            token_dtype=tok.dtype,
            splits=packed["splits"],
            split_rule=rule,
            eval_records=packed["eval_records"],
            slice_columns=slice_columns,
            rows=packed["rows"],
            validation=summary,
            quarantine=qsum,
            engine="worker",
            task=task,
            labels=packed.get("labels"),
        )
        files = packed["files"] + ([SAMPLE_PATH] if sample else [])
        committed = _publish(storage, root, name, version, out_dir, files, manifest, summary, log)
    reused = committed is not manifest
    return stage_result(committed, prefix, manifest_uri, reused=reused)


def check_packed(source_uri: str, name: str, packed: dict, eval_percent: int, log: TaskLog) -> None:
    """Refuse packed data with no rows or nothing to train on; warn when eval is empty."""
    if packed["rows"]["total"] == 0:
        raise StagingError(f"source {source_uri!r} has no rows: point it at non-empty data")
    if packed["splits"]["train"]["tokens"] == 0:
        raise StagingError(
            f"source {source_uri!r} put all {packed['rows']['total']} records in the eval "
            f"split, so there is nothing to train on: lower eval_percent ({eval_percent}) "
            "or add data"
        )
    if packed["rows"]["eval"] == 0:
        log.warning(
            "dataset %s has no eval records (eval_percent=%s, %s rows)",
            name,
            eval_percent,
            packed["rows"]["total"],
        )


# More records of the most frequent label than this many times the least frequent's: a warning.
IMBALANCE_WARNING_RATIO = 10


def check_labels(source_uri: str, name: str, labels: list[str], counts: dict, log: TaskLog) -> None:
    """Refuse a classification source with fewer than two labels; warn, naming the labels and
    their counts, when one label has over ``IMBALANCE_WARNING_RATIO`` times another's records
    (a classifier then learns to say the frequent one)."""
    if len(labels) < 2:
        raise StagingError(
            f"source {source_uri!r} has {len(labels)} label(s) {labels} in its 'label' column: a classifier "
            "needs two or more; check the label column, or add records of the other labels"
        )
    total = {label: sum(counts[label].values()) for label in labels}
    most, least = max(total, key=total.__getitem__), min(total, key=total.__getitem__)
    if total[most] > IMBALANCE_WARNING_RATIO * total[least]:
        log.warning(
            "dataset %s is imbalanced: %d records labelled %r, %d labelled %r (over %dx); accuracy will "
            "flatter a model that says %r; per-label figures are in the eval report",
            name,
            total[most],
            most,
            total[least],
            least,
            IMBALANCE_WARNING_RATIO,
            most,
        )


def failure_of(source_uri: str, summary: dict, qsum: dict | None) -> tuple[type, str] | None:
    """``(error class, message)`` when the data may not be staged, else None (pure)."""
    if not summary["success"]:
        return DataValidationError, describe_failures(source_uri, summary)
    if qsum and over_limit(qsum["rows"], qsum["rows_read"], qsum["max_fraction"]):
        qsum["exceeded"] = True
        reasons = "; ".join(f"{k}: {v}" for k, v in qsum["by_reason"].items())
        ids = sorted(
            {i for r in summary.get("results", []) if r.get("quarantined") for i in r.get("sample_ids", [])}
        )[:5]
        return QuarantineExceeded, (
            f"source {source_uri!r} has {qsum['rows']} bad rows of {qsum['rows_read']} read "
            f"({qsum['rows'] / qsum['rows_read']:.2%}), more than quarantine max_fraction "
            f"{qsum['max_fraction']} ({qsum['max_fraction']:.2%}) allows, so nothing was "
            f"staged: {reasons}"
            + (f" (ids {', '.join(map(repr, ids))})" if ids else "")
            + "; fix the data or raise max_fraction"
        )
    return None


def write_report(storage, prefix: str, summary: dict, sample: str | None, log: TaskLog) -> str | None:
    """Keep a failed validation's report where the version would be; no manifest beside it."""
    uri = join(prefix, VALIDATION_NAME)
    try:
        if sample:
            storage.upload_file(sample, join(prefix, SAMPLE_PATH))
        storage.put_json(uri, summary)
    except Exception as exc:  # the validation failure is the news; a lost report is not
        log.warning("could not write the validation report to %s: %s", uri, exc)
        return None
    return uri


def _publish(
    storage,
    root: str,
    name: str,
    version: str,
    out_dir: str,
    files: list[str],
    manifest: dict,
    summary: dict,
    log: TaskLog,
) -> dict:
    """Upload the local files to a temporary prefix, then :func:`commit_version`."""
    staging = staging_prefix(root, name, version)
    try:
        for rel in files:
            # move: on the same filesystem a rename, not a copy; either way it frees scratch
            storage.upload_file(os.path.join(out_dir, rel), join(staging, rel), move=True)
    except BaseException:
        drop_prefix(storage, staging, log)
        raise
    return commit_version(storage, root, name, version, staging, files, manifest, summary, log)


def staging_prefix(root: str, name: str, version: str) -> str:
    """A fresh temporary prefix for one attempt's files: ``datasets/<name>/_staging-<version>-<uuid>``."""
    return join(root, "datasets", safe_segment(name), f"_staging-{version}-{uuid.uuid4().hex}")


def commit_version(
    storage,
    root: str,
    name: str,
    version: str,
    staging: str,
    files: list[str],
    manifest: dict,
    summary: dict,
    log: TaskLog,
) -> dict:
    """Copy ``files`` from ``staging`` into the version prefix, write ``validation.json`` and
    the manifest last (If-None-Match); delete ``staging``; return the manifest that won."""
    prefix = dataset_prefix(root, name, version)
    try:
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
            won = storage.get_json(join(prefix, MANIFEST_NAME))
            check_manifest_name(won, name, join(prefix, MANIFEST_NAME))
            return won
        log.info("committed dataset %s version %s at %s", name, version, prefix)
        return manifest
    finally:
        drop_prefix(storage, staging, log)


def drop_prefix(storage, staging: str, log: TaskLog) -> None:
    """Delete an attempt's temporary prefix; a failure to is only logged."""
    try:
        storage.delete_prefix(staging)
    except Exception as exc:  # leftover temp files are harmless; the commit stands
        log.warning("could not delete temporary prefix %s: %s", staging, exc)


def read_manifest(storage, uri: str, name: str) -> dict | None:
    """The manifest at ``uri`` in the folder computed for dataset ``name``, or None when there is
    none; one that records another dataset's name is refused (:func:`check_manifest_name`)."""
    try:
        manifest = storage.get_json(uri)
    except NotFound:
        return None
    check_manifest_name(manifest, name, uri)
    return manifest


def stage_result(manifest: dict, prefix: str, manifest_uri: str, *, reused: bool) -> dict:
    return {
        "dataset_name": manifest["name"],
        "version": manifest["version"],
        "uri": prefix,
        "manifest_uri": manifest_uri,
        "rows": int(manifest["rows"]["total"]),
        "train_tokens": int(manifest["splits"]["train"]["tokens"]),
        "eval_tokens": int(manifest["splits"]["eval"]["tokens"]),
        "reused": bool(reused),
        "validation_uri": join(prefix, VALIDATION_NAME),
        "quarantined_rows": int((manifest.get("quarantine") or {}).get("rows", 0)),
    }
