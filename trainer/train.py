"""``trainer train``: setup, one optimizer step, and the loop.

:func:`setup` builds what the loop needs (a :class:`Training`) and resumes it from the newest
committed checkpoint; :func:`train_step` does one optimizer step on every rank;
:func:`train_loop` steps, logs and checkpoints until ``train.max_steps`` or a preemption, then
finishes: final checkpoint, export, attempt record. Every attempt ends with an attempt record
in storage (:func:`run_train` writes the failed one), because torchrun's exit code cannot say
whether we were preempted. When storage refuses even that record, rank 0 prints it as its last
line (``trainer.contract.attempt_record_line``) for the operator to find in the log. An attempt
that a newer one fenced off (``trainer.checkpoint.fence``) writes nothing more and exits. One whose node
lacks the GPUs the launcher gave it fails before any process group (``parallel.GPUsMissing``,
cause ``node``), and one whose dataset cannot feed the config fails before it downloads a shard
(``trainer.config.check_data_fit``, the operator's own rule).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer import data, parallel
from trainer.checkpoint.cadence import Cadence, mtbf_s, observed_rate
from trainer.checkpoint.fence import Fenced, raise_fence
from trainer.checkpoint.save import Checkpointer, on_rank0
from trainer.checkpoint.warm_start import pinned_hf_config, warm_start
from trainer.config import CHECKPOINT_AUTO, Config, accumulation_steps, check_data_fit, pin_labels
from trainer.contract import (
    RECORD_TASKS,
    AttemptRecord,
    RunLayout,
    attempt_record_line,
    dataset_task,
    split_records,
    task_labels,
)
from trainer.export.folder import join_export, write_export
from trainer.flops import mfu, peak_flops
from trainer.models.builder import BuiltModel, build_model
from trainer.optim import build_optimizer, build_scheduler
from trainer.records import RecordBatches, check_records, read_records
from trainer.runtime import heartbeat
from trainer.runtime.attempts import (
    NON_FINITE_HINT,
    Attempt,
    NonFiniteLoss,
    attempt_number,
    cause_of,
    classify_failure,
    now_iso,
)
from trainer.runtime.bad_loss import BadLoss, BudgetSpent, LossWatch, Rollback, plan_rollback
from trainer.runtime.metrics import OUTAGE_TOLERANCE_S as METRICS_OUTAGE_TOLERANCE_S
from trainer.runtime.metrics import MetricsLog
from trainer.runtime.notice import notice_record
from trainer.runtime.notice import watch as watch_notices
from trainer.runtime.preemption import NOTICE, PREEMPTED_EXIT_CODE, StopFlag, stop_cause, stop_decision
from trainer.runtime.progress import progress_line
from trainer.runtime.restarts import Earlier
from trainer.state import TrainState, checkpoint_states
from trainer.step import apply_gradients, forward_backward, read_losses
from trainer.storage import Storage, open_storage, outage_tolerance

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.optim.lr_scheduler import LRScheduler

    from trainer.storage import Storage

log = logging.getLogger("trainer.train")

# How long a failing attempt waits for a checkpoint still being written in the background before
# it gives up on it (a peer that died leaves it hanging); the previous committed one stays valid.
FAILED_SAVE_WAIT_S = 120.0


@dataclass
class Training:
    """Everything the loop needs, as :func:`setup` built it."""

    config: Config
    env: parallel.DistEnv
    attempt: Attempt
    built: BuiltModel
    model: nn.Module  # ``built.model``, parallelized
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    scaler: ShardedGradScaler | None  # fp16 only
    batches: data.TrainBatches | RecordBatches
    feed: data.DeviceFeed  # ``batches`` on the device, one micro-batch ahead
    host_group: dist.ProcessGroup  # gloo, for the stop flag (``parallel.host_group``)
    accum: int  # micro-steps per optimizer step on this world size
    global_batch: int  # samples per optimizer step, all ranks together
    state: TrainState
    checkpointer: Checkpointer
    metrics: MetricsLog | None  # rank 0's; the other ranks neither log nor write the record
    flops_per_token: float
    device_peak: float | None  # peak FLOP/s of one device; None where unknown (no MFU)
    loss_watch: LossWatch = field(default_factory=LossWatch)  # which loss is bad (bad-loss recovery)
    cadence: Cadence = field(default_factory=lambda: Cadence(25, 0, 3600.0))  # which steps save
    # rank 0's heartbeat writer (the loop's; the other ranks' does nothing): marks long operations
    pulse: heartbeat.HeartbeatWriter | heartbeat.NoHeartbeat = field(default_factory=heartbeat.NoHeartbeat)
    rollbacks: list[Rollback] = field(default_factory=list)  # this attempt's, oldest first


@dataclass(frozen=True)
class StepResult:
    step: int  # the step done (1-based)
    loss: torch.Tensor  # this rank's mean loss of the step: 0-d, on the device, not read yet
    lr: float  # the learning rate the step used
    stop_votes: float  # how many ranks were signalled before the step began (the same on every rank)
    save_votes: float  # how many ranks had an advisory notice ask for a checkpoint (ditto)
    started: float  # monotonic seconds when the step began
    time: float  # wall-clock seconds when the host had issued the whole step
    extra: dict[str, float] = field(default_factory=dict)  # more figures for the step's metrics record
    # the gradients' total norm (0-d, on the device, the same on every rank; None under fp16's scaler)
    grad_norm: torch.Tensor | None = None


def run_train(config: Config, earlier: Earlier | None = None) -> int:
    """Train per ``config``; the exit code for the CLI (``PREEMPTED_EXIT_CODE`` when preempted).

    :param earlier: what an in-place restart learnt from the incarnations before it
        (``trainer.runtime.restarts``); they go into the attempt record's ``restarts``.
    """
    restarts = earlier.restarts if earlier is not None else None
    flag = StopFlag().install()  # first: a SIGTERM during setup must not kill us unsaved
    started_at = now_iso()
    storage, layout = open_storage(config.run_uri), RunLayout(config.run_uri)
    env: parallel.DistEnv | None = None
    attempt: Attempt | None = None
    training: Training | None = None
    try:
        env = parallel.init_distributed(config.train.collective_timeout_s)
        # this node's spot notice watcher (local rank 0's); a bad setting fails here, on every rank
        watch_notices(os.environ, env.local_rank, flag.on_notice)
        logging.getLogger("trainer").setLevel(logging.INFO if env.is_main else logging.WARNING)
        number = on_rank0(env.rank, lambda: attempt_number(storage, layout))
        attempt = Attempt(storage, layout, number, env.world_size, started_at=started_at, restarts=restarts)
        if restarts and env.is_main:
            before = restarts[-1]
            checkpoint = before.get("checkpoint_step")
            heartbeat.restarting(config.run_uri, number, checkpoint if isinstance(checkpoint, int) else 0)
            log.warning(
                "restart in place %d of attempt %d: the incarnation before ended %s%s at step %s; "
                "resuming from the newest checkpoint",
                len(restarts),
                number,
                before.get("outcome"),
                f" ({before['cause']})" if before.get("cause") else "",
                before.get("last_step", "?"),
            )
        training = setup(config, env, attempt)
        outcome = train_loop(training, flag)
        return PREEMPTED_EXIT_CODE if outcome == "preempted" else 0
    except Fenced as exc:  # a newer attempt runs: anything this one wrote now would be in its way
        if env is not None and env.is_main:
            print(
                f"trainer: fenced: {exc}; exiting without writing anything more", file=sys.stderr, flush=True
            )
        return 1
    except Exception as exc:
        traceback.print_exc()
        if env is None:  # before the process group (GPUs missing, no rendezvous): each rank alone
            is_main = os.environ.get("RANK", "0") == "0"
            alone = _attempt_without_group(storage, layout, started_at)
            if alone is not None:
                alone.restarts = restarts
            _record_failure(exc, is_main, alone, None)
        else:
            _record_failure(exc, env.is_main, attempt, training)
        return 1
    finally:
        parallel.shutdown()


def _attempt_without_group(storage: Storage, layout: RunLayout, started_at: str) -> Attempt | None:
    """The attempt of a rank that failed before the process group existed, when no collective
    can agree on anything: its number from ``$TRAINOPS_ATTEMPT`` (every launcher sets it), its
    world size from ``$WORLD_SIZE``. None when even the number cannot be had."""
    try:
        number = attempt_number(storage, layout)
    except Exception as exc:
        print(f"trainer: could not tell the attempt's number: {exc}", file=sys.stderr)
        return None
    return Attempt(storage, layout, number, int(os.environ.get("WORLD_SIZE", "1")), started_at=started_at)


# --- setup ---------------------------------------------------------------------------------
def setup(config: Config, env: parallel.DistEnv, attempt: Attempt) -> Training:
    """Raise the fence, build data, model, optimizer and checkpointer on every rank, then resume
    from the newest committed checkpoint (``resume: auto``), or else load ``init.from``'s
    weights (``trainer.checkpoint.warm_start``: each rank its own rows). The model is sharded over
    ``parallel.replicate``'s mesh (flat FSDP or HSDP) and, for a preset, never held whole by
    any rank (:func:`build_sharded_model`).

    Raises :class:`Fenced` when a newer attempt already started, and
    ``trainer.checkpoint.save.NothingToResume`` when checkpoints were committed but none can be
    resumed: starting over from step 0 then would silently throw the run away.
    """
    config = pinned_hf_config(config)  # model.hf: the folder's config.json, as the operator pinned it
    t = config.train
    accum = accumulation_steps(t, env.world_size)  # before anything slow: a bad batch fails fast
    mesh = parallel.device_mesh(env, config.parallel.replicate)  # so does a bad parallel.replicate
    # Before any checkpoint is read: from now on the attempts before this one may commit nothing.
    on_rank0(env.rank, lambda: raise_fence(attempt.storage, attempt.layout, attempt.number))
    data_storage, manifest, vocab = _train_data(config, env)
    config = task_config(config, manifest)  # classification: the dataset's labels, in the model's config
    global_batch = data.global_batch_size(t.micro_batch_size, accum, env.world_size)
    log.info(
        "batch: %d samples per step = micro batch %d x %d accumulation steps x %d ranks",
        global_batch,
        t.micro_batch_size,
        accum,
        env.world_size,
    )

    built = build_sharded_model(config, env, vocab, mesh)
    model = built.model
    log.info("model: %s, precision %s, world size %d", built.describe(), config.precision, env.world_size)
    log.info("sharding: %s", parallel.describe_mesh(mesh, env.world_size))
    skip_sync = t.skip_grad_sync_in_accum and accum > 1
    log.info(
        "step options: %s",
        parallel.describe_step_options(
            t.activation_checkpointing, len(built.block_names), t.compile, skip_sync
        ),
    )
    optimizer = build_optimizer(model, t.lr, t.weight_decay)
    scheduler = build_scheduler(
        optimizer, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio
    )
    scaler = parallel.grad_scaler(config.precision)

    state = TrainState(env.device)
    host_group = parallel.host_group()
    storage = open_storage(config.run_uri)
    checkpointer = Checkpointer(
        storage,
        config.run_uri,
        env.rank,
        env.world_size,
        config.checkpoint.keep,
        states=checkpoint_states(model, optimizer, scheduler, scaler, state),
        meta={"model": built.spec, "data_uri": config.data_uri, "precision": config.precision},
        on_commit=attempt.committed,
        attempt=attempt.number,
        hold_for_eval=(config.checkpoint.every_steps, config.eval.every_checkpoints),
    )
    loading = time.monotonic()
    resumed = checkpointer.load_latest() if config.resume == "auto" else None
    if resumed is not None:
        attempt.resumed_from_step = attempt.checkpoint_step = resumed
        attempt.restore_s = round(time.monotonic() - loading, 3)  # the cost accounting's restore
        attempt.restore_files = checkpointer.restore_files
        log.info("resume: step %d, data cursor %d", state.step, state.cursor)
    else:  # a committed checkpoint wins over init.from: a warm-started run resumes exactly
        warm_start(config, model, built.args)
    attempt.last_step = state.step
    batches = _train_batches(config, env, data_storage, manifest, state, global_batch)
    metrics = (
        MetricsLog(
            # buffered records need no long wait; never longer than the run's own tolerance
            open_storage(
                config.run_uri, outage_tolerance_s=min(outage_tolerance(), METRICS_OUTAGE_TOLERANCE_S)
            ),
            RunLayout(config.run_uri).metrics,
            attempt.number,
            config.metrics.flush_every,
        )
        if env.is_main
        else None
    )
    device_name = torch.cuda.get_device_name(env.device) if torch.cuda.is_available() else None
    return Training(
        config,
        env,
        attempt,
        built,
        model,
        optimizer,
        scheduler,
        scaler,
        batches,
        data.DeviceFeed(batches, env.device),
        host_group,
        accum,
        global_batch,
        state,
        checkpointer,
        metrics,
        flops_per_token=built.flops_per_token(t.seq_len),
        device_peak=peak_flops(device_name, config.precision),
        loss_watch=LossWatch(t.loss_spike_factor),
        cadence=Cadence(config.checkpoint.every_steps, state.step, _mtbf_s(config, env, attempt)),
    )


def _mtbf_s(config: Config, env: parallel.DistEnv, attempt: Attempt) -> float:
    """Seconds between preemptions that ``checkpoint.every_steps: auto`` plans for: from the
    configured rate, or the rate the run's earlier attempts show when higher (rank 0 reads
    their records; every rank gets the figure)."""
    configured = config.checkpoint.preemptions_per_hour
    if config.checkpoint.every_steps != CHECKPOINT_AUTO:
        return mtbf_s(configured, None)

    def earlier() -> float | None:
        store, layout = attempt.storage, attempt.layout
        records: list[dict[str, Any]] = []
        for n in range(1, attempt.number):
            try:
                record = store.get_json(layout.attempt(n))
            except Exception:  # a missing or damaged record says nothing of the rate
                continue
            if isinstance(record, dict):
                records.append(record)
        return observed_rate(records)

    observed = on_rank0(env.rank, earlier)
    if env.is_main:
        seen = f", {observed:.2g}/h observed" if observed is not None else ""
        log.info(
            "checkpoint: every_steps auto, planning for %.2g preemption(s) per hour (%.2g/h configured%s)",
            3600.0 / mtbf_s(configured, observed),
            configured,
            seen,
        )
    return mtbf_s(configured, observed)


def build_sharded_model(
    config: Config, env: parallel.DistEnv, vocab: int, mesh: DeviceMesh | None = None
) -> BuiltModel:
    """The model, parallelized per ``config`` over ``mesh``, with its initial weights.

    A preset or a ``model.hf_config`` model is built on the ``meta`` device and sharded there
    (``BuiltModel.meta_init`` says how it starts); each rank then allocates and
    fills only its own shards (``parallel.init_sharded``), so its memory holds its share of
    the model, never the whole, and the weights do not depend on the world size. A user's
    builder builds the whole model on every rank from torch's RNG seeded with ``seed`` (its
    own initialisation), which is then moved to the device and sharded.
    """
    t = config.train
    torch.manual_seed(config.seed)
    if config.model.builder:
        built = build_model(config.model.preset, config.model.builder, vocab, t.seq_len)
        built.model.to(env.device)
        parallel.parallelize(built.model, built.block_names, config, mesh)
        return built
    with torch.device("meta"):
        built = build_model(config.model.preset, None, vocab, t.seq_len, hf_config=config.model.hf_config)
    parallel.parallelize(built.model, built.block_names, config, mesh)
    init = built.meta_init
    assert init is not None  # a preset's and a Hugging Face model's rule (trainer.models.builder)
    parallel.init_sharded(
        built.model,
        env.device,
        config.seed,
        init.std,
        fill_buffers=init.fill_buffers,
        zero_rows=init.zero_rows,
    )
    return built


def _train_data(config: Config, env: parallel.DistEnv) -> tuple[Storage, dict[str, Any], int]:
    """The dataset's storage and manifest, and the model's vocabulary size.

    The dataset must fit the config by the operator's own rule (``check_data_fit``), checked
    on the manifest before any shard is downloaded or any model built.
    """
    data_storage = open_storage(config.data_uri)  # the dataset may live on another scheme than the run
    manifest = data.read_manifest(data_storage, config.data_uri)
    train_tokens, dataset_vocab = data.manifest_numbers(manifest, config.data_uri)
    try:
        task = dataset_task(manifest)
    except ValueError as exc:
        raise data.DataError(f"{config.data_uri}: {exc}") from None
    records = split_records(manifest, "train")
    check_data_fit(
        config,
        train_tokens=train_tokens,
        tokenizer_vocab=dataset_vocab,
        world_size=env.world_size,
        dataset_task=task,
        train_records=int(records.get("count", 0)) if records else None,
        labels=_labels(config, manifest),
    )
    return data_storage, manifest, config.model.vocab_size or dataset_vocab


def _labels(config: Config, manifest: dict[str, Any]) -> list[str] | None:
    """A ``classification`` dataset's label set (None for another task), a DataError naming the
    dataset when its manifest has none."""
    try:
        return task_labels(manifest)
    except ValueError as exc:
        raise data.DataError(f"{config.data_uri}: {exc}") from None


def task_config(config: Config, manifest: dict[str, Any]) -> Config:
    """``config`` with what the dataset fixes of its model: a ``classification`` run's label set
    (``trainer.config.pin_labels``), refused when the model's config names other labels."""
    labels = _labels(config, manifest)
    return pin_labels(config, labels) if labels is not None else config


