"""Process groups, and the one place that applies parallelism to a plain model (:func:`parallelize`).

The model code knows nothing about distribution: activation checkpointing, ``torch.compile``
and FSDP2 are applied here, from outside, from the config. Under torchrun the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) says who
we are; without it the trainer runs as a world of one, so ``python -m trainer train``
works on a laptop too.
"""

from __future__ import annotations

import ctypes
import datetime
import hashlib
import math
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from trainer.config import replicate_degree
from trainer.contract import ENV_GPUS_PER_NODE
from trainer.runtime.attempts import CausedError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from trainer.config import Config

T = TypeVar("T")
# Initial weights are drawn in blocks of about this many elements (whole rows): a shard's rows
# are generated alone, from the blocks they fall in, whatever the world size cuts them into.
INIT_BLOCK_ELEMENTS = 1 << 20
# What activation checkpointing and compile put into parameter names (state dicts drop them too).
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")
NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"

# The compute dtype per precision; None keeps fp32 (no casting).
PARAM_DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job, and the device it trains on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def die_with_launcher() -> None:
    """Under torchrun, make the kernel SIGKILL this worker when the torchrun agent dies.

    torchrun starts every worker in its own session, so killing torchrun's process group
    (as a node loss or a local launcher's hard kill does) would otherwise leave orphaned
    workers training on, racing the next attempt for the same checkpoints.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if launcher == 1 or os.getppid() != launcher:  # it died before the request took effect
        os._exit(1)


class GPUsMissing(CausedError):
    """The node was given GPUs (``$TRAINOPS_GPUS_PER_NODE``) but this process sees fewer than
    the node's ranks need: the node's fault (no driver, a failed device), not the program's."""

    def __init__(self, message: str):
        super().__init__(message, "node")


def gpus_expected(environ: Mapping[str, str] = os.environ) -> int:
    """``$TRAINOPS_GPUS_PER_NODE``, the GPUs the launcher gave each node; 0 when unset."""
    raw = environ.get(ENV_GPUS_PER_NODE, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"{ENV_GPUS_PER_NODE}={raw!r} is not a whole number of GPUs >= 0; the launcher sets it "
            "from gpus_per_node (unset it to train wherever torch finds a device)"
        )
    return value


def gpu_shortfall(
    expected: int, local_ranks: int, cuda_available: bool, device_count: int, visible: str | None
) -> str | None:
    """What is missing when a node given ``expected`` GPUs runs ``local_ranks`` ranks, one GPU
    each, and this process sees ``device_count`` CUDA devices (``visible``: its
    ``CUDA_VISIBLE_DEVICES``, None when unset); None when nothing is. Pure."""
    if expected <= 0:
        return None
    if cuda_available and device_count >= local_ranks:
        return None
    seen = (
        f"{device_count} CUDA device(s)"
        if cuda_available
        else "no CUDA device (torch.cuda.is_available() is False)"
    )
    return (
        f"{ENV_GPUS_PER_NODE}={expected}: this node's {local_ranks} rank(s) need {local_ranks} GPU(s), "
        f"but this process sees {seen}, with CUDA_VISIBLE_DEVICES="
        f"{'unset' if visible is None else repr(visible)}; refusing to train on the CPU instead"
    )


