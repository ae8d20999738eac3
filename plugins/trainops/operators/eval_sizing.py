"""What an evaluation pod needs, from the model it loads. Pure.

An evaluation job (``python -m trainer evaluate``) is one process that scores the candidate,
then production, one model at a time. At its peak, host memory holds one model in fp32
(``trainer.export.folder.load_export`` casts the weights to fp32: 4 bytes per parameter) and
the weights being read into it (the export's dtype: 2 bytes per parameter in bf16, the default),
so 6 bytes per parameter; with a GPU the model moves there after loading, so the host peak is
the same. A mid-run evaluation (``eval.export_uri``) first loads the checkpoint's fp32 weights
(4 bytes per parameter) and exports them, one tensor at a time, before that: no higher peak.

On disk (the cache): an export is read one weight file at a time (at most
``export.max_shard_bytes``, 5 GiB by default; all of the weights when they are one file); a
checkpoint is downloaded whole, weights and AdamW's moments (12 bytes per parameter).

The sizes get the training pods' margin (25 %) and floor (4 GiB of memory); the process itself
is counted as a CPU node's (2 GiB) or a GPU process's (6 GiB). A model from a ``model.builder``
has no size this side can know: it is not sized (set ``job_options`` ``memory``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainops.operators.sizing import (
    CHECKPOINT_BYTES_PER_PARAM,
    CPU_PROCESS_BYTES,
    MARGIN,
    MIN_MARGIN_BYTES,
    MIN_MEMORY,
    PROCESS_BYTES,
    REQUEST_EXTRA_BYTES,
    gib,
)

LOADED_BYTES_PER_PARAM = 4  # the model in fp32
READ_BYTES_PER_PARAM = 2  # the weights being read (a bf16 export, the default)
EXPORT_SHARD_BYTES = 5 * 2**30  # trainer's export.max_shard_bytes default
EVAL_CPU = 2  # the scoring thread and the weight reads
EVAL_CPU_WITH_GPU = 3


@dataclass(frozen=True)
class EvalPod:
    """An evaluation pod's CPU, memory and cache, and what they count (bytes)."""

    params: int
    gpus: int
    checkpoint: bool  # it reads a checkpoint (mid-run evaluation), not an export

    @property
    def model_bytes(self) -> int:
        return self.params * (LOADED_BYTES_PER_PARAM + READ_BYTES_PER_PARAM)

    @property
    def process_bytes(self) -> int:
        return PROCESS_BYTES if self.gpus else CPU_PROCESS_BYTES

    @property
    def memory_bytes(self) -> int:
        """The memory request (= limit): process and model, plus 25 %; at least 4 GiB."""
        return max(MIN_MEMORY, math.ceil((self.process_bytes + self.model_bytes) * (1 + MARGIN)))

    @property
    def cache_bytes(self) -> int:
        """The cache's ``sizeLimit``: the files read at once, plus the margin."""
        if self.checkpoint:
            files = self.params * CHECKPOINT_BYTES_PER_PARAM
        else:
            files = min(self.params * LOADED_BYTES_PER_PARAM, EXPORT_SHARD_BYTES)  # one file, fp32 at worst
        return files + max(MIN_MARGIN_BYTES, math.ceil(files * MARGIN))

    def options(self) -> dict[str, str]:
        """The JobSpec fields it sets (``job_options`` override them)."""
        return {
            "cpu": str(EVAL_CPU_WITH_GPU if self.gpus else EVAL_CPU),
            "memory": gib(self.memory_bytes),
            "cache_size": gib(self.cache_bytes),
            "ephemeral_storage": gib(self.cache_bytes + REQUEST_EXTRA_BYTES),
        }

    def describe(self) -> str:
        """One line for the task log: what was counted."""
        read = "the checkpoint's files" if self.checkpoint else "one weight file at a time"
        return (
            f"evaluation pod: memory {gib(self.memory_bytes)} = process {gib(self.process_bytes)} + "
            f"{self.params:,} parameters x 6 bytes (fp32 model + bf16 weights read) + margin; cache "
            f"{gib(self.cache_bytes)} ({read})"
        )


def eval_pod(params: int | None, *, gpus: int, checkpoint: bool) -> EvalPod | None:
    """The evaluation pod of a model of ``params`` parameters (None: unknown, not sized)."""
    return None if params is None else EvalPod(int(params), int(gpus), bool(checkpoint))
