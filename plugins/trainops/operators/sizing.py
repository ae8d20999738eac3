"""What a training pod needs, estimated from the model and the GPUs, and whether the model fits
them. Pure.

- **Disk** (:func:`estimate`): the cache volume's ``sizeLimit`` and the pod's
  ``ephemeral-storage`` request, from the model and the dataset.
- **CPU, memory and shm** (:func:`pod_resources`): the defaults per node, from the GPUs per node
  and the model's size.
- **Fit** (:func:`fit_warnings`): a preset that cannot fit the GPUs asked for.

What the trainer keeps in ``$TRAINOPS_CACHE_DIR`` on one node, at its peak (one copy per node:
its ranks share the cache, ``trainer.checkpoint.node_cache``):

- the dataset's train split, every shard once (``trainer.data.fetch_split``), its tokens times
  the manifest's ``token_dtype`` size;
- on resume, the node's share of the checkpoint (the files its ranks' load plans read,
  ``trainer.checkpoint.reads``; deleted once loaded): its ranks' fraction of the checkpoint, plus
  two ranks' files for a resume on another mesh, whose shard edges cut across the old files;
  the whole checkpoint when the number of nodes is not known;
- the checkpoint being saved: each rank stages its own files before they are uploaded, so the
  node's share of one checkpoint;
- the node-local tier (``trainer.checkpoint.local_tier``): the node's share of the newest
  committed checkpoint, kept so that an in-place restart (``restarts_in_place``) or a rollback
  resumes from local disk; while the next save is staged, it is a second share beside it (the
  save in flight is linked into the tier, not copied, so no third);
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
from typing import TYPE_CHECKING, Any, TypedDict

from trainer.config import model_label, model_shape, model_vocab
from trainer.presets import non_embedding_params, param_count
from trainops.cluster.kubernetes.nodes import instance_type
from trainops.cost.estimate import gpu_of

if TYPE_CHECKING:
    from trainer.config import Config
    from trainops.cluster.spec import JobSpec

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
    local_tier_bytes: int  # the newest committed checkpoint's share, kept for in-place restarts
    export_bytes: int

    @property
    def cache_bytes(self) -> int:
        """The cache's ``sizeLimit``: the parts with the margin."""
        parts = (
            self.dataset_bytes
            + self.resume_bytes
            + self.save_bytes
            + self.local_tier_bytes
            + self.export_bytes
        )
        return parts + max(MIN_MARGIN_BYTES, math.ceil(parts * MARGIN))

    @property
    def request_bytes(self) -> int:
        """The pod's ``ephemeral-storage`` request: the cache and the container's own files."""
        return self.cache_bytes + REQUEST_EXTRA_BYTES

    def describe(self) -> str:
        """One line for the task log: what was counted."""
        return (
            f"cache {gib(self.cache_bytes)} = dataset {gib(self.dataset_bytes)} + this node's share of "
            f"the {gib(self.checkpoint_bytes)} checkpoint on resume ({gib(self.resume_bytes)}), while "
            f"saving ({gib(self.save_bytes)}) and kept on the node-local tier ({gib(self.local_tier_bytes)}) "
            f"+ export {gib(self.export_bytes)} + margin; "
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
    """Parameters of the model the run trains (a preset's or a ``model.hf_config``'s shape), with
    the vocabulary it will have (the config's, else the dataset tokenizer's); None for a
    ``model.builder`` model."""
    shape = model_shape(config)
    if shape is None:
        return None
    return param_count(shape.with_vocab(model_vocab(config) or int(manifest["tokenizer"]["vocab_size"])))


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
        local_tier_bytes=share,  # the newest committed checkpoint, beside the save in flight
        export_bytes=params * EXPORT_BYTES_PER_PARAM,
    )


def disk_options(found: DiskEstimate | None) -> dict[str, str]:
    """The JobSpec fields an estimate sets (``job_options`` override them); {} for none."""
    if found is None:
        return {}
    return {"cache_size": gib(found.cache_bytes), "ephemeral_storage": gib(found.request_bytes)}


# ----------------------------------------------------------------------------- CPU, memory, shm

