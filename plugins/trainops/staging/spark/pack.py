"""Tokenize and pack on Spark: the worker engine's token streams, cut into the same shards.

1. ``annotate`` (``mapInArrow``): each row's split (the id hash of
   :func:`~trainops.staging.tokenize.eval_mask`) and token count, by the run's tokenizer.
2. ``offsets``: each split's stream is its rows in ``ROW`` order (the source order the
   worker engine packs in). Token counts are summed per block of ``CHUNK`` rows on the
   executors, the driver turns the few sums into block offsets, and a window within each
   block gives every row its span ``[start, end)`` in its split's stream.
3. ``write_shards`` (``mapInArrow``): shard ``k`` of a split holds stream tokens
   ``[k * shard_tokens, (k + 1) * shard_tokens)``; the rows that touch it are brought to one
   task, which tokenizes them again, cuts the span and writes the shard straight to the
   storage prefix, returning its size and sha256.

None of it depends on how Spark partitions the data: the bytes are those of the
in-worker engine's :class:`~trainops.staging.pack.Packer`.
"""

from __future__ import annotations

import datetime as dt
import hashlib

from trainer.contract import join
from trainer.storage import open_storage
from trainops.staging.pack import json_value
from trainops.staging.spark.frame import ROW
from trainops.staging.tokenize import eval_mask, index_line

CHUNK = 1 << 16  # rows per offset block: the driver holds two sums per block
SPLIT, TOKENS, START, END, SHARD = (
    "_trainops_eval",
    "_trainops_tokens",
    "_trainops_start",
    "_trainops_end",
    "_trainops_shard",
)


def annotate(frame, tokenizer, *, id_column: str, text_column: str, eval_percent: int):
    """``frame`` plus ``SPLIT`` (True for eval; null when the id or text is null) and
    ``TOKENS`` (the record's token count with EOS; -1 when the id or text is null)."""
    from pyspark.sql.types import BooleanType, LongType, StructField, StructType

    schema = StructType(
        [*frame.schema.fields, StructField(SPLIT, BooleanType()), StructField(TOKENS, LongType())]
    )

    def run(batches):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            ids, texts = batch.column(id_column), batch.column(text_column)
            ok = pc.and_(pc.is_valid(ids), pc.is_valid(texts)).to_numpy(zero_copy_only=False)
            lengths = np.full(batch.num_rows, -1, dtype=np.int64)
            split = np.zeros(batch.num_rows, dtype=bool)
            if ok.any():
                keep = pa.array(ok)
                _, n = tokenizer.encode_batch(pc.filter(texts, keep))
                lengths[ok] = n
                split[ok] = eval_mask([str(v) for v in pc.filter(ids, keep).to_pylist()], eval_percent)
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(split, mask=~ok), pa.array(lengths)],
                schema=pa.schema([*batch.schema, pa.field(SPLIT, pa.bool_()), pa.field(TOKENS, pa.int64())]),
            )

    return frame.mapInArrow(run, schema)


def chunk_offsets(sums) -> tuple[dict[tuple[bool, int], int], dict[str, dict]]:
    """From ``(is_eval, chunk, tokens, records)`` sums: each block's first token in its
    split's stream, and per split ``{"tokens", "records"}`` (pure)."""
    offsets: dict[tuple[bool, int], int] = {}
    totals = {"train": {"tokens": 0, "records": 0}, "eval": {"tokens": 0, "records": 0}}
    for is_eval, chunk, tokens, records in sorted(sums):
        split = totals["eval" if is_eval else "train"]
        offsets[(bool(is_eval), int(chunk))] = split["tokens"]
        split["tokens"] += int(tokens)
        split["records"] += int(records)
    return offsets, totals