def _train_batches(
    config: Config,
    env: parallel.DistEnv,
    data_storage: Storage,
    manifest: dict[str, Any],
    state: TrainState,
    global_batch: int,
) -> data.TrainBatches | RecordBatches:
    """This rank's batches of the train split, from the resumed ``state`` on: only the shards the
    remaining steps read are fetched (each once per node; every shard for a record task); the
    shards must hold what the manifest says."""
    t = config.train
    train_tokens, _ = data.manifest_numbers(manifest, config.data_uri)
    shards = data.split_info(manifest, "train", config.data_uri)["shards"]
    only = None
    records = config.task.kind in RECORD_TASKS
    if not records and all("tokens" in shard for shard in shards):  # else: fetch every shard
        remaining = data.remaining_positions(state.cursor, state.step, t.max_steps, global_batch)
        only = data.shards_read([int(s["tokens"]) for s in shards], t.seq_len, config.seed, remaining)
        log.info("data: %d of %d train shards are read by the remaining steps", len(only), len(shards))
    stream = data.open_split(data_storage, config.data_uri, manifest, "train", only)
    if len(stream) != train_tokens:
        raise data.DataError(
            f"the train split of {config.data_uri} holds {len(stream)} tokens in its shards, but its "
            f"manifest says {train_tokens}; re-stage the dataset"
        )
    if records:
        rows = read_records(data_storage, config.data_uri, manifest, "train")
        labels = _labels(config, manifest)
        check_records(rows, len(stream), config.data_uri, len(labels) if labels is not None else None)
        return RecordBatches(
            stream,
            rows,
            config.task.kind,
            t.seq_len,
            config.seed,
            t.micro_batch_size,
            env.world_size,
            env.rank,
        )
    return data.TrainBatches(stream, t.seq_len, config.seed, t.micro_batch_size, env.world_size, env.rank)


# --- one step ------------------------------------------------------------------------------
def train_step(tr: Training, flag: StopFlag) -> StepResult:
    """One optimizer step on every rank, issued without waiting for the device.

    Before the compute, every rank starts the sum of the ranks' stop flags (asynchronously, on
    the host group); once the step's forwards and backwards are issued it takes the sum, long
    arrived by then. So every rank learns whether a rank was signalled before the step began,
    and all stop after the same step: a signal during a step stops the run after the next one.
    Unless this step is the last (``train.max_steps``, or the ranks agreed to stop), the next
    step's first micro-batch is then read and sent to the device while the device computes.
    The step's loss stays on the device (``StepResult.loss``; :func:`train_loop` reads it).
    """
    t, state = tr.config.train, tr.state
    lr = float(tr.scheduler.get_last_lr()[0])
    started = time.monotonic()
    wants_save = 1.0 if flag.take_save_request() else 0.0
    pending_votes = parallel.all_reduce_sum_async([1.0 if flag.is_set else 0.0, wants_save], tr.host_group)
    votes: list[float] = []

    def micro_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for micro in range(tr.accum):
            # read (or prefetched) while the previous micro-batch computes
            yield tr.feed.get(state.cursor, micro)
        # Resumed once the last micro-batch's forward and backward are issued: the votes now.
        votes.extend(pending_votes.wait())
        last = stop_decision(votes[0], None)[0] or state.step + 1 >= t.max_steps
        if not last:
            tr.feed.prefetch(state.cursor + tr.global_batch, 0)

    loss = forward_backward(
        tr.model, micro_batches(), tr.accum, tr.scaler, t.skip_grad_sync_in_accum, tr.batches.masked
    )
    norm = apply_gradients(tr.model, tr.optimizer, tr.scheduler, tr.scaler, t.grad_clip)
    state.step, state.cursor = state.step + 1, state.cursor + tr.global_batch
    tr.attempt.last_step = state.step
    return StepResult(state.step, loss, lr, votes[0], votes[1], started, time.time(), grad_norm=norm)