# Per GPU: the rank's training thread, its input prefetch and pinned-copy thread, and the
# checkpoint's background upload; 3 leaves the node's system daemons room on a one-GPU node
# of 4 vCPUs (g5.xlarge, g6.xlarge), 24 of a p4d/p5's 96-192.
CPU_PER_GPU = 3
CPU_ONLY_CPU = 2  # a CPU node: one process, its intra-op threads and the prefetch thread
# Per process: Python, torch and the CUDA runtime's host memory, the loader's pinned batches,
# NCCL's host buffers; measured processes of the trainer hold 3-5 GiB before the model.
PROCESS_BYTES = 6 * GIB
CPU_PROCESS_BYTES = 2 * GIB  # without CUDA
# /dev/shm: NCCL's shared-memory transport between a node's ranks and CUDA IPC handles; the
# usual torch guidance is a large shm (NVIDIA's PyTorch containers: --ipc=host or
# --shm-size of several GiB), so 2 GiB per GPU, 1 GiB for a CPU node.
SHM_PER_GPU = 2 * GIB
MIN_SHM = 1 * GIB
MIN_MEMORY = 4 * GIB  # JobSpec's default: never below it
# AdamW in mixed precision on one rank, per parameter: fp32 weights (4) + gradients (4) +
# the two moments (8). FSDP shards all of it over the ranks.
TRAIN_STATE_BYTES_PER_PARAM = 16
# Activations kept for the backward per layer, per token, in units of ``dim`` bytes (16-bit:
# Korthikanti et al. 2022, "Reducing activation recomputation", 34 s b h without the
# attention scores, which SDPA does not keep); with full checkpointing only each layer's input
# (2 s b h) and one layer's worth during its recompute.
ACTIVATION_UNITS = 34
CHECKPOINTED_UNITS = 2
LOGIT_BYTES_PER_VOCAB = 12  # the output logits in bf16 and fp32 for the loss, and their gradient
# The reference GPU when the instance type is not known: an 80 GB A100 / H100.
DEFAULT_GPU_MEMORY = 80 * 10**9
DEFAULT_GPU = "an 80 GB A100 or H100 (the instance type is not known)"
# What a process may use of the GPU's memory: the CUDA context, NCCL's buffers and the
# caching allocator's fragmentation take the rest.
USABLE_GPU_FRACTION = 0.9
# GPU memory by accelerator (the datasheets), and the instance types whose GPU has less than
# its family's largest (the 40 GB A100s).
GPU_MEMORY = {"H200": 141e9, "H100": 80e9, "A100": 80e9, "L40S": 48e9, "L4": 24e9, "A10G": 24e9}
INSTANCE_GPU_MEMORY = {
    "p4d.24xlarge": 40e9,
    "a2-highgpu-1g": 40e9,
    "a2-highgpu-2g": 40e9,
    "a2-highgpu-4g": 40e9,
    "a2-highgpu-8g": 40e9,
    "a2-megagpu-16g": 40e9,
    "standard_nd96asr_v4": 40e9,
}
# A CPU node trains a model of more than this many parameters (the '7b' preset; '1b' has 1.1B)
# at tokens per second (6 N FLOPs per token at ~1 TFLOP/s), its whole state in host memory.
CPU_MAX_PARAMS = 2_000_000_000
CPU_FLOPS = 1e12


@dataclass(frozen=True)
class PodResources:
    """The CPU, memory and shm defaults of one training pod (one node), and what they count."""

    cpu: int
    shm_bytes: int
    process_bytes: int
    staging_bytes: int
    export_bytes: int
    state_bytes: int  # a CPU node's share of the training state (0 with GPUs: it is on them)

    @property
    def memory_bytes(self) -> int:
        """The memory request (= limit): the parts, the memory-backed ``/dev/shm`` (it is
        charged to the pod's memory), and the disk margin's 25 %; at least 4 GiB."""
        parts = self.process_bytes + self.staging_bytes + self.export_bytes + self.state_bytes
        return max(MIN_MEMORY, math.ceil(parts * (1 + MARGIN)) + self.shm_bytes)

    def options(self) -> dict[str, str]:
        """The JobSpec fields they set (``job_options`` override them)."""
        return {"cpu": str(self.cpu), "memory": gib(self.memory_bytes), "shm_size": gib(self.shm_bytes)}

    def describe(self) -> str:
        """One line for the task log: what was counted."""
        state = f" + this node's training state {gib(self.state_bytes)}" if self.state_bytes else ""
        return (
            f"pod resources: cpu {self.cpu}, memory {gib(self.memory_bytes)} = processes "
            f"{gib(self.process_bytes)} + checkpoint staging {gib(self.staging_bytes)} + export "
            f"{gib(self.export_bytes)}{state} + margin + shm {gib(self.shm_bytes)}"
        )


