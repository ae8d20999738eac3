"""Quarantine on Spark: the rows to drop, and the worker engine's sample and counts.

The rows GX flags (its complete list of offending rows) and the rows staging cannot pack (a
null id or text, a record longer than a shard) are gathered on the driver as
``{row: [reasons]}``, as the worker engine does batch by batch, and dropped from the frame
with a broadcast anti-join. The sample is the first ``sample_rows`` of them in source
order, written by :class:`~trainops.staging.quarantine.QuarantineLog`, so it has the same
lines as the worker engine's.
"""

from __future__ import annotations

from collections import Counter
from itertools import groupby

from trainops.staging.quarantine import QuarantineLog
from trainops.staging.spark.frame import ROW, object_of
from trainops.staging.spark.pack import TOKENS


def unpackable(
    annotated, flagged: dict, id_column: str, text_column: str, shard_tokens: int
) -> dict[int, list[str]]:
    """``{row: [reason]}`` for the rows not already ``flagged`` that staging cannot pack."""
    from pyspark.sql import functions as F

    found = (
        annotated.where((F.col(TOKENS) < 0) | (F.col(TOKENS) > shard_tokens))
        .select(ROW, F.col(id_column).isNull().alias("no_id"), TOKENS)
        .collect()
    )
    out = {}
    for r in found:
        row = int(r[ROW])
        if row in flagged:
            continue
        if r[TOKENS] < 0:
            out[row] = [f"null {(id_column if r['no_id'] else text_column)!r}"]
        else:
            out[row] = [f"{int(r[TOKENS])} tokens > shard_tokens {shard_tokens}"]
    return out


def drop_rows(spark, frame, rows: dict):
    """``frame`` without the rows numbered in ``rows``."""
    from pyspark.sql import functions as F

    if not rows:
        return frame
    gone = spark.createDataFrame([(int(r),) for r in rows], f"{ROW} long")
    return frame.join(F.broadcast(gone), ROW, "left_anti")


def quarantine_log(frame, bad: dict[int, list[str]], starts, plan, rows_read: int, path: str) -> dict:
    """Write the sample of the ``bad`` rows to ``path``; return the quarantine summary."""
    from pyspark.sql import functions as F

    qlog = QuarantineLog(plan.quarantine, path)
    first = sorted(bad)[: plan.quarantine["sample_rows"]]
    if first:
        table = frame.where(F.col(ROW).isin(first)).orderBy(ROW).toArrow()
        numbers = [int(v) for v in table.column(ROW).to_pylist()]
        table = table.drop_columns([ROW])
        at = 0
        for obj, group in groupby(numbers, key=lambda row: object_of(starts, row)):
            rows = list(group)
            qlog.add(plan.objects[obj].uri, table.slice(at, len(rows)), rows, bad)
            at += len(rows)
    qlog.rows = len(bad)  # every dropped row counts, not only the sampled ones
    qlog.by_reason = Counter(reason for reasons in bad.values() for reason in reasons)
    qlog.close()
    return qlog.summary(rows_read)