def init_distributed(timeout_s: float | None = None) -> DistEnv:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU), or make a world of one.

    :param timeout_s: how long a collective may wait for the other ranks before it fails
        (``train.collective_timeout_s``; None: PyTorch's default, 30 min). With
        ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` (set here unless the launcher set it) NCCL's
        watchdog then aborts the rank, so a stuck peer ends the attempt.

    Raises :class:`GPUsMissing`, before any process group exists, when the launcher gave the
    node GPUs (``$TRAINOPS_GPUS_PER_NODE``) and fewer than ``$LOCAL_WORLD_SIZE`` are visible:
    training on the CPU instead would be silently hundreds of times slower.
    """
    die_with_launcher()
    cuda = torch.cuda.is_available()
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    problem = gpu_shortfall(
        gpus_expected(),
        local_ranks,
        cuda,
        torch.cuda.device_count() if cuda else 0,
        os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    if problem:
        raise GPUsMissing(problem)
    backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault(NCCL_ASYNC_ERROR_HANDLING, "1")  # read when the NCCL group is made
    # None: PyTorch's default (init_process_group's own)
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if cuda else None, timeout=timeout)
    else:
        # A file store needs no free port: a plain single process must not collide with others.
        store_path = os.path.join(tempfile.mkdtemp(prefix="trainops-"), "store")
        dist.init_process_group(
            backend, store=dist.FileStore(store_path, 1), rank=0, world_size=1, timeout=timeout
        )
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def checkpointed_blocks(mode: str, n_layers: int) -> list[int]:
    """Indices of the blocks whose activations are recomputed: all (full), every second (selective)."""
    if mode == "full":
        return list(range(n_layers))
    if mode == "selective":
        return list(range(1, n_layers, 2))  # the 2nd, 4th, ...: as torchtitan's layer-selective AC
    if mode == "none":
        return []
    raise ValueError(f"train.activation_checkpointing must be none, full or selective, got {mode!r}")


def describe_step_options(
    activation_checkpointing: str, n_layers: int, compiled: bool, skip_sync: bool
) -> str:
    """One log line: what was applied to the model and the step."""
    blocks = checkpointed_blocks(activation_checkpointing, n_layers)
    parts = [
        f"activation checkpointing {activation_checkpointing}"
        + (f" (blocks {', '.join(map(str, blocks))} of {n_layers})" if blocks else "")
    ]
    if compiled:
        parts.append("torch.compile per block")
    parts.append(
        "gradient sync on the last micro-step only" if skip_sync else "gradient sync every micro-step"
    )
    return ", ".join(parts)


def device_mesh(env: DistEnv, replicate: str, local_world_size: int | None = None) -> DeviceMesh | None:
    """The mesh FSDP2 shards over: None (flat, the default process group) when
    ``parallel.replicate`` comes to 1, else a 2-D ``("replicate", "shard")`` mesh (HSDP).

    Ranks ``r * shard .. (r + 1) * shard - 1`` form replica ``r``: torchrun numbers a node's
    ranks consecutively, so with ``auto`` each node holds one whole replica and only the
    gradient all-reduce crosses nodes.

    :param local_world_size: ranks per node; default ``$LOCAL_WORLD_SIZE`` (torchrun's), else 1.
    Raises ``trainer.config.ConfigError`` when the replicas do not divide the world size.
    """
    local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    replicas = replicate_degree(replicate, env.world_size, local)
    if replicas == 1:
        return None
    return init_device_mesh(
        env.device.type, (replicas, env.world_size // replicas), mesh_dim_names=("replicate", "shard")
    )


def describe_mesh(mesh: DeviceMesh | None, world_size: int) -> str:
    """One log line: how the model is sharded and replicated."""
    if mesh is None:
        return f"FSDP over all {world_size} ranks"
    replicas, shard = mesh.shape
    return f"HSDP: {replicas} replicas x {shard} ranks sharding each"


def parallelize(
    model: nn.Module, block_names: list[str], config: Config, mesh: DeviceMesh | None = None
) -> nn.Module:
    """Apply what ``config`` asks for to a plain model, in place and in this order (as torchtitan):
    activation checkpointing (``train.activation_checkpointing``), ``torch.compile`` per block
    (``train.compile``), then FSDP2 with ``precision``'s mixed-precision policy.

    Compile comes after the checkpoint wrappers so that each compiled graph holds its
    recomputation, and before sharding so that FSDP's hooks stay outside the graphs. A model
    on the ``meta`` device stays there (:func:`init_sharded` then materialises its shards).

    :param block_names: qualified names of the model's blocks (``"layers.0"``, ...), in order.
    :param mesh: :func:`device_mesh`'s; None shards flat over the default process group.
    """
    if config.precision not in PARAM_DTYPES:
        raise ValueError(f"precision must be one of {sorted(PARAM_DTYPES)}, got {config.precision!r}")
    _apply_activation_checkpointing(model, block_names, config.train.activation_checkpointing)
    if config.train.compile:
        _apply_compile(model, block_names)
    _apply_fsdp(model, block_names, config.precision, mesh)
    return model


def plain_name(name: str) -> str:
    """A parameter's name in the model as built (the wrappers' prefixes removed)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of row block ``block`` of parameter ``name``: from the run's seed and
    the name alone (sha256, not Python's salted ``hash``), so every process draws the same."""
    digest = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def fill_rows(
    out: torch.Tensor, full_shape: tuple[int, ...], row_offset: int, seed: int, name: str, std: float
) -> None:
    """Fill ``out``, rows ``row_offset ..`` of a ``full_shape`` parameter, with the values the
    whole tensor would hold: N(0, ``std``) drawn in row blocks of about ``INIT_BLOCK_ELEMENTS``
    elements, each block from its own generator (:func:`block_seed`).

    A shard generates only the blocks its rows fall in: at most two blocks' worth more than
    its own rows, whatever the world size.
    """
    rows = out.shape[0] if out.dim() else 1
    if out.numel() == 0:
        return
    row_numel = math.prod(full_shape[1:])
    per_block = max(1, INIT_BLOCK_ELEMENTS // max(row_numel, 1))
    total_rows = full_shape[0] if full_shape else 1
    view = out.view(rows, *full_shape[1:])
    generator = torch.Generator(device=out.device)
    for block in range(row_offset // per_block, (row_offset + rows - 1) // per_block + 1):
        start = block * per_block
        values = torch.empty(
            (min(per_block, total_rows - start), *full_shape[1:]), dtype=out.dtype, device=out.device
        )
        values.normal_(0.0, std, generator=generator.manual_seed(block_seed(seed, name, block)))
        lo, hi = max(start, row_offset), min(start + values.shape[0], row_offset + rows)
        view[lo - row_offset : hi - row_offset].copy_(values[lo - start : hi - start])


@torch.no_grad()
def init_sharded(
    model: nn.Module,
    device: torch.device,
    seed: int,
    init_std: Callable[[str], float | None],
    *,
    fill_buffers: Callable[[nn.Module], None] | None = None,
    zero_rows: Mapping[str, int] | None = None,
) -> None:
    """Materialise a model sharded on the ``meta`` device: allocate this rank's shards on
    ``device`` (nothing else), then fill them with the values the whole model would start from.

    The values depend on ``seed`` and each parameter's name only, never on the world size or
    the mesh, so a checkpoint resumes on any world size and 1 rank starts where 2 do.

    :param init_std: the std of parameter ``name``'s zero-mean normal (0.0: zeros), None for
        ones (the model's own rule, e.g. ``Transformer.init_std``), by its name as built.
    :param fill_buffers: computes the model's buffers once they are on ``device`` (buffers are
        not sharded); without it a model with buffers is refused.
    :param zero_rows: a row of a parameter that starts at zero (an embedding's padding row),
        by name as built.
    """
    if fill_buffers is None and any(True for _ in model.buffers()):
        raise TypeError(
            f"{type(model).__name__} has buffers, which initialisation on the meta device cannot "
            "fill; compute them in forward instead"
        )
    ties = tied_parameters(model)
    model.to_empty(device=device)  # gives each module its own tensor: tied weights come apart
    for name, first in ties.items():
        owner, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, attribute, model.get_parameter(first))
    if fill_buffers is not None:
        fill_buffers(model)

    for raw_name, param in model.named_parameters():
        name, full_shape = plain_name(raw_name), tuple(param.shape)
        if isinstance(param, DTensor):
            local = param.to_local()
            _, offset = compute_local_shape_and_global_offset(
                param.shape, param.device_mesh, param.placements
            )
            row_offset = offset[0] if offset else 0
        else:
            local, row_offset = param.data, 0
        std = init_std(name)
        if std is None:
            local.fill_(1.0)
        else:
            fill_rows(local, full_shape, row_offset, seed, name, std)
        row = (zero_rows or {}).get(name)
        if row is not None and row_offset <= row < row_offset + (local.shape[0] if local.dim() else 1):
            local[row - row_offset].zero_()


def tied_parameters(model: nn.Module) -> dict[str, str]:
    """Each further name of a parameter held under several names (tied embeddings), to its
    first name."""
    first: dict[int, str] = {}
    ties = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            ties[name] = first[id(param)]
        else:
            first[id(param)] = name
    return ties


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _apply_activation_checkpointing(model: nn.Module, block_names: list[str], mode: str) -> None:
    """Recompute the chosen blocks' activations in backward instead of keeping them. A block
    with dropout (an encoder's) replays its forward's random state, so the recomputation draws
    the same masks; the others skip that cost."""
    for index in checkpointed_blocks(mode, len(block_names)):
        name = block_names[index]
        block = model.get_submodule(name)
        _replace(model, name, checkpoint_wrapper(block, preserve_rng_state=has_dropout(block)))


def has_dropout(module: nn.Module) -> bool:
    """Whether ``module`` draws random numbers in training (an ``nn.Dropout`` with p > 0)."""
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in module.modules())


def _apply_compile(model: nn.Module, block_names: list[str]) -> None:
    """Compile each block on its own: blocks repeat, so one compiled graph serves them all."""
    for name in block_names:
        model.get_submodule(name).compile()  # in place: state-dict names stay the same


def _apply_fsdp(model: nn.Module, block_names: list[str], precision: str, mesh: DeviceMesh | None) -> None:
    """Shard each block (by qualified name), then the root (embeddings, final norm, output),
    over ``mesh`` (HSDP: sharded along ``"shard"``, replicated along ``"replicate"``).

    Parameters stay fp32 (the optimizer's master copy); bf16/fp16 are the compute dtype,
    and gradients are reduced in fp32.
    """
    param_dtype = PARAM_DTYPES[precision]
    policy = (
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype is not None
        else MixedPrecisionPolicy()
    )
    for name in block_names:
        fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """FSDP2: whether the next backward reduce-scatters gradients (False: keep them unsharded)."""
    if not isinstance(model, FSDPModule):
        raise TypeError(
            f"skipping the gradient sync needs an FSDP2-sharded model, got {type(model).__name__}"
        )
    model.set_requires_gradient_sync(enabled)


def grad_scaler(precision: str) -> ShardedGradScaler | None:
    """fp16 gradients underflow without loss scaling; bf16 and fp32 need none."""
    if precision != "fp16":
        return None
    return ShardedGradScaler(device="cuda" if torch.cuda.is_available() else "cpu")


def barrier() -> None:
    dist.barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """``obj`` from rank ``src`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: T, group: dist.ProcessGroup | None = None) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank (pickled: small objects only)."""
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """The element-wise sum of ``values`` over all ranks, in float64 (one collective)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def host_group() -> dist.ProcessGroup:
    """A gloo group of all ranks for small agreements on the host (the stop flag): its
    collectives run in gloo's threads on CPU tensors, so waiting for one never waits for the
    device, and they never queue behind the training group's (NCCL on GPUs).

    When the training group is gloo itself (CPU), it is that group: gloo runs its collectives
    in its own threads already, in the order every rank issued them. A second gloo group would
    only add a thread that wakes 100 times a second (gloo's TCP loop polls every 10 ms), which
    on a small CPU host preempts the training threads for nothing."""
    if dist.get_backend() == "gloo":
        return cast(dist.ProcessGroup, dist.group.WORLD)
    group = dist.new_group(backend="gloo")
    if group is None:  # only a rank outside the group gets None; every rank is in this one
        raise RuntimeError("dist.new_group returned no group for this rank")
    return group


class PendingSum:
    """An all-reduce in flight (:func:`all_reduce_sum_async`); :meth:`wait` gives its sum."""

    def __init__(self, work: dist.Work, tensor: torch.Tensor):
        self._work, self._tensor = work, tensor

    def wait(self) -> list[float]:
        """The element-wise sum over all ranks, once every rank has contributed."""
        self._work.wait()
        return self._tensor.tolist()


def all_reduce_sum_async(values: list[float], group: dist.ProcessGroup) -> PendingSum:
    """Start the element-wise sum of ``values`` over the ranks of ``group`` (a :func:`host_group`,
    float64 on the CPU) and return at once."""
    tensor = torch.tensor(values, dtype=torch.float64)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
    if work is None:
        raise RuntimeError("dist.all_reduce(async_op=True) returned no work handle")
    return PendingSum(work, tensor)


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over all ranks in place, on its device (the training group: on GPUs it
    stays on the GPU; only reading it to the host then waits for the device)."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor
