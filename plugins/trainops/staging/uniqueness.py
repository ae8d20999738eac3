"""Exact uniqueness over the whole dataset in flat memory: hash partitions spilled to disk.

Every non-null value goes, with its record's id and row number, to one of ``partitions``
Arrow IPC files chosen by a hash of the value. Equal values hash alike, so a duplicate
always lands in one partition; at the end each partition is read alone and counted
exactly (values, not hashes, are compared, so a hash collision cannot invent a
duplicate). Memory holds one batch while spilling and one partition while checking; the
local disk holds every value once.
"""

from __future__ import annotations

import heapq
import os

_SAMPLES = 5
MIN_PARTITIONS = 16
MAX_PARTITIONS = 256
_TARGET_PARTITION_BYTES = 64 << 20


def partitions_for(source_bytes: int) -> int:
    """Enough partitions that each holds well under 64 MiB of a source this size (a power of 2)."""
    n = MIN_PARTITIONS
    while n < MAX_PARTITIONS and source_bytes / n > _TARGET_PARTITION_BYTES:
        n *= 2
    return n


class UniqueCheck:
    """``expect_column_values_to_be_unique`` over the whole dataset.

    Counts like GX: every occurrence of a repeated value is unexpected (two rows sharing a
    value give an unexpected_count of 2); nulls are ignored. Values are compared as strings.
    """

    def __init__(self, expectation: dict, id_column: str, spill_dir: str, partitions: int = MIN_PARTITIONS):
        self.expectation = expectation
        self.column = expectation["kwargs"]["column"]
        self.id_column = id_column
        self.partitions = int(partitions)
        self._dir = spill_dir
        os.makedirs(spill_dir, exist_ok=True)
        self._writers: dict[int, tuple] = {}
        self._schema = None

    def update(self, batch, rows) -> None:
        """Spill one batch; ``rows`` are the batch rows' numbers in the source (a numpy array)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        values = _as_strings(batch.column(batch.schema.get_field_index(self.column)))
        valid = pc.is_valid(values)
        if valid.false_count:
            values = values.filter(valid)
            rows = np.asarray(rows)[valid.to_numpy(zero_copy_only=False)]
        if not len(values):
            return
        cols = {"value": values, "row": pa.array(np.asarray(rows, dtype=np.int64))}
        if self.column != self.id_column and self.id_column in batch.schema.names:
            ids = _as_strings(batch.column(batch.schema.get_field_index(self.id_column)))
            cols["id"] = ids.filter(valid) if valid.false_count else ids
        table = pa.table(cols)
        part = _hash(values) % np.uint64(self.partitions)
        order = np.argsort(part, kind="stable")
        table = table.take(pa.array(order))
        counts = np.bincount(part, minlength=self.partitions)
        start = 0
        for p in np.flatnonzero(counts):
            n = int(counts[p])
            self._writer(int(p), table.schema).write_table(table.slice(start, n))
            start += n

    def _writer(self, p: int, schema):
        import pyarrow as pa

        if p not in self._writers:
            sink = pa.OSFile(os.path.join(self._dir, f"part-{p:04d}.arrow"), "wb")
            self._writers[p] = (sink, pa.ipc.new_stream(sink, schema))
        return self._writers[p][1]

    def result(self) -> dict:
        """Check each partition alone; delete the spill files."""
        import pyarrow as pa
        import pyarrow.compute as pc

        for sink, writer in self._writers.values():
            writer.close()
            sink.close()
        unexpected = 0
        smallest: list = []  # the _SAMPLES smallest duplicated values, with an id and a row each
        for p in sorted(self._writers):
            path = os.path.join(self._dir, f"part-{p:04d}.arrow")
            with pa.memory_map(path) as source:
                table = pa.ipc.open_stream(source).read_all()
            counts = table.group_by("value").aggregate([("value", "count")])
            dupes = counts.filter(pc.greater(counts["value_count"], 1))
            if dupes.num_rows:
                unexpected += int(pc.sum(dupes["value_count"]).as_py())
                values = sorted(dupes["value"].to_pylist())[:_SAMPLES]
                for value in values:
                    hit = table.filter(pc.equal(table["value"], value))
                    first = int(pc.min(hit["row"]).as_py())
                    ident = value
                    if "id" in table.column_names:
                        ident = hit.filter(pc.equal(hit["row"], first))["id"][0].as_py()
                    smallest.append((value, ident, first))
                smallest = heapq.nsmallest(_SAMPLES, smallest)
            del table
            os.unlink(path)
        self._writers = {}
        return {
            "success": unexpected == 0,
            "unexpected_count": unexpected,
            "sample_ids": sorted(str(i) for _, i, _ in smallest if i is not None),
            "sample_values": [v for v, _, _ in smallest],
            "sample_rows": sorted(r for _, _, r in smallest),
        }


def _as_strings(array):
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_large_string(array.type):
        return array
    return array.cast(pa.large_string())


def _hash(values):
    """A uint64 hash per value, vectorized (pandas' siphash of the UTF-8 bytes)."""
    import pandas as pd

    return pd.util.hash_array(values.to_numpy(zero_copy_only=False), categorize=False)
