"""Tokenize record batches into train/eval shards and the eval index, in a local folder."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterable, Sequence

from trainops.staging.errors import StagingError
from trainops.staging.manifest import EVAL_INDEX_PATH
from trainops.staging.tokenize import ShardPacker, encode, index_line, split_of


def pack_batches(batches: Iterable, out_dir: str, *, eval_percent: int, shard_tokens: int,
                 slice_columns: Sequence[str] = ("source",), id_column: str = "id",
                 text_column: str = "text") -> dict:
    """Write ``train/*.bin``, ``eval/*.bin`` and ``eval/index.jsonl`` under ``out_dir``.

    Returns ``{"splits": {split: {"tokens", "shards"}}, "rows": {"total", "train", "eval"},
    "eval_records": int, "files": [relative paths]}``.
    """
    packers = {s: ShardPacker(out_dir, s, shard_tokens) for s in ("train", "eval")}
    os.makedirs(os.path.join(out_dir, "eval"), exist_ok=True)
    row = 0
    with open(os.path.join(out_dir, EVAL_INDEX_PATH), "w", encoding="utf-8") as index:
        for batch in batches:
            ids = batch.column(id_column).to_pylist()
            texts = batch.column(text_column).to_pylist()
            slices = {c: batch.column(c).to_pylist() for c in slice_columns}
            for i, (record_id, text) in enumerate(zip(ids, texts)):
                if record_id is None or text is None:
                    column = id_column if record_id is None else text_column
                    raise StagingError(
                        f"row {row + i} has a null {column!r}, which staging cannot split or "
                        f"tokenize: add expect_column_values_to_not_be_null for {column!r} "
                        "to the expectations or clean the data"
                    )
                record_id = str(record_id)
                split = split_of(record_id, eval_percent)
                start, end = packers[split].add(encode(str(text)))
                if split == "eval":
                    values = {c: _json_value(slices[c][i]) for c in slice_columns}
                    index.write(index_line(record_id, values, start, end))
            row += batch.num_rows
    splits = {s: p.close() for s, p in packers.items()}
    files = [sh["path"] for s in ("train", "eval") for sh in splits[s]["shards"]]
    return {
        "splits": splits,
        "rows": {"total": row, "train": packers["train"].records,
                 "eval": packers["eval"].records},
        "eval_records": packers["eval"].records,
        "files": [*files, EVAL_INDEX_PATH],
    }


def _json_value(value):
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