# --- the loop ------------------------------------------------------------------------------
def train_loop(tr: Training, flag: StopFlag) -> str:
    """Step, log and checkpoint until ``train.max_steps`` (``"completed"``) or until a rank is
    signalled (``"preempted"``: all ranks stop after the same step, the one after the signal).

    The host waits for the device only when it reads the losses: every ``train.log_every``
    steps, before a checkpoint (whose weights must be finite), on the last step and when
    stopping. A NaN or infinite loss (or a spike, when ``train.loss_spike_factor`` is set) is
    caught there: the ranks roll back to the newest checkpoint and skip the steps since
    (:func:`_roll_back`), or, past ``train.rollback_budget``, fail with :class:`NonFiniteLoss`.
    """
    t, state = tr.config.train, tr.state
    started, first_step = time.monotonic(), state.step
    tr.attempt.first_step_time = time.time()  # startup ends here (the cost accounting's split)
    tr.cadence.mark = (started, state.step)  # auto checkpoints: the pace is timed from here
    pulse = tr.pulse = heartbeat.beats(tr.config.run_uri, tr.attempt.number, tr.env.is_main, state.step)
    unread: list[StepResult] = []  # steps whose loss is still on the device
    while state.step < t.max_steps:
        result = train_step(tr, flag)
        pulse.beat(state.step, time.monotonic() - result.started)  # the operator's hang watch (host time)
        unread.append(result)
        stop = stop_decision(result.stop_votes, flag.signal_name)[0]
        stop = stop and state.step < t.max_steps  # on the last step, finishing is the quickest way out
        due = tr.cadence.due(state.step) or result.save_votes > 0  # an advisory notice asks for one
        save = due and state.step < t.max_steps
        logged = state.step % t.log_every == 0 or state.step == t.max_steps or stop
        losses = _read_losses(tr, unread) if logged or save else None
        if isinstance(losses, BadLoss) and stop:  # no rollback in a notice window: stop at once
            if tr.env.is_main:
                log.warning(
                    "bad loss: %s at step %d while stopping: these weights are not saved; the next "
                    "attempt resumes from the newest checkpoint",
                    losses.why,
                    losses.step,
                )
            with pulse.busy("stopping"):
                _stop_preempted(tr, flag, save=False)
            return "preempted"
        if isinstance(losses, BadLoss):  # the steps since the newest checkpoint are skipped
            with pulse.busy("bad-loss rollback"):  # a checkpoint load: no hang
                _roll_back(tr, losses)
            unread = []
            continue  # a stop agreed on this step is agreed again on the next one
        if save and result.save_votes > 0 and tr.env.is_main:
            log.info("checkpoint: step %d saved now, as the cloud's notice advised", state.step)
        if save:  # the loop waits while the state is copied, and for a previous save in flight
            with pulse.busy("checkpoint save"):  # a long wait here is no hang
                saved = tr.checkpointer.save_async(state.step)
            result.extra["checkpoint_blocked_s"] = round(saved.total_s, 4)
            result.extra["checkpoint_waited_s"] = round(saved.waited_s, 4)
            if tr.cadence.auto:
                _next_save(tr, result, saved.total_s)
        if losses is not None:
            if tr.metrics is not None:
                _log_steps(tr, tr.metrics, unread, losses, started, first_step, print_line=logged)
            unread = []
        if stop:
            with pulse.busy("emergency checkpoint"):
                _stop_preempted(tr, flag)
            return "preempted"
    with pulse.busy("final checkpoint and export"):
        _finish(tr)
    return "completed"


