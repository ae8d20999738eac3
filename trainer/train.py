"""``trainer train``: setup, one optimizer step, and the loop.

:func:`setup` builds what the loop needs (a ``Training``, ``trainer.runtime.training``) and
resumes it from the newest committed checkpoint; :func:`train_step` does one optimizer step on
every rank; :func:`train_loop` steps, logs and checkpoints until ``train.max_steps`` or a
preemption, then finishes: final checkpoint, export, attempt record. Every attempt ends with an
attempt record in storage (:func:`run_train` writes the failed one), because torchrun's exit
code cannot say whether we were preempted. When storage refuses even that record, rank 0 prints
it as its last line (``trainer.contract.attempt_record_line``) for the operator to find in the
log. An attempt that a newer one fenced off (``trainer.checkpoint.fence``) writes nothing more
and exits. One whose node lacks the GPUs the launcher gave it fails before any process group
(``parallel.GPUsMissing``, cause ``node``), and one whose dataset cannot feed the config fails
before it downloads a shard (``trainer.config.check_data_fit``, the operator's own rule).

The loop's parts live in ``trainer.runtime``: the state records ``Training`` and ``StepResult``
(``training``), the train split's checks and batches (``train_data``), the steps' metrics
records and progress line (``step_log``), the bad-loss read and rollback (``rollback``), and
the ending of an attempt, preempted, completed or failed (``ending``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from trainer import data, parallel
from trainer.checkpoint.cadence import Cadence, mtbf_s, observed_rate
from trainer.checkpoint.fence import Fenced, raise_fence
from trainer.checkpoint.save import Checkpointer, on_rank0
from trainer.checkpoint.warm_start import pinned_hf_config, warm_start
from trainer.config import CHECKPOINT_AUTO, Config, accumulation_steps
from trainer.contract import RunLayout
from trainer.flops import peak_flops
from trainer.models.builder import BuiltModel, build_model
from trainer.optim import build_optimizer, build_scheduler
from trainer.runtime import heartbeat
from trainer.runtime.attempts import Attempt, attempt_number, now_iso
from trainer.runtime.bad_loss import BadLoss, LossWatch
from trainer.runtime.ending import (
    attempt_without_group,
    finish,  # bench/loop_overhead.py replaces it here
    record_failure,
    stop_preempted,
)
from trainer.runtime.metrics import OUTAGE_TOLERANCE_S as METRICS_OUTAGE_TOLERANCE_S
from trainer.runtime.metrics import MetricsLog
from trainer.runtime.notice import watch as watch_notices
from trainer.runtime.preemption import PREEMPTED_EXIT_CODE, StopFlag, stop_decision
from trainer.runtime.restarts import Earlier
from trainer.runtime.rollback import read_step_losses, roll_back
from trainer.runtime.step_log import log_steps
from trainer.runtime.train_data import task_config, train_batches, train_data
from trainer.runtime.training import StepResult, Training
from trainer.state import TrainState, checkpoint_states
from trainer.step import apply_gradients, forward_backward
from trainer.storage import open_storage, outage_tolerance

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

log = logging.getLogger("trainer.train")


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
            alone = attempt_without_group(storage, layout, started_at)
            if alone is not None:
                alone.restarts = restarts
            record_failure(exc, is_main, alone, None)
        else:
            record_failure(exc, env.is_main, attempt, training)
        return 1
    finally:
        parallel.shutdown()


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
    data_storage, manifest, vocab = train_data(config, env)
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
    batches = train_batches(config, env, data_storage, manifest, state, global_batch)
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
    (``trainer.runtime.rollback.roll_back``), or, past ``train.rollback_budget``, fail with
    :class:`NonFiniteLoss`.
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
        losses = read_step_losses(tr, unread) if logged or save else None
        if isinstance(losses, BadLoss) and stop:  # no rollback in a notice window: stop at once
            if tr.env.is_main:
                log.warning(
                    "bad loss: %s at step %d while stopping: these weights are not saved; the next "
                    "attempt resumes from the newest checkpoint",
                    losses.why,
                    losses.step,
                )
            with pulse.busy("stopping"):
                stop_preempted(tr, flag, save=False)
            return "preempted"
        if isinstance(losses, BadLoss):  # the steps since the newest checkpoint are skipped
            with pulse.busy("bad-loss rollback"):  # a checkpoint load: no hang
                roll_back(tr, losses)
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
                log_steps(tr, tr.metrics, unread, losses, started, first_step, print_line=logged)
            unread = []
        if stop:
            with pulse.busy("emergency checkpoint"):
                stop_preempted(tr, flag)
            return "preempted"
    with pulse.busy("final checkpoint and export"):
        finish(tr)
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
