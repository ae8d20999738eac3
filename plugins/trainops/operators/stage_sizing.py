"""What a staging pod needs, from the source it stages. Pure.

A staging job (``python -m trainops.staging.job``) is one process making one pass over the
source (:mod:`trainops.staging.stage`): each record batch is validated by great-expectations,
tokenized and appended to the local shard files.

**Memory**, at its peak, holds one batch several times over: the Arrow batch, the pandas frame
great-expectations validates (a copy as Python strings), the work of its checks, the batch's
tokens (:mod:`~trainops.staging.encoders`: 2 bytes per text byte with the byte-level
tokenizer) and their concatenation: ``BATCH_COPIES`` = 5 copies of one batch of text. A
batch is at most ``DEFAULT_BATCH_ROWS`` rows (65536), and never more than an object holds:
``min(batch_rows x ROW_BYTES, largest object x its expansion)``, where ``ROW_BYTES`` (16 KiB)
is a long document's text and a Parquet object's text is ``PARQUET_EXPANSION`` (3) times its
compressed size (JSONL and CSV: 1). The shards are not held: :class:`~trainops.staging.tokenize.
ShardPacker` writes each batch's tokens to the open shard file as it goes. The uniqueness check
reads one spill partition at a time (:func:`~trainops.staging.uniqueness.partitions_for`), at
most the source's text over the partitions. Add the process (pyarrow, pandas and
great-expectations loaded: 2 GiB) and a Hugging Face tokenizer's (1 GiB; the built-in
byte-level one has none), then the training pods' margin (25 %) and floor (4 GiB).

**Disk** (the container's writable layer, ``/tmp``: the pod's ``ephemeral-storage``) holds
every shard until the end, when they are uploaded (the train and eval splits: the source's
text x the tokens' bytes per text byte, 2 with the byte-level tokenizer in uint16, 2 at most
with a Hugging Face one: about 4 bytes a token in uint32), the uniqueness spill (every value
of the unique columns once: the source's text at most) and one downloaded ``s3://`` object.
The sum gets the training pods' margin (25 %, at least 2 GiB) and the 2 GiB for logs and the
image's writable layer.

CPU: 2 (the pass is one thread; downloads and Arrow's readers take the second).
``job_options`` ``cpu``, ``memory`` and ``ephemeral_storage`` override each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainops.operators.sizing import (
    CPU_PROCESS_BYTES,
    GIB,
    MARGIN,
    MIN_MARGIN_BYTES,
    MIN_MEMORY,
    REQUEST_EXTRA_BYTES,
    gib,
)
from trainops.staging.reader import DEFAULT_BATCH_ROWS
from trainops.staging.uniqueness import partitions_for

ROW_BYTES = 16 << 10  # a long document's text: the default suite allows 20000 characters
PARQUET_EXPANSION = 3  # a Parquet object's text beside its compressed size
BATCH_COPIES = 5  # Arrow batch, pandas frame, GX's work, tokens, their concatenation
TOKEN_BYTES_PER_TEXT_BYTE = 2  # byte-level: 1 uint16 token a byte; HF: ~4 bytes a uint32 token
TOKENIZER_BYTES = GIB  # a Hugging Face tokenizer loaded (the byte-level one: none)
STAGE_CPU = 2


@dataclass(frozen=True)
class StagePod:
    """A staging pod's CPU, memory and disk, and what they count (bytes).

    :param text_bytes: the source's JSONL and CSV objects, together.
    :param parquet_bytes: its Parquet objects, together (compressed).
    :param largest_object: the largest object's size; ``largest_parquet`` whether it is Parquet.
    :param downloads: the objects are downloaded to the scratch folder (``s3://``).
    :param hf_tokenizer: a Hugging Face tokenizer, not the built-in byte-level one.
    """

    text_bytes: int
    parquet_bytes: int
    largest_object: int
    largest_parquet: bool
    downloads: bool
    hf_tokenizer: bool
    batch_rows: int = DEFAULT_BATCH_ROWS

    @property
    def source_text(self) -> int:
        """The source's text, decompressed."""
        return self.text_bytes + PARQUET_EXPANSION * self.parquet_bytes

    @property
    def batch_bytes(self) -> int:
        """One batch's text: ``batch_rows`` long documents, never more than an object holds."""
        largest = self.largest_object * (PARQUET_EXPANSION if self.largest_parquet else 1)
        return min(self.batch_rows * ROW_BYTES, largest)

    @property
    def partition_bytes(self) -> int:
        """One uniqueness spill partition, read alone at the end."""
        return math.ceil(self.source_text / partitions_for(self.source_text))

    @property
    def memory_bytes(self) -> int:
        """The memory request (= limit): process, tokenizer, batch copies and one partition,
        plus 25 %; at least 4 GiB."""
        held = (
            CPU_PROCESS_BYTES
            + (TOKENIZER_BYTES if self.hf_tokenizer else 0)
            + BATCH_COPIES * self.batch_bytes
            + self.partition_bytes
        )
        return max(MIN_MEMORY, math.ceil(held * (1 + MARGIN)))

    @property
    def disk_bytes(self) -> int:
        """The ``ephemeral-storage`` request: shards, spill, one download, margin and extra."""
        files = (
            self.source_text * TOKEN_BYTES_PER_TEXT_BYTE
            + self.source_text
            + (self.largest_object if self.downloads else 0)
        )
        return files + max(MIN_MARGIN_BYTES, math.ceil(files * MARGIN)) + REQUEST_EXTRA_BYTES

    def options(self) -> dict[str, str]:
        """The JobSpec fields it sets (``job_options`` override them)."""
        return {
            "cpu": str(STAGE_CPU),
            "memory": gib(self.memory_bytes),
            "ephemeral_storage": gib(self.disk_bytes),
        }

    def describe(self) -> str:
        """One line for the task log: what was counted."""
        tokenizer = " + a Hugging Face tokenizer" if self.hf_tokenizer else ""
        download = f" + one download {gib(self.largest_object)}" if self.downloads else ""
        return (
            f"staging pod: memory {gib(self.memory_bytes)} = process {gib(CPU_PROCESS_BYTES)}{tokenizer} + "
            f"{BATCH_COPIES} copies of one batch of text ({gib(self.batch_bytes)}) + one uniqueness "
            f"partition + margin; disk {gib(self.disk_bytes)} = every shard "
            f"({gib(self.source_text * TOKEN_BYTES_PER_TEXT_BYTE)}) + the uniqueness spill"
            f"{download} + margin, for {gib(self.source_text)} of text"
        )


def stage_pod(
    sizes: list[tuple[int, str]], *, downloads: bool, hf_tokenizer: bool, batch_rows: int = DEFAULT_BATCH_ROWS
) -> StagePod:
    """The staging pod for a source of objects ``(size, format)`` (``parquet``, ``jsonl``,
    ``csv``, as :class:`trainops.staging.reader.SourceObject` has them)."""
    parquet = sum(size for size, fmt in sizes if fmt == "parquet")
    text = sum(size for size, fmt in sizes if fmt != "parquet")
    largest = max(sizes, default=(0, "jsonl"))
    return StagePod(
        text_bytes=text,
        parquet_bytes=parquet,
        largest_object=largest[0],
        largest_parquet=largest[1] == "parquet",
        downloads=downloads,
        hf_tokenizer=hf_tokenizer,
        batch_rows=batch_rows,
    )