def _next_save(tr: Training, result: StepResult, blocked_s: float) -> None:
    """``checkpoint.every_steps: auto``: the next save's step, from figures every rank agrees on
    (their means: each rank's own would differ, and the ranks must save at the same step): this
    save's blocking of the loop, the previous save's time to commit, and the loop's pace since
    the previous save, the blocking left out. Logged when it first comes, or moves by a fifth."""
    cadence, now = tr.cadence, time.monotonic()
    since, steps = cadence.mark
    commit = tr.checkpointer.last_commit_s
    sums = parallel.all_reduce_sum_async(
        [blocked_s, -1.0 if commit is None else commit, now - since - blocked_s, float(result.step - steps)],
        tr.host_group,
    ).wait()
    world = tr.env.world_size
    blocked, committed, loop_s, count = (v / world for v in sums)
    cadence.mark = (now, result.step)
    before = cadence.interval
    interval = cadence.saved(
        result.step,
        step_s=loop_s / max(count, 1.0),
        blocked_s=blocked,
        commit_s=None if committed < 0 else committed,
    )
    if interval is None:
        return
    result.extra["checkpoint_every_steps"] = interval.steps
    moved = before is None or abs(interval.steps - before.steps) > before.steps / 5
    if tr.env.is_main and moved:
        log.info(
            "checkpoint: every %d steps (%.0fs) from now on; %s",
            interval.steps,
            interval.seconds,
            interval.why,
        )


