"""Stage a source on Spark: the same plan, validation, shards and commit as the worker engine.

The driver (this process: an Airflow worker, in local mode or as a Spark Connect client)
plans the run with :func:`~trainops.staging.plan.plan_stage`, so the version is the one
the in-worker engine would name, and reuses a version already staged by either engine. The
source is read once into a cached frame; GX validates it; on failure only the report is
kept, as with the worker engine. Otherwise the executors write the shards straight to a
temporary prefix, the driver writes the eval index, and
:func:`~trainops.staging.stage.commit_version` copies them into the version prefix and
writes the manifest last.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainer.contract import join
from trainops.staging.errors import StagingError
from trainops.staging.manifest import EVAL_INDEX_PATH, build_manifest
from trainops.staging.pack import null_problem, too_long_problem
from trainops.staging.plan import plan_stage
from trainops.staging.quarantine import SAMPLE_PATH
from trainops.staging.single_pass import check_local_schemas
from trainops.staging.spark.frame import ROW, read_source
from trainops.staging.spark.pack import TOKENS, annotate, eval_index_lines, with_offsets, write_shards
from trainops.staging.spark.quarantine import drop_rows, quarantine_log, unpackable
from trainops.staging.spark.session import get_session, session_settings
from trainops.staging.spark.validate import check_dataset, check_rows
from trainops.staging.stage import (
    TaskLog,
    check_packed,
    commit_version,
    drop_prefix,
    failure_of,
    read_manifest,
    stage_result,
    staging_prefix,
    write_report,
)
from trainops.staging.tokenize import DEFAULT_EVAL_PERCENT, DEFAULT_SHARD_TOKENS
from trainops.staging.validation import summarize

_log = logging.getLogger(__name__)


def stage_dataset_spark(
    storage,
    root: str,
    source_uri: str,
    name: str,
    *,
    source_storage=None,
    expectations=None,
    eval_percent: int = DEFAULT_EVAL_PERCENT,
    slice_columns: Sequence[str] = ("source",),
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    id_column: str = "id",
    text_column: str = "text",
    tokenizer: str | dict | None = None,
    quarantine: dict | None = None,
    open_storage: Callable | None = None,
    spark=None,
    spark_remote: str | None = None,
    spark_master: str | None = None,
    spark_conf: Mapping[str, str] | None = None,
    scratch_dir: str | None = None,
    log: TaskLog | None = None,
) -> dict:
    """:func:`~trainops.staging.stage.stage_dataset` on Spark; the same arguments, errors
    and result. ``spark`` is a session to use; otherwise one is made from ``spark_remote``
    (or ``SPARK_REMOTE``), ``spark_master`` (default ``local[*]``) and ``spark_conf``.

    The executors open the storage root themselves (``trainer.storage.open_storage``), so
    with ``s3://`` they need credentials in their own environment.
    """
    log = log or _log
    source_storage = source_storage or storage
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
    )
    existing = read_manifest(storage, plan.manifest_uri, name)
    if existing is not None:
        log.info("dataset %s version %s already staged at %s; reusing it", name, plan.version, plan.prefix)
        return stage_result(existing, plan.prefix, plan.manifest_uri, reused=True)

    string_columns = list(dict.fromkeys([id_column, text_column, *plan.slice_columns]))
    with tempfile.TemporaryDirectory(prefix="trainops-stage-", dir=scratch_dir) as scratch:
        check_local_schemas(
            source_storage,
            plan.objects,
            scratch,
            string_columns=string_columns,
            id_column=id_column,
            text_column=text_column,
            slice_columns=plan.slice_columns,
        )
        if spark is None:
            settings = session_settings(
                spark_remote=spark_remote, spark_master=spark_master, conf=spark_conf, env=os.environ
            )
            log.info("staging on Spark (%s %s)", settings["mode"], settings["url"])
            spark = get_session(settings)
        run = _Run(
            spark=spark,
            storage=storage,
            plan=plan,
            source_uri=source_uri,
            name=name,
            staging=staging_prefix(root, name, plan.version),
            scratch=scratch,
            eval_percent=eval_percent,
            shard_tokens=shard_tokens,
            id_column=id_column,
            text_column=text_column,
            log=log,
        )
        try:
            manifest, summary = _validate_and_pack(run, string_columns)
        except BaseException:
            drop_prefix(storage, run.staging, log)
            raise
        files = [s["path"] for split in ("train", "eval") for s in manifest["splits"][split]["shards"]]
        if manifest.get("quarantine", {}).get("sample"):
            files.append(SAMPLE_PATH)
        committed = commit_version(
            storage, root, name, plan.version, run.staging, [*files, EVAL_INDEX_PATH], manifest, summary, log
        )
    return stage_result(committed, plan.prefix, plan.manifest_uri, reused=committed is not manifest)


@dataclass(frozen=True)
class _Run:
    """One Spark staging run's fixed inputs."""

    spark: Any
    storage: Any
    plan: Any  # trainops.staging.plan.StagePlan
    source_uri: str
    name: str
    staging: str  # the temporary prefix the executors write to
    scratch: str
    eval_percent: int
    shard_tokens: int
    id_column: str
    text_column: str
    log: TaskLog


