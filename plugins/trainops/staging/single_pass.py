"""The one pass over a source: read, validate, quarantine, aggregate, pack, batch by batch.

Per batch, in this order: GX checks the row expectations; with quarantine, the rows it
flags are set aside; the rest are tokenized and packed (rows the packer cannot take, such
as a record longer than a shard, are set aside too); what is left feeds the dataset-level
aggregates. Nothing here writes to storage: the caller decides, from the summary, whether
the local shards are published or only the report is kept.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

from trainer.contract import TASK_CAUSAL_LM, TASK_CLASSIFICATION, TASK_SFT
from trainops.staging.encoders import ByteTokenizer
from trainops.staging.pack import LABEL_COLUMN, SFT_COLUMNS, Packer
from trainops.staging.quarantine import SAMPLE_PATH, QuarantineLog
from trainops.staging.reader import iter_file_batches, local_copy, read_schema
from trainops.staging.schema import SchemaDrift, check_schema, drift_error
from trainops.staging.uniqueness import partitions_for
from trainops.staging.validation import DatasetValidator


class TaskLog(Protocol):
    """What staging logs to: a ``logging.Logger``, or Airflow's task logger."""

    def info(self, msg: str, /, *args: object) -> object: ...

    def warning(self, msg: str, /, *args: object) -> object: ...


def run_pass(
    source_storage,
    objects,
    suite: list[dict],
    tokenizer=None,
    *,
    scratch: str,
    out_dir: str,
    eval_percent: int,
    shard_tokens: int,
    slice_columns: list[str],
    batch_rows: int,
    id_column: str = "id",
    text_column: str = "text",
    quarantine: dict | None = None,
    log: TaskLog | None = None,
    task: str = TASK_CAUSAL_LM,
    labels: list[str] | None = None,
) -> dict:
    """Read every object once; return ``{"summary", "packed", "quarantine", "problem"}``.

    ``summary`` is the validation summary (with a ``quarantine`` block when quarantining),
    ``packed`` what :meth:`Packer.close` returns, ``problem`` the first row staging could
    not pack when there is no quarantine to put it in (None otherwise).
    """
    import numpy as np

    log = log or logging.getLogger(__name__)
    tokenizer = tokenizer or ByteTokenizer()
    texts = (
        list(SFT_COLUMNS)
        if task == TASK_SFT
        else [text_column, LABEL_COLUMN]
        if task == TASK_CLASSIFICATION
        else [text_column]
    )
    string_columns = list(dict.fromkeys([id_column, *texts, *slice_columns]))
    columns: dict[str, Any] = {
        "id_column": id_column,
        "text_column": texts,
        "slice_columns": slice_columns,
    }
    empty = [o for o in objects if o.size == 0]  # zero-byte JSONL/CSV: no rows (Parquet is refused)
    if empty:
        log.info("skipping %d empty objects (0 bytes, no rows), first %s", len(empty), empty[0].uri)
        objects = [o for o in objects if o.size > 0]
    drift = check_local_schemas(source_storage, objects, scratch, string_columns=string_columns, **columns)
    validator = DatasetValidator(
        suite,
        id_column=id_column,
        spill_dir=os.path.join(scratch, "spill"),
        partitions=partitions_for(sum(o.size for o in objects)),
        quarantine=quarantine is not None,
    )
    packer = Packer(
        out_dir,
        tokenizer,
        eval_percent=eval_percent,
        shard_tokens=shard_tokens,
        task=task,
        labels=labels,
        **columns,
    )
    qlog = QuarantineLog(quarantine, os.path.join(out_dir, SAMPLE_PATH)) if quarantine else None
    offset = 0
    for obj in objects:
        with local_copy(source_storage, obj, scratch) as path:
            if not obj.uri.startswith("file://"):  # downloaded one at a time: checked as it comes
                schema = read_schema(path, obj, string_columns=string_columns)
                check_schema(obj.uri, schema, **columns)
                problems = drift.add(obj.uri, schema)
                if problems:
                    raise drift_error(problems)
            start = offset
            for batch in iter_file_batches(path, obj, batch_rows=batch_rows, string_columns=string_columns):
                n = batch.num_rows
                rows = np.arange(offset, offset + n)
                bad = validator.check_rows(batch, offset)
                kept, kept_rows = _without(batch, rows, bad)
                skipped = packer.add(kept, kept_rows)
                if qlog is not None and (bad or skipped):
                    kept, kept_rows = _without(kept, kept_rows, skipped)
                    bad.update({r: [why] for r, why in skipped.items()})
                    mask = _mask(rows, bad)
                    qlog.add(obj.uri, batch.filter(mask), rows[mask], bad)
                validator.observe(kept, kept_rows)
                offset += n
        log.info("read %s: %d rows", obj.uri, offset - start)
    summary = validator.summary()
    packed = packer.close()
    qsum = None
    if qlog is not None:
        qlog.close()
        qsum = summary["quarantine"] = qlog.summary(validator.rows)
    return {
        "summary": summary,
        "packed": packed,
        "quarantine": qsum,
        "problem": packer.problem if qlog is None else None,
    }


def check_local_schemas(
    source_storage,
    objects,
    scratch: str,
    *,
    string_columns: list[str],
    id_column: str,
    text_column: str | list[str],
    slice_columns: list[str],
) -> SchemaDrift:
    """Check every ``file://`` object's schema (footer or first block) before any row is read;
    return the drift tracker with their types, for the objects still to come.

    Local files cost nothing to inspect: a bad or drifting schema is found up front."""
    drift = SchemaDrift(id_column)
    problems = []
    for obj in objects:
        if obj.uri.startswith("file://"):
            with local_copy(source_storage, obj, scratch) as path:
                schema = read_schema(path, obj, string_columns=string_columns)
            check_schema(
                obj.uri, schema, id_column=id_column, text_column=text_column, slice_columns=slice_columns
            )
            problems += drift.add(obj.uri, schema)
    if problems:
        raise drift_error(problems)
    return drift


def _mask(rows, chosen):
    import numpy as np

    return np.isin(rows, np.fromiter(chosen, dtype=np.int64, count=len(chosen)))


def _without(batch, rows, chosen):
    """The batch and its row numbers without the rows numbered in ``chosen``."""
    if not chosen:
        return batch, rows
    keep = ~_mask(rows, chosen)
    return batch.filter(keep), rows[keep]