def _read_losses(tr: Training, steps: list[StepResult]) -> list[float] | BadLoss:
    """Every rank: the mean loss over the ranks of each of ``steps`` (one collective), or the
    first bad one (non-finite, or a spike: ``tr.loss_watch``), on every rank alike, after rank
    0 logged the steps before it."""
    losses = read_losses([r.loss for r in steps], parallel.sum_over_ranks, tr.env.world_size)
    norms = [r.grad_norm for r in steps if r.grad_norm is not None]
    # the same on every rank already (clip_grad_norm_ reduced them): no collective, one read
    grad_norms = torch.stack(norms).tolist() if norms and len(norms) == len(steps) else None
    bad = tr.loss_watch.check([r.step for r in steps], losses, grad_norms)
    if bad is None:
        return losses
    good = [r.step for r in steps].index(bad.step)
    if tr.metrics is not None and good:
        _log_steps(tr, tr.metrics, steps[:good], losses[:good], time.monotonic(), tr.state.step, False)
    return bad


def _roll_back(tr: Training, bad: BadLoss) -> None:
    """Every rank: restore the newest committed checkpoint (its steps' losses were read finite
    before it was saved) and go on from the current step, skipping the steps trained since
    (``trainer.runtime.bad_loss``): the step counter, the schedule and the data cursor stay
    where they are, the weights and optimizer state go back. Recorded in the attempt record's
    ``rollbacks``. Raises :class:`NonFiniteLoss` naming every rollback when the budget
    (``train.rollback_budget``) is spent or nothing was committed yet."""
    state, budget = tr.state, tr.config.train.rollback_budget
    tr.checkpointer.wait()  # a save in flight is of steps read good: let it commit first
    try:
        plan_rollback(
            bad,
            committed=tr.checkpointer.last_committed,
            current=state.step,
            done=tr.rollbacks,
            budget=budget,
            hint=NON_FINITE_HINT,
        )
    except BudgetSpent as exc:
        raise NonFiniteLoss(bad.step, bad.loss, str(exc)) from None
    step, cursor, loading = state.step, state.cursor, time.monotonic()
    restored = tr.checkpointer.load_latest()
    if restored is None:  # committed, yet nothing to load: the load would have raised
        raise NonFiniteLoss(
            bad.step, bad.loss, f"{bad.why} at step {bad.step}: no checkpoint could be loaded"
        )
    for _ in range(step - state.step):  # the schedule as it was at the current step
        tr.scheduler.step()
    state.step, state.cursor = step, cursor
    took = round(time.monotonic() - loading, 3)
    rollback = Rollback(bad, restored, restored + 1, step, took, tr.checkpointer.restore_files)
    tr.rollbacks.append(rollback)
    tr.attempt.rollbacks = [r.record() for r in tr.rollbacks]
    if tr.env.is_main:
        log.warning(
            "bad loss: %s (rollback %d of at most %d)", rollback.describe(), len(tr.rollbacks), budget
        )