def _validate_and_pack(run: _Run, string_columns: list[str]) -> tuple[dict, dict]:
    """``(manifest, summary)``; raises the worker engine's errors (report kept) on bad data."""
    from pyspark import StorageLevel

    plan = run.plan
    frame, rows, starts = read_source(run.spark, plan.objects, string_columns=string_columns)
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    cached = [frame]
    try:
        run.log.info("read %s: %d rows in %d objects", run.source_uri, rows, len(plan.objects))
        entries, bad = check_rows(
            frame, plan.suite, id_column=run.id_column, quarantine=plan.quarantine is not None
        )
        annotated = annotate(
            frame,
            plan.tokenizer,
            id_column=run.id_column,
            text_column=run.text_column,
            eval_percent=run.eval_percent,
        ).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(annotated)
        kept, qsum, sample = annotated, None, None
        if plan.quarantine is not None:
            bad.update(unpackable(annotated, bad, run.id_column, run.text_column, run.shard_tokens))
            kept = drop_rows(run.spark, annotated, bad)
            sample = os.path.join(run.scratch, "out", SAMPLE_PATH)
            qsum = quarantine_log(frame, bad, starts, plan, rows, sample)
            sample = sample if qsum["sample"] else None
        entries += check_dataset(kept, plan.suite, rows=rows - len(bad), id_column=run.id_column)
        summary = summarize(plan.suite, entries, rows)
        if qsum is not None:
            summary["quarantine"] = qsum
        failure = failure_of(run.source_uri, summary, qsum)
        if failure is not None:
            error, message = failure
            summary["success"] = False
            report = write_report(run.storage, plan.prefix, summary, sample, run.log)
            raise error(f"{message}. Full report: {report}" if report else message, summary, report)
        if plan.quarantine is None:
            _refuse_unpackable(run, annotated)
        frame.unpersist()  # the annotated copy is cached now: one copy of the data at a time
        if sample:
            run.storage.upload_file(sample, join(run.staging, SAMPLE_PATH))
        return _pack(run, kept, summary, qsum, cached), summary
    finally:
        for df in cached:
            df.unpersist()


def _pack(run: _Run, kept, summary: dict, qsum: dict | None, cached: list) -> dict:
    """Write the shards and the eval index of the ``kept`` rows to ``run.staging``; return
    the manifest."""
    from pyspark import StorageLevel

    plan, tok = run.plan, run.plan.tokenizer
    spans, totals = with_offsets(run.spark, kept)
    if spans is not None:  # read twice: by the shard writers and for the eval index
        spans = spans.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(spans)
    rows = {"train": totals["train"]["records"], "eval": totals["eval"]["records"]}
    rows["total"] = rows["train"] + rows["eval"]
    splits = _write_shards(run, spans, totals)
    check_packed(run.source_uri, run.name, {"splits": splits, "rows": rows}, run.eval_percent, run.log)
    _write_index(run, spans)
    return build_manifest(
        name=run.name,
        version=plan.version,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        source_uri=run.source_uri,
        objects=plan.identities,
        tokenizer=tok.config,
        token_dtype=tok.dtype,
        splits=splits,
        split_rule=plan.split_rule,
        eval_records=rows["eval"],
        slice_columns=plan.slice_columns,
        rows=rows,
        validation=summary,
        quarantine=qsum,
        engine="spark",
    )


def _refuse_unpackable(run: _Run, annotated) -> None:
    """The worker engine's error for the first row (in source order) staging cannot pack:
    a null id or text, or a record longer than a shard."""
    from pyspark.sql import functions as F

    bad = (
        annotated.where((F.col(TOKENS) < 0) | (F.col(TOKENS) > run.shard_tokens))
        .orderBy(ROW)
        .limit(1)
        .collect()
    )
    if not bad:
        return
    r = bad[0]
    if r[TOKENS] < 0:
        column = run.id_column if r[run.id_column] is None else run.text_column
        raise StagingError(null_problem(int(r[ROW]), column))
    raise StagingError(too_long_problem(str(r[run.id_column]), int(r[ROW]), int(r[TOKENS]), run.shard_tokens))


def _write_shards(run: _Run, spans, totals: dict) -> dict:
    """Each split's ``{"tokens", "shards"}``, the shards written by the executors."""
    shards: list[dict] = []
    if spans is not None:
        most = max(totals["train"]["tokens"], totals["eval"]["tokens"])
        parts = min(
            -(-most // run.shard_tokens), int(run.spark.conf.get("spark.sql.shuffle.partitions") or 8)
        )
        shards = write_shards(
            spans,
            run.plan.tokenizer,
            staging_uri=run.staging,
            text_column=run.text_column,
            shard_tokens=run.shard_tokens,
            parts=max(1, parts),
        )
    return {
        s: {
            "tokens": totals[s]["tokens"],
            "shards": [{k: x[k] for k in ("path", "tokens", "sha256")} for x in shards if x["split"] == s],
        }
        for s in ("train", "eval")
    }


def _write_index(run: _Run, spans) -> None:
    """The eval index, streamed from the executors a partition at a time, then uploaded."""
    index = os.path.join(run.scratch, "index.jsonl")
    with open(index, "w", encoding="utf-8") as out:
        if spans is not None:
            for line in eval_index_lines(
                spans, id_column=run.id_column, slice_columns=run.plan.slice_columns
            ):
                out.write(line)
    run.storage.upload_file(index, join(run.staging, EVAL_INDEX_PATH), move=True)