def with_offsets(spark, annotated):
    """``(frame with START and END, totals)``: every packable row's span in its split's stream."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    chunk = F.floor(F.col(ROW) / CHUNK).alias("chunk")
    rows = annotated.where(F.col(TOKENS) >= 0)
    sums = (
        rows.groupBy(F.col(SPLIT), chunk)
        .agg(F.sum(TOKENS).alias("t"), F.count(F.lit(1)).alias("n"))
        .collect()
    )
    offsets, totals = chunk_offsets([(r[SPLIT], r["chunk"], r["t"], r["n"]) for r in sums])
    if not offsets:
        return None, totals
    base = spark.createDataFrame(
        [(s, c, o) for (s, c), o in offsets.items()], f"{SPLIT} boolean, chunk long, base long"
    )
    window = Window.partitionBy(SPLIT, "chunk").orderBy(ROW).rowsBetween(Window.unboundedPreceding, 0)
    spans = (
        rows.withColumn("chunk", chunk)
        .join(F.broadcast(base), [SPLIT, "chunk"])
        .withColumn(END, F.col("base") + F.sum(TOKENS).over(window))
        .withColumn(START, F.col(END) - F.col(TOKENS))
        .drop("chunk", "base")
    )
    return spans, totals


def write_shards(spans, tokenizer, *, staging_uri: str, text_column: str, shard_tokens: int, parts: int):
    """Write every shard under ``staging_uri``; return ``[{"split", "index", "path", "tokens",
    "sha256"}]`` sorted by split and index."""
    from pyspark.sql import functions as F

    width = 2 if tokenizer.dtype == "uint16" else 4
    dtype = "<u2" if width == 2 else "<u4"
    first = F.floor(F.col(START) / shard_tokens)
    last = F.floor((F.col(END) - 1) / shard_tokens)
    pieces = (
        spans.select(SPLIT, START, END, text_column)
        .withColumn(SHARD, F.explode(F.sequence(first, last)))
        .repartition(parts, SPLIT, SHARD)
        .sortWithinPartitions(SPLIT, SHARD, START)
    )
    schema = "split string, idx long, path string, tokens long, sha256 string"

    def run(batches):
        import numpy as np
        import pyarrow as pa

        storage = open_storage(staging_uri)
        current: list = [None, [], 0]  # (split, shard), token arrays, tokens so far

        def flush():
            key, arrays, _ = current
            if key is None:
                return None
            data = b"".join(a.tobytes() for a in arrays)
            split, idx = key
            rel = f"{split}/{idx:05d}.bin"
            storage.put(join(staging_uri, rel), data)
            return {
                "split": split,
                "idx": idx,
                "path": rel,
                "tokens": len(data) // width,
                "sha256": hashlib.sha256(data).hexdigest(),
            }

        done = []
        for batch in batches:
            tokens, lengths = tokenizer.encode_batch(batch.column(text_column))
            tokens = np.asarray(tokens).astype(dtype, copy=False)
            ends = np.cumsum(lengths)
            starts = ends - lengths
            cols = batch.to_pydict()
            for i in range(batch.num_rows):
                key = ("eval" if cols[SPLIT][i] else "train", int(cols[SHARD][i]))
                if key != current[0]:
                    out = flush()
                    if out:
                        done.append(out)
                    current[:] = [key, [], 0]
                lo = max(cols[START][i], key[1] * shard_tokens) - cols[START][i]
                hi = min(cols[END][i], (key[1] + 1) * shard_tokens) - cols[START][i]
                current[1].append(tokens[starts[i] + lo : starts[i] + hi])
        out = flush()
        if out:
            done.append(out)
        if done:
            yield pa.RecordBatch.from_pylist(
                done,
                schema=pa.schema(
                    [
                        ("split", pa.string()),
                        ("idx", pa.int64()),
                        ("path", pa.string()),
                        ("tokens", pa.int64()),
                        ("sha256", pa.string()),
                    ]
                ),
            )

    written = pieces.mapInArrow(run, schema).collect()
    return sorted((r.asDict() for r in written), key=lambda r: (r["split"], r["idx"]))


def eval_index_lines(spans, *, id_column: str, slice_columns: list[str]):
    """The eval index's lines in stream order, streamed to the driver a partition at a time."""
    from pyspark.sql import functions as F

    kinds = {f.name: f.dataType.typeName() for f in spans.schema.fields}
    # An instant travels as microseconds since the epoch, so it reads back in UTC, as the
    # worker engine writes it, whatever the driver's local time zone.
    instant = {c for c in slice_columns if kinds.get(c) == "timestamp"}
    cols = [F.unix_micros(c).alias(c) if c in instant else F.col(c) for c in slice_columns]
    picked = spans.where(F.col(SPLIT)).select(id_column, *cols, START, END).orderBy(START)
    for r in picked.toLocalIterator():
        values = {c: json_value(_utc(r[c]) if c in instant else r[c]) for c in slice_columns}
        yield index_line(str(r[id_column]), values, int(r[START]), int(r[END]))


def _utc(micros):
    if micros is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(micros))