def _log_steps(
    tr: Training,
    metrics: MetricsLog,
    steps: list[StepResult],
    losses: list[float],
    started: float,
    first_step: int,
    print_line: bool,
) -> None:
    """Rank 0: each step's metrics record, and the progress line of the last one when
    ``print_line``. Tokens/s and MFU are over the steps read together (from the first one's
    start to now, after the read waited for the device): what one step took is not known on
    the host without a wait. The time the loop was held by async checkpoints
    (``checkpoint_blocked_s`` of a step's record, the wait for a previous save included) is
    left out."""
    t, last, now = tr.config.train, steps[-1], time.monotonic()
    blocked = sum(float(r.extra.get("checkpoint_blocked_s", 0.0)) for r in steps)
    elapsed = now - steps[0].started - blocked
    tokens_per_s = len(steps) * tr.global_batch * t.seq_len / max(elapsed, 1e-9)
    all_devices_peak = tr.device_peak * tr.env.world_size if tr.device_peak else None
    step_mfu = mfu(tokens_per_s, tr.flops_per_token, all_devices_peak)
    peak_mem = torch.cuda.max_memory_allocated(tr.env.device) / 2**30 if torch.cuda.is_available() else None
    for result, loss in zip(steps, losses, strict=True):
        metrics.add(
            step=result.step,
            loss=loss,
            lr=result.lr,
            tokens_per_s=tokens_per_s,
            time=result.time,
            **({"mfu": step_mfu} if step_mfu is not None else {}),
            **({"peak_mem_gib": peak_mem} if peak_mem is not None else {}),
            flush=False,
            **result.extra,
        )
    if metrics.due:  # the steps read together make one part
        with tr.pulse.busy("metrics flush"):  # a flush riding out a storage blip is no hang
            metrics.flush_if_due()
    if print_line:
        line = progress_line(
            last.step,
            t.max_steps,
            losses[-1],
            last.lr,
            tokens_per_s,
            now - started,
            last.step - first_step,
            mfu=step_mfu,
            peak_mem_gib=peak_mem,
        )
        print(line, flush=True)


