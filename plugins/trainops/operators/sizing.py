"""The node-local disk a training pod needs: the cache volume's ``sizeLimit`` and the pod's
``ephemeral-storage`` request, estimated from the model and the dataset. Pure.

What the trainer keeps in ``$TRAINOPS_CACHE_DIR`` on one node, at its peak (one copy per node:
its ranks share the cache, ``trainer.node_cache``):

- the dataset's train split, every shard once (``trainer.data.fetch_split``), its tokens times
  the manifest's ``token_dtype`` size;
- on resume, the node's share of the checkpoint (the files its ranks' load plans read,
  ``trainer.checkpoint_reads``; deleted once loaded): its ranks' fraction of the checkpoint, plus
  two ranks' files for a resume on another mesh, whose shard edges cut across the old files;
  the whole checkpoint when the number of nodes is not known;
- the checkpoint being saved: each rank stages its own files before they are uploaded, so the
  node's share of one checkpoint;
- the export's consolidated fp32 weights (rank 0, at the end).

A checkpoint holds the fp32 weights and AdamW's two fp32 moments: 12 bytes per parameter.
The sum gets a margin (25 % and at least 2 GiB) for logs, temporary files and estimate error.
A model from a ``model.builder`` has no size this side can know: it is not sized (set
``job_options`` ``cache_size`` and ``ephemeral_storage``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.config import Config

GIB = 2**30
CHECKPOINT_BYTES_PER_PARAM = 4 + 4 + 4  # fp32 weights, AdamW exp_avg and exp_avg_sq
EXPORT_BYTES_PER_PARAM = 4  # consolidated fp32 weights
MARGIN = 0.25
MIN_MARGIN_BYTES = 2 * GIB
TOKEN_BYTES = {"uint16": 2, "uint32": 4}
# Beyond the cache: container logs and the image's writable layer count against the request.
REQUEST_EXTRA_BYTES = 2 * GIB


@dataclass(frozen=True)
class DiskEstimate:
    """The bytes each part of the cache needs on one node, and the sizes they make."""

    dataset_bytes: int
    checkpoint_bytes: int
    resume_bytes: int
    save_bytes: int
    export_bytes: int

    @property
    def cache_bytes(self) -> int:
        """The cache's ``sizeLimit``: the parts with the margin."""
        parts = self.dataset_bytes + self.resume_bytes + self.save_bytes + self.export_bytes
        return parts + max(MIN_MARGIN_BYTES, math.ceil(parts * MARGIN))

    @property
    def request_bytes(self) -> int:
        """The pod's ``ephemeral-storage`` request: the cache and the container's own files."""
        return self.cache_bytes + REQUEST_EXTRA_BYTES

    def describe(self) -> str:
        """One line for the task log: what was counted."""
        return (
            f"cache {gib(self.cache_bytes)} = dataset {gib(self.dataset_bytes)} + this node's share of "
            f"the {gib(self.checkpoint_bytes)} checkpoint on resume ({gib(self.resume_bytes)}) and while "
            f"saving ({gib(self.save_bytes)}) + export {gib(self.export_bytes)} + margin; "
            f"ephemeral-storage request {gib(self.request_bytes)}"
        )


def gib(n_bytes: int) -> str:
    """``n_bytes`` rounded up to a Kubernetes quantity in whole GiB (``"12Gi"``)."""
    return f"{max(1, math.ceil(n_bytes / GIB))}Gi"


def dataset_bytes(manifest: Mapping[str, Any]) -> int:
    """Bytes of the train split's shards on disk: its tokens times the token size."""
    size = TOKEN_BYTES.get(str(manifest.get("token_dtype", "uint16")), 4)
    return int(manifest["splits"]["train"]["tokens"]) * size


def model_params(config: Config, manifest: Mapping[str, Any]) -> int | None:
    """Parameters of the preset the run trains, with the vocabulary it will have (the
    config's, else the dataset tokenizer's); None for a ``model.builder`` model."""
    from trainer.presets import PRESETS, param_count

    if config.model.builder is not None:
        return None
    vocab = config.model.vocab_size or int(manifest["tokenizer"]["vocab_size"])
    return param_count(PRESETS[config.model.preset].with_vocab(vocab))


def estimate(
    config: Config, manifest: Mapping[str, Any], *, procs_per_node: int, nodes: int | None = None
) -> DiskEstimate | None:
    """The cache one node of this run needs (None when the model's size is unknown).

    :param procs_per_node: ranks per node.
    :param nodes: nodes of the run; None (unknown) sizes a resume for the whole checkpoint.
    """
    params = model_params(config, manifest)
    if params is None:
        return None
    checkpoint = params * CHECKPOINT_BYTES_PER_PARAM
    procs = max(1, procs_per_node)
    world = procs * nodes if nodes else procs
    share = math.ceil(checkpoint * procs / world)  # the node's ranks' files, on the mesh they saved
    # On another mesh a node's ranks read parts of the old files at the edges of their shards:
    # up to two ranks' files more. Without the number of nodes, the whole checkpoint.
    resume = min(checkpoint, share + math.ceil(2 * checkpoint / world)) if nodes else checkpoint
    return DiskEstimate(
        dataset_bytes=dataset_bytes(manifest),
        checkpoint_bytes=checkpoint,
        resume_bytes=resume,
        save_bytes=share,
        export_bytes=params * EXPORT_BYTES_PER_PARAM,
    )


def disk_options(found: DiskEstimate | None) -> dict[str, str]:
    """The JobSpec fields an estimate sets (``job_options`` override them); {} for none."""
    if found is None:
        return {}
    return {"cache_size": gib(found.cache_bytes), "ephemeral_storage": gib(found.request_bytes)}