def pod_resources(*, gpus_per_node: int, nodes: int, params: int | None) -> PodResources:
    """The CPU, memory and shm of one pod of ``nodes`` x ``gpus_per_node``.

    The rule: CPU 3 per GPU (2 on a CPU node); shm 2 GiB per GPU (at least 1 GiB); memory 6 GiB
    per GPU process (2 GiB on a CPU node) + this node's share of the checkpoint staging buffers
    (12 bytes per parameter over the ranks: each rank keeps a host copy of its shards,
    ``trainer.checkpoint.staging``) + the export's consolidated fp32 weights (4 bytes per parameter, rank
    0's node; every pod gets the same size) + on a CPU node its share of the training state
    (16 bytes per parameter over the nodes), plus 25 %, plus the shm; at least 4 GiB.

    :param params: the model's parameters; None (a ``model.builder`` model) counts no model.
    """
    procs = max(1, gpus_per_node)
    world = procs * max(1, nodes)
    n = params or 0
    return PodResources(
        cpu=CPU_PER_GPU * gpus_per_node if gpus_per_node else CPU_ONLY_CPU,
        shm_bytes=max(MIN_SHM, SHM_PER_GPU * gpus_per_node),
        process_bytes=procs * (PROCESS_BYTES if gpus_per_node else CPU_PROCESS_BYTES),
        staging_bytes=math.ceil(n * CHECKPOINT_BYTES_PER_PARAM * procs / world),
        export_bytes=n * EXPORT_BYTES_PER_PARAM,
        state_bytes=0 if gpus_per_node else math.ceil(n * TRAIN_STATE_BYTES_PER_PARAM / world),
    )


@dataclass(frozen=True)
class GpuMemory:
    """What one GPU of the run holds at its peak, and what it has (bytes)."""

    state_bytes: int  # weights, gradients and AdamW's moments, sharded over every GPU
    gathered_bytes: int  # the unsharded bf16 weights of two layers (the one running, the prefetched)
    activation_bytes: int
    gpu_bytes: int
    gpu: str  # where gpu_bytes comes from

    @property
    def needed_bytes(self) -> int:
        return self.state_bytes + self.gathered_bytes + self.activation_bytes

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_bytes * USABLE_GPU_FRACTION)

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.usable_bytes


def gpu_memory_of(instance_type: str | None) -> tuple[int, str]:
    """``(bytes, description)`` of one GPU of ``instance_type``; the stated default (80 GB)
    when it is not known."""
    found = gpu_of(instance_type)
    if instance_type is None or found is None:
        return DEFAULT_GPU_MEMORY, DEFAULT_GPU
    memory = INSTANCE_GPU_MEMORY.get(instance_type.casefold(), GPU_MEMORY[found[0]])
    return int(memory), f"{instance_type}'s {found[0]} ({memory / 1e9:.0f} GB)"