def _stop_preempted(tr: Training, flag: StopFlag, *, save: bool = True) -> None:
    """Commit this step (the emergency checkpoint, unless a regular save already holds it),
    then rank 0 writes the preempted record, with ``emergency_save_s``: the seconds from its
    own signal or notice (``flag.at``; else from the agreed stop) to the commit. No rank exits
    before the record exists.

    What stopped the gang is gathered from every rank first (``stop_cause``): the node whose
    watcher read the cloud's notice may not be rank 0's. The notice, its lead and when the save
    committed go into the record (``notice``). ``save=False``: the current weights are bad
    (a bad loss was read as the ranks agreed to stop): nothing is saved, and the record's
    checkpoint is the newest one committed."""
    step, started = tr.state.step, min(flag.at or math.inf, time.monotonic())
    seen = parallel.gather_objects((flag.signal_name, flag.notice), tr.host_group)
    signal_name, notice = stop_cause(seen)
    # epoch, for the cost accounting: the first notice, else this rank's own signal, else now
    tr.attempt.signal_time = time.time() - (time.monotonic() - started)
    if notice is not None:
        tr.attempt.signal_time = min(tr.attempt.signal_time, notice.noticed_at)
    tr.checkpointer.wait()  # a regular save of this very step may still be in flight
    if save and tr.checkpointer.last_committed != step:
        tr.checkpointer.save(step)  # synchronous, so nothing is lost
    # what the notice window must hold: the operator warns when the grace period is shorter
    tr.attempt.emergency_save_s = round(time.monotonic() - started, 3)
    if notice is not None:
        nodes = sorted({n.node for _, n in seen if n is not None and n.node})  # each node that read one
        tr.attempt.notice = notice_record(notice, saved_at=time.time(), nodes=nodes)
    if tr.metrics is not None:
        unwritten = tr.metrics.flush(final=True)
        tr.attempt.write("preempted", signal=signal_name, metrics_unwritten=unwritten)
        why = f"the {notice.describe()}" if notice is not None and signal_name == NOTICE else signal_name
        log.info("preempted by %s: committed step %d, exiting", why, step)
    parallel.barrier()


def _finish(tr: Training) -> None:
    """The final checkpoint, then rank 0 writes the export and the completed record.

    A relaunch of a finished run resumes at its final checkpoint: it only re-exports.
    """
    step, config = tr.state.step, tr.config
    if tr.checkpointer.last_committed != step:
        tr.checkpointer.save(step)  # synchronous: the export and the record follow it
    # Every rank gathers the weights one tensor at a time; rank 0 streams each into the export.
    if tr.metrics is None:
        join_export(tr.model.state_dict(), tr.built, dtype=config.export.dtype)
    else:
        write_export(
            open_storage(config.run_uri),
            RunLayout(config.run_uri).export,
            tr.model.state_dict(),
            tr.built,
            step=step,
            data_uri=config.data_uri,
            run_uri=config.run_uri,
            precision=config.precision,
            seq_len=config.train.seq_len,
            dtype=config.export.dtype,
            max_shard_bytes=config.export.max_shard_bytes,
        )
        unwritten = tr.metrics.flush(final=True)
        tr.attempt.write("completed", metrics_unwritten=unwritten)
        log.info("completed: %d steps, checkpoint and export committed", step)
    parallel.barrier()


# --- the failure path ----------------------------------------------------------------------
def _record_failure(
    exc: Exception, is_main: bool, attempt: Attempt | None, training: Training | None
) -> None:
    """Let a save in flight commit, write the failed record (rank 0's, else the first rank's),
    and say on stderr where it failed and what to try. When storage refuses the record, rank 0's
    last line is the record itself, marked (``trainer.contract.attempt_record_line``).

    A failure of the infrastructure (storage, network, node) also prints the marked record at
    once, on every rank, before the slow clean-up: storage is probably what failed, and the first
    rank to exit makes the launcher stop the others, maybe before rank 0 is done. The operator
    takes the last marked line of the attempt it finds in the log tail."""
    kind, hint = classify_failure(exc)
    if attempt is not None and cause_of(kind) != "program":
        early = attempt.record(
            "failed", error=f"{type(exc).__name__}: {exc}", hint=hint, cause=cause_of(kind)
        )
        print(attempt_record_line(early, early=True), file=sys.stderr, flush=True)
    if training is not None:
        try:  # a save in flight is a good checkpoint: let it commit if the others can too
            if not training.checkpointer.wait(timeout=FAILED_SAVE_WAIT_S):
                print("trainer: gave up waiting for the checkpoint in flight", file=sys.stderr)
        except Exception as save_error:
            print(f"trainer: {save_error}", file=sys.stderr)
    unstored: AttemptRecord | None = None
    if attempt is not None:
        unwritten = training.metrics.flush(final=True) if training and training.metrics else 0
        record = attempt.record(
            "failed",
            error=f"{type(exc).__name__}: {exc}",
            hint=hint,
            cause=cause_of(kind),
            metrics_unwritten=unwritten,
        )
        try:
            attempt.store(record, exclusive=not is_main)
        except Exception as write_error:  # the storage may be what failed; still say what happened
            print(f"trainer: could not write the attempt record: {write_error}", file=sys.stderr)
            unstored = record
    step = attempt.last_step if attempt else 0
    print(
        f"trainer: failed at step {step}: {hint or f'{type(exc).__name__}: {exc}'}",
        file=sys.stderr,
        flush=True,
    )
    if unstored is not None and is_main:  # rank 0's is complete (it alone counts the metrics)
        print(attempt_record_line(unstored), file=sys.stderr, flush=True)
