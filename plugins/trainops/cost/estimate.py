"""What a training run will cost, before it launches: steps x expected step time x price.

The step time comes from the last run of the same DAG and model when there is one (its
measured seconds per kept step, :func:`measure_run`), else from the model's FLOPs at an
assumed MFU (:func:`flops_step_s`). The price is the contract's ``price_of`` for the run's
instance type, for spot and for on-demand. Pure: the dry run (:mod:`trainops.recipes.dry_run`)
reads the previous run and the prices; :func:`estimate_run` only computes, and
:func:`estimate_lines` says it in a few lines. Every figure is an estimate, in USD.

FLOPs per token and the GPUs' peaks are the trainer's own (``trainer.flops``: PaLM, appendix
B, ``6 N + 12 L d T``, and NVIDIA's datasheet peaks), one of the torch-free trainer modules the
Airflow side may import (``trainer.contract.SHARED_MODULES``).
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from trainer import flops
from trainer.config import Config, accumulation_steps, model_label, model_shape, model_vocab
from trainer.contract import MetricsRecord, metrics_by_step
from trainer.presets import ModelArgs, non_embedding_params
from trainops.cost.money import money
from trainops.cost.prices import price_of

if TYPE_CHECKING:
    from trainops.cost.prices import Priced, PriceTable

ESTIMATE_FORMAT = "trainops.estimate/v1"
DEFAULT_MFU = 0.4
# Where the peak is unknown (a CPU node, a GPU not in the table), the FLOPs estimate assumes
# this GPU's peak and says so: the most common training GPU of the price table's instance types.
REFERENCE_GPU = "A100"

# Dense tensor-core peak FLOP/s per GPU by compute dtype: the trainer's datasheet table
# (``trainer.flops``, one of the shared trainer modules), for the GPUs the instance types have.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    gpu: {dtype: float(flops.peak_flops(f"NVIDIA {gpu}", dtype) or 0.0) for dtype in flops.DTYPES}
    for gpu in ("H200", "H100", "A100", "L40S", "L4", "A10G")
}

# Instance type -> (GPU, GPUs per instance), from the providers' instance-type pages (AWS EC2
# accelerated computing, Google Cloud GPU machine types, Azure ND and NC series), as of
# 2026-12. Keys are matched without regard to case (Azure's names are case-insensitive).
INSTANCE_GPUS: dict[str, tuple[str, int]] = {
    # AWS
    "p4d.24xlarge": ("A100", 8),
    "p4de.24xlarge": ("A100", 8),
    "p5.48xlarge": ("H100", 8),
    "p5e.48xlarge": ("H200", 8),
    "p5en.48xlarge": ("H200", 8),
    **{f"g5.{size}": ("A10G", 1) for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g5.12xlarge": ("A10G", 4),
    "g5.24xlarge": ("A10G", 4),
    "g5.48xlarge": ("A10G", 8),
    **{f"g6.{size}": ("L4", 1) for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g6.12xlarge": ("L4", 4),
    "g6.24xlarge": ("L4", 4),
    "g6.48xlarge": ("L4", 8),
    **{f"g6e.{size}": ("L40S", 1) for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g6e.12xlarge": ("L40S", 4),
    "g6e.24xlarge": ("L40S", 4),
    "g6e.48xlarge": ("L40S", 8),
    # Google Cloud
    **{f"a2-highgpu-{n}g": ("A100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("A100", 16),
    **{f"a2-ultragpu-{n}g": ("A100", n) for n in (1, 2, 4, 8)},
    "a3-highgpu-8g": ("H100", 8),
    "a3-megagpu-8g": ("H100", 8),
    "a3-edgegpu-8g": ("H100", 8),
    "a3-ultragpu-8g": ("H200", 8),
    **{f"g2-standard-{n}": ("L4", 1) for n in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("L4", 2),
    "g2-standard-48": ("L4", 4),
    "g2-standard-96": ("L4", 8),
    # Azure
    "Standard_ND96asr_v4": ("A100", 8),
    "Standard_ND96amsr_A100_v4": ("A100", 8),
    "Standard_ND96isr_H100_v5": ("H100", 8),
    "Standard_ND96isr_H200_v5": ("H200", 8),
    "Standard_NC24ads_A100_v4": ("A100", 1),
    "Standard_NC48ads_A100_v4": ("A100", 2),
    "Standard_NC96ads_A100_v4": ("A100", 4),
}
_BY_FOLDED_NAME = {name.casefold(): value for name, value in INSTANCE_GPUS.items()}


class Measured(TypedDict):
    """What an earlier run of the same DAG and model measured: its seconds per kept step, and
    the shape it was measured on (to scale it to this run's)."""

    run_uri: str
    step_s: float  # seconds per optimizer step, over its kept steps (see measure_run)
    steps: int  # the steps it was measured over
    accelerators: int  # nodes x GPUs (a CPU node counts as one)
    tokens_per_step: int
    flops_per_token: float | None  # None: a model.builder model (no count before it is built)
    instance_type: str | None


class Estimate(TypedDict):
    """A run's cost before launch (``format`` ``trainops.estimate/v1``). ``step_s`` and the
    figures after it are None when no step time could be found (a ``model.builder`` model
    that no earlier run of the DAG trained); ``assumptions`` says so, and says every guess."""

    format: str
    estimate: bool  # always True: every figure is an estimate
    currency: str  # "USD"
    steps: int
    step_s: float | None
    step_time_source: str  # "previous run", "preset FLOPs" or "none"
    hours: float | None  # wall hours of the training steps
    accelerators: int
    gpu_hours: float | None
    instance_type: str | None
    gpu: str | None  # the accelerator the step time assumes (None: none was assumed)
    capacity: str  # the run's capacity setting: spot, on-demand or spot-then-on-demand
    spot_cost: float | None
    on_demand_cost: float | None
    savings: float | None  # on_demand_cost - spot_cost: what spot saves if no preemption comes
    spot_price: "Priced"
    on_demand_price: "Priced"
    assumptions: list[str]  # plain sentences


# ------------------------------------------------------------------------- the model's work


def flops_per_token(args: ModelArgs, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token: ``6 N + 12 L d T`` (``trainer.flops``)."""
    return flops.flops_per_token(non_embedding_params(args), args.n_layers, args.dim, seq_len)


def same_model(a: Config, b: Config) -> bool:
    """Whether two configs train the same model: the same ``model.builder``, the same
    ``model.hf_config``, or with neither the same preset."""
    if a.model.builder != b.model.builder or a.model.hf_config != b.model.hf_config:
        return False
    return bool(a.model.builder) or a.model.hf_config is not None or a.model.preset == b.model.preset


def samples_per_step(config: Config, world_size: int) -> int:
    """Samples in one optimizer step on ``world_size`` ranks (the trainer's rule)."""
    t = config.train
    return t.global_batch_size or t.micro_batch_size * accumulation_steps(t, world_size) * world_size


def accelerators(nodes: int, gpus_per_node: int) -> int:
    """What is billed per node-hour, counted per accelerator: a CPU node counts as one."""
    return nodes * max(1, gpus_per_node)


def gpu_of(instance_type: str | None) -> tuple[str, int] | None:
    """``(GPU, GPUs per instance)`` of a known instance type, else None."""
    return _BY_FOLDED_NAME.get(instance_type.casefold()) if instance_type else None


def flops_step_s(
    *, tokens_per_step: int, flops_per_token: float, peak: float, devices: int, mfu: float
) -> float:
    """Seconds per step of ``devices`` devices of ``peak`` FLOP/s each working at ``mfu``."""
    if not 0 < mfu <= 1:
        raise ValueError(f"the assumed MFU must be a fraction in (0, 1], got {mfu!r}; 0.4 is typical")
    return tokens_per_step * flops_per_token / (mfu * peak * devices)


# ------------------------------------------------------------------------- an earlier run


def kept_step_s(records: list[MetricsRecord]) -> tuple[float, int] | None:
    """``(seconds per step, steps)`` over a run's kept steps (a replayed step counts once, as
    its highest attempt logged it), or None with fewer than two consecutive kept steps.

    Each attempt's kept steps form runs of consecutive step numbers; a run of steps ``a..b``
    measures ``b - a`` steps in ``time(b) - time(a)``, so the first step of each attempt,
    which holds its startup and resume, is never counted. Checkpoint stalls are counted: the
    new run will stall as often. A mean over runs of steps, not a median of single intervals:
    ``time`` is host time, taken without a device sync except every ``train.log_every`` steps,
    so single intervals swing between run-ahead and the sync.
    """
    kept = metrics_by_step(records)
    seconds, steps = 0.0, 0
    previous: MetricsRecord | None = None
    for step in sorted(kept):
        record = kept[step]
        if (
            previous is not None
            and previous["step"] == step - 1
            and previous.get("attempt") == record.get("attempt")
            and isinstance(record.get("time"), int | float)
            and isinstance(previous.get("time"), int | float)
        ):
            seconds += float(record["time"]) - float(previous["time"])
            steps += 1
        previous = record
    return (seconds / steps, steps) if steps and seconds > 0 else None


def measure_run(
    *,
    run_uri: str,
    config: Config,
    nodes: int,
    gpus_per_node: int,
    instance_type: str | None,
    records: list[MetricsRecord],
) -> Measured | None:
    """What the run at ``run_uri`` measured (:func:`kept_step_s`) on the shape it ran on, or None
    when its metrics hold no two consecutive kept steps."""
    found = kept_step_s(records)
    if found is None:
        return None
    world = accelerators(nodes, gpus_per_node)
    args = model_shape(config)
    return {
        "run_uri": run_uri,
        "step_s": found[0],
        "steps": found[1],
        "accelerators": world,
        "tokens_per_step": samples_per_step(config, world) * config.train.seq_len,
        "flops_per_token": None if args is None else flops_per_token(args, config.train.seq_len),
        "instance_type": instance_type,
    }


# ------------------------------------------------------------------------- the estimate


def _tflops(value: float) -> str:
    return f"{value / 1e12:g} TFLOP/s"


def _step_from_measured(
    measured: Measured, *, tokens_per_step: int, fpt: float | None, devices: int
) -> tuple[float, list[str]]:
    """The measured step time scaled to this run's work per step and accelerators, and what was said."""
    if fpt is not None and measured["flops_per_token"] is not None:
        work = tokens_per_step * fpt / (measured["tokens_per_step"] * measured["flops_per_token"])
    else:
        work = tokens_per_step / measured["tokens_per_step"]
    factor = work * measured["accelerators"] / devices
    said = [
        f"step time measured over {measured['steps']} kept steps of the last run of this DAG and model, "
        f"{measured['run_uri']}: {measured['step_s']:.3g} s/step on {measured['accelerators']} accelerators"
    ]
    if abs(factor - 1) > 1e-9:
        said.append(
            f"scaled by {factor:.3g} to this run's work per step and {devices} accelerators, assuming each "
            "accelerator keeps the throughput it had"
        )
    return measured["step_s"] * factor, said


def estimate_run(
    config: Config,
    *,
    nodes: int,
    gpus_per_node: int,
    capacity: str,
    prices: "PriceTable",
    instance_type: str | None = None,
    mfu: float = DEFAULT_MFU,
    measured: Measured | None = None,
    notes: Sequence[str] = (),
) -> Estimate:
    """The run's cost before launch: ``train.max_steps`` x the expected step time x the price per
    GPU-hour, for spot and for on-demand.

    :param config: the run's resolved trainer config (``model``, ``train``, ``precision``).
    :param capacity: the run's capacity setting (reported; both capacities are priced).
    :param prices: the price table (the contract's ``load_prices``); looked up with ``price_of``,
        which falls back to a per-GPU-hour default for an unknown or missing instance type.
    :param instance_type: what the nodes will be (a Kubernetes node selector, or what the last
        run ran on); None: unknown.
    :param mfu: the model FLOPs utilisation the FLOPs estimate assumes.
    :param measured: what the last run of the same DAG and model measured (it wins over FLOPs).
    :param notes: the caller's own assumptions (where the instance type and prices came from),
        said first.
    """
    if not 0 < mfu <= 1:
        raise ValueError(f"the assumed MFU must be a fraction in (0, 1], got {mfu!r}; 0.4 is typical")
    devices = accelerators(nodes, gpus_per_node)
    tokens_per_step = samples_per_step(config, devices) * config.train.seq_len
    args = model_shape(config)
    fpt = None if args is None else flops_per_token(args, config.train.seq_len)
    said = list(notes)
    known = gpu_of(instance_type)
    gpu: str | None = known[0] if known else None
    if known and gpus_per_node and known[1] != gpus_per_node:
        said.append(
            f"gpus_per_node={gpus_per_node}, but a {instance_type} has {known[1]} "
            f"GPU{'s' if known[1] != 1 else ''}: the estimate "
            f"counts {gpus_per_node} per node, as the job asks"
        )
    step_s: float | None
    if measured is not None:
        step_s, more = _step_from_measured(
            measured, tokens_per_step=tokens_per_step, fpt=fpt, devices=devices
        )
        said += more
        source = "previous run"
        if instance_type and measured["instance_type"] and measured["instance_type"] != instance_type:
            said.append(
                f"that run ran on {measured['instance_type']}, this one asks for {instance_type}: the "
                "step time is not adjusted for the difference"
            )
    elif args is not None and fpt is not None:
        peak = PEAK_FLOPS.get(gpu or "", {}).get(config.precision)
        if peak is None:
            if instance_type:
                what = f"{instance_type} ({gpu or 'not in the table of instance types'})"
            else:
                what = f"{'GPU' if gpus_per_node else 'CPU'} nodes of unknown instance type"
            gpu = REFERENCE_GPU
            peak = PEAK_FLOPS[gpu][config.precision]
            said.append(
                f"peak FLOP/s unknown for {what}: assumed an {gpu}'s {_tflops(peak)} {config.precision}; "
                "name the instance type (node selector node.kubernetes.io/instance-type) for a better figure"
            )
        step_s = flops_step_s(
            tokens_per_step=tokens_per_step, flops_per_token=fpt, peak=peak, devices=devices, mfu=mfu
        )
        vocab = "" if model_vocab(config) else f", counted with a {args.vocab_size:,}-token vocabulary"
        said.append(
            f"step time from the FLOPs of {model_label(config)} ({fpt:.4g} per token{vocab}) x "
            f"{tokens_per_step:,} tokens per step at an assumed {mfu:.0%} MFU of {devices} x {gpu} "
            f"({_tflops(peak)} {config.precision} dense peak, NVIDIA datasheet); no earlier run of this DAG "
            "and model was found to measure it"
        )
        source = "preset FLOPs"
    else:
        step_s, source, gpu = None, "none", None
        said.append(
            f"no step time: model.builder {config.model.builder!r} has no FLOPs count before it is built, "
            "and no earlier run of this DAG and model was found to measure it"
        )
    spot, on_demand = price_of(prices, instance_type, "spot"), price_of(prices, instance_type, "on-demand")
    for capacity_name, priced in (("spot", spot), ("on-demand", on_demand)):
        said.append(f"{capacity_name}: {money(priced['per_gpu_hour'])}/GPU-hour ({priced['source']})")
    if not gpus_per_node:
        said.append("CPU nodes: each node is priced as one accelerator")
    said.append(
        "not included: startup (image pull, rendezvous, resume), evaluation, and preemptions "
        "(each costs a restart and the steps since its last checkpoint)"
    )
    steps = config.train.max_steps
    hours = None if step_s is None else steps * step_s / 3600
    gpu_hours = None if hours is None else hours * devices
    spot_cost = None if gpu_hours is None else gpu_hours * spot["per_gpu_hour"]
    on_demand_cost = None if gpu_hours is None else gpu_hours * on_demand["per_gpu_hour"]
    return {
        "format": ESTIMATE_FORMAT,
        "estimate": True,
        "currency": "USD",
        "steps": steps,
        "step_s": step_s,
        "step_time_source": source,
        "hours": hours,
        "accelerators": devices,
        "gpu_hours": gpu_hours,
        "instance_type": instance_type,
        "gpu": gpu,
        "capacity": capacity,
        "spot_cost": spot_cost,
        "on_demand_cost": on_demand_cost,
        "savings": None if spot_cost is None or on_demand_cost is None else on_demand_cost - spot_cost,
        "spot_price": spot,
        "on_demand_price": on_demand,
        "assumptions": said,
    }


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}" if value >= 0.001 else f"{value:.1e}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{_number(seconds)} s"
    return f"{_number(seconds / 60)} min" if seconds < 3600 else f"{_number(seconds / 3600)} h"


def estimate_lines(estimate: Estimate) -> list[str]:
    """The estimate as a few readable lines (the dry run prints them)."""
    where = estimate["instance_type"] or "instance type unknown"
    count = estimate["accelerators"]
    head = f"COST ESTIMATE (before launch; every figure is an estimate, in {estimate['currency']}):"
    shape = f"{count} accelerator{'s' if count != 1 else ''} ({where}), capacity {estimate['capacity']}"
    step_s, hours, gpu_hours = estimate["step_s"], estimate["hours"], estimate["gpu_hours"]
    spot, on_demand = estimate["spot_cost"], estimate["on_demand_cost"]
    if step_s is None or hours is None or gpu_hours is None or spot is None or on_demand is None:
        lines = [head, f"  {estimate['steps']:,} steps on {shape}: no step time, so no cost"]
    else:
        saved = f"{(on_demand - spot) / on_demand:.0%}" if on_demand else "0%"
        lines = [
            head,
            f"  {estimate['steps']:,} steps x {_number(step_s)} s/step ({estimate['step_time_source']}) = "
            f"{_duration(hours * 3600)} on {shape} = {_number(gpu_hours)} GPU-hours",
            f"  spot {money(spot)}, on-demand {money(on_demand)}: spot saves {money(on_demand - spot)} "
            f"({saved}) if no preemption comes",
        ]
    return lines + [f"  - {line}" for line in estimate["assumptions"]]