def gpu_memory(config: Config, *, world_size: int, instance_type: str | None) -> GpuMemory | None:
    """One GPU's peak memory for ``config`` on ``world_size`` GPUs (FSDP-sharded; None for a
    ``model.builder`` model): 16 bytes per parameter over the GPUs, two layers gathered, and
    roughly the activations of one micro-batch (``train.activation_checkpointing``: a
    checkpointed block keeps only its input), and the logits."""
    args = model_shape(config)
    if args is None:
        return None
    t = config.train
    layer = (param_count(args) - 2 * args.vocab_size * args.dim - args.dim) // args.n_layers
    dtype_scale = 2 if config.precision == "fp32" else 1
    tokens = t.micro_batch_size * t.seq_len
    # checkpointed blocks keep their input, the rest everything; selective: every second block
    checkpointed = {"full": args.n_layers, "selective": args.n_layers // 2}.get(t.activation_checkpointing, 0)
    units = CHECKPOINTED_UNITS * checkpointed + ACTIVATION_UNITS * (args.n_layers - checkpointed)
    units += ACTIVATION_UNITS if checkpointed else 0  # the block being recomputed
    activations = tokens * (args.dim * units + args.vocab_size * LOGIT_BYTES_PER_VOCAB) * dtype_scale
    gpu_bytes, gpu = gpu_memory_of(instance_type)
    return GpuMemory(
        state_bytes=math.ceil(param_count(args) * TRAIN_STATE_BYTES_PER_PARAM / max(1, world_size)),
        gathered_bytes=2 * 2 * layer * dtype_scale,
        activation_bytes=activations,
        gpu_bytes=gpu_bytes,
        gpu=gpu,
    )


class SizingWarning(TypedDict):
    """A preset that cannot fit what was asked for: which check, and the sentence to log."""

    check: str  # "cpu-only" or "gpu-memory"
    message: str


def fit_warnings(
    config: Config, *, nodes: int, gpus_per_node: int, instance_type: str | None = None
) -> list[SizingWarning]:
    """Why ``config``'s model cannot fit ``nodes`` x ``gpus_per_node`` (empty: it fits, or its
    size is unknown, a ``model.builder`` model).

    - **cpu-only**: no GPUs for a preset of more than 2B parameters: its training state sits in
      host memory and a step takes minutes (6 N FLOPs per token at an assumed 1 TFLOP/s per node).
    - **gpu-memory**: weights + gradients + AdamW's moments (16 bytes per parameter, sharded
      over every GPU), two gathered layers and the activations exceed 90 % of one GPU's memory
      (the instance type's GPU from the node selector, else 80 GB).
    """
    args = model_shape(config)
    if args is None:
        return []
    params = param_count(args)
    name = f"{model_label(config)} ({params / 1e9:.2f}B parameters)"
    if gpus_per_node == 0:
        if params <= CPU_MAX_PARAMS:
            return []
        state = math.ceil(params * TRAIN_STATE_BYTES_PER_PARAM / max(1, nodes))
        tokens = config.train.micro_batch_size * config.train.seq_len
        step_s = 6 * non_embedding_params(args) * tokens / CPU_FLOPS
        return [
            {
                "check": "cpu-only",
                "message": (
                    f"{name} with gpus_per_node=0 trains on CPUs: {gib(state)} of training state per node "
                    f"in host memory and about {step_s:.0f} s per micro-batch of {tokens} tokens at "
                    f"{CPU_FLOPS / 1e12:.0f} TFLOP/s; set gpus_per_node or pick a preset of at most "
                    f"{CPU_MAX_PARAMS / 1e9:.0f}B parameters ('1b' or smaller)"
                ),
            }
        ]
    world = nodes * gpus_per_node
    found = gpu_memory(config, world_size=world, instance_type=instance_type)
    if found is None or found.fits:
        return []
    room = found.usable_bytes - found.gathered_bytes - found.activation_bytes
    fewest = math.ceil(params * TRAIN_STATE_BYTES_PER_PARAM / room) if room > 0 else None
    advice = (
        f"use at least {fewest} GPUs of this size (nodes x gpus_per_node)"
        if fewest
        else "no number of GPUs of this size holds one micro-batch's activations"
    )
    return [
        {
            "check": "gpu-memory",
            "message": (
                f"{name} does not fit {nodes} x {gpus_per_node} GPU(s) of {found.gpu}: each GPU needs about "
                f"{gib(found.needed_bytes)} (training state {gib(found.state_bytes)} = 16 bytes/parameter over "
                f"{world} GPU(s), gathered layers {gib(found.gathered_bytes)}, activations "
                f"{gib(found.activation_bytes)}) of the {gib(found.usable_bytes)} usable; {advice}, or set "
                "train.activation_checkpointing='full', or lower train.micro_batch_size or train.seq_len"
            ),
        }
    ]


def sizing_record(config: Config, spec: JobSpec) -> dict[str, Any]:
    """What the dry run prints about sizing: the pod resources ``spec`` got, one GPU's memory
    (None on CPUs or for a ``model.builder`` model) and the warnings (:func:`fit_warnings`)."""
    kind = instance_type(spec.node_selector)
    found = (
        gpu_memory(config, world_size=spec.nodes * spec.gpus_per_node, instance_type=kind)
        if spec.gpus_per_node
        else None
    )
    return {
        "resources": {"cpu": spec.cpu, "memory": spec.memory, "shm_size": spec.shm_size},
        "gpu_memory": None
        if found is None
        else {
            "gpu": found.gpu,
            "needed": gib(found.needed_bytes),
            "usable": gib(found.usable_bytes),
            "state": gib(found.state_bytes),
            "activations": gib(found.activation_bytes),
        },
        "warnings": fit_warnings(
            config, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node, instance_type=kind
        ),
    }
