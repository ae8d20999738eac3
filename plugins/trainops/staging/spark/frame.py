"""Read a source into a Spark DataFrame with each row's number in source order.

The in-worker engine reads the objects in URI order, each from its first row to its last;
that order decides the token stream. Spark reads file splits in whatever order it plans
them, so each row gets ``ROW``: its number in the worker engine's order. A split is one
object's rows from one offset (``_metadata.file_block_start``), read contiguously in one
task, so ``monotonically_increasing_id`` counts the rows within it; the driver sums the
splits' row counts in (object, offset) order. The numbers depend on the source only, not
on how Spark partitions it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from trainops.staging.errors import StagingError

ROW = "_trainops_row"
_FILE, _BLOCK, _MID = "_trainops_file", "_trainops_block", "_trainops_mid"
_READERS = {"parquet": "parquet", "jsonl": "json", "csv": "csv"}


def spark_path(uri: str) -> str:
    """The path Spark reads for a source URI (``s3://`` through Hadoop's ``s3a``)."""
    return "s3a://" + uri[len("s3://") :] if uri.startswith("s3://") else uri


def path_key(uri: str) -> str:
    """A URI without its scheme's spelling (``file:/x``, ``file:///x``, ``s3a://b/k``, ``s3://b/k``)
    or percent-encoding, so Spark's ``_metadata.file_path`` matches the listed object."""
    parts = urlsplit(uri)
    return unquote(f"{parts.netloc}{parts.path}")


def split_offsets(splits: Sequence[tuple[int, int, int]]) -> dict[tuple[int, int], int]:
    """``{(object index, block start): first row number}`` from ``(object, block, rows)`` (pure)."""
    offsets, total = {}, 0
    for obj, block, rows in sorted(splits):
        offsets[(obj, block)] = total
        total += rows
    return offsets


def read_source(spark, objects, *, string_columns: Sequence[str]):
    """``(frame, rows, starts)``: every object's rows with ``ROW`` (0..rows-1 in source order),
    and ``(first row, object index)`` for each object with rows;
    ``string_columns`` (the id, text and slice columns) must exist."""
    from pyspark.sql import functions as F

    formats = sorted({o.format for o in objects})
    if len(formats) != 1:
        raise StagingError(
            f"the Spark engine reads one format per source, this one mixes {formats}: stage "
            "each format separately, or use engine='worker'"
        )
    reader = spark.read
    if formats[0] == "csv":
        reader = reader.option("header", True)
    raw = reader.format(_READERS[formats[0]]).load([spark_path(o.uri) for o in objects])
    missing = [c for c in string_columns if c not in raw.columns]
    if missing:
        raise StagingError(
            f"source lacks columns {missing} (it has {raw.columns}): add them to the data, or "
            "change slice_columns"
        )
    # Columns keep the types the files give them; ids become strings only where they are
    # split and packed. The worker engine reads a CSV's id, text and slice columns as text
    # that is never null (an empty field is ''); Spark reads an empty field as null.
    text = string_columns if formats[0] == "csv" else ()
    data = [
        F.coalesce(F.col(f"`{c}`"), F.lit("")).alias(c) if c in text else F.col(f"`{c}`") for c in raw.columns
    ]
    scan = raw.select(
        *data,
        F.col("_metadata.file_path").alias(_FILE),
        F.col("_metadata.file_block_start").alias(_BLOCK),
        F.monotonically_increasing_id().alias(_MID),
    )
    counted = (
        scan.groupBy(_FILE, _BLOCK).agg(F.count(F.lit(1)).alias("n"), F.min(_MID).alias("first")).collect()
    )
    index = {path_key(o.uri): i for i, o in enumerate(objects)}
    unknown = [r[_FILE] for r in counted if path_key(r[_FILE]) not in index]
    if unknown:
        raise StagingError(f"Spark read files the source listing does not name: {unknown[:3]}")
    keyed = [(index[path_key(r[_FILE])], int(r[_BLOCK]), int(r["n"])) for r in counted]
    offsets = split_offsets(keyed)
    table = [
        (r[_FILE], int(r[_BLOCK]), offsets[(k[0], k[1])] - int(r["first"]))
        for r, k in zip(counted, keyed, strict=True)
    ]
    rows = sum(k[2] for k in keyed)
    first: dict[int, int] = {}
    for obj, block, n in keyed:
        if n:
            first[obj] = min(first.get(obj, offsets[(obj, block)]), offsets[(obj, block)])
    starts = sorted((row, obj) for obj, row in first.items())
    if not table:
        return scan.select(*raw.columns).withColumn(ROW, F.lit(0).cast("long")).limit(0), 0, []
    shift = spark.createDataFrame(table, f"{_FILE} string, {_BLOCK} long, shift long")
    frame = scan.join(F.broadcast(shift), [_FILE, _BLOCK]).select(
        *[F.col(f"`{c}`") for c in raw.columns], (F.col(_MID) + F.col("shift")).alias(ROW)
    )
    return frame, rows, starts


def object_of(starts: Sequence[tuple[int, int]], row: int) -> int:
    """The index of the object holding ``row``, from ``(first row, object index)`` (pure)."""
    return starts[bisect.bisect_right(starts, (row, float("inf"))) - 1][1]
