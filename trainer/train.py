"""``trainer train``: the training loop, top to bottom.

setup -> resume -> (step, agree to stop, log, checkpoint)* -> final checkpoint, export,
attempt record. Every attempt ends with an attempt record in storage, because torchrun's
exit code cannot say whether we were preempted.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import traceback

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer import data, parallel
from trainer.attempts import Attempt, NonFiniteLoss, attempt_number, failure_hint, now_iso
from trainer.builder import build_model
from trainer.checkpoint import Checkpointer
from trainer.config import Config, accumulation_steps
from trainer.contract import RunLayout
from trainer.export import write_export
from trainer.flops import mfu, peak_flops
from trainer.metrics import MetricsLog
from trainer.optim import build_optimizer, build_scheduler
from trainer.preemption import StopFlag, stop_decision
from trainer.progress import progress_line
from trainer.step import apply_gradients, forward_backward
from trainer.storage import open_storage

log = logging.getLogger("trainer.train")

# How long a failing attempt waits for a checkpoint still being written in the background before
# it gives up on it (a peer that died leaves it hanging); the previous committed one stays valid.
FAILED_SAVE_WAIT_S = 120.0

# A preempted worker exits non-zero on purpose: a torchrun agent whose workers all exit 0 waits
# in its exit barrier (up to 300 s) for the agents of the other nodes, and a preempted node's
# agent never arrives. Non-zero makes every agent exit at once; the attempt record says why.
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, the shell's convention


def run_train(config: Config) -> int:
    """Train per ``config``; the exit code for the CLI (``PREEMPTED_EXIT_CODE`` when preempted)."""
    flag = StopFlag().install()  # first: a SIGTERM during setup must not kill us unsaved
    env = parallel.init_distributed()
    logging.getLogger("trainer").setLevel(logging.INFO if env.is_main else logging.WARNING)
    storage = open_storage(config.run_uri)
    layout = RunLayout(config.run_uri)
    attempt = checkpointer = None
    try:
        number = parallel.broadcast_object(attempt_number(storage, layout) if env.is_main else None)
        attempt = Attempt(storage, layout, number, env.world_size, started_at=now_iso())
        checkpointer = Checkpointer(
            storage,
            config.run_uri,
            env.rank,
            env.world_size,
            config.checkpoint.keep,
            on_commit=lambda step: setattr(attempt, "checkpoint_step", step),
        )
        outcome = _train(config, env, storage, attempt, flag, checkpointer)
        return PREEMPTED_EXIT_CODE if outcome == "preempted" else 0
    except Exception as exc:
        traceback.print_exc()
        if checkpointer is not None:
            try:  # a save in flight is a good checkpoint: let it commit if the others can too
                if not checkpointer.wait(timeout=FAILED_SAVE_WAIT_S):
                    print("trainer: gave up waiting for the checkpoint in flight", file=sys.stderr)
            except Exception as save_error:
                print(f"trainer: {save_error}", file=sys.stderr)
        step = attempt.last_step if attempt else 0
        hint = failure_hint(exc)
        if attempt is not None:
            try:
                attempt.write(
                    "failed", error=f"{type(exc).__name__}: {exc}", hint=hint, exclusive=not env.is_main
                )
            except Exception as write_error:  # the storage may be what failed; still say what happened
                print(f"trainer: could not write the attempt record: {write_error}", file=sys.stderr)
        print(
            f"trainer: failed at step {step}: {hint or f'{type(exc).__name__}: {exc}'}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    finally:
        parallel.shutdown()


def _train(
    config: Config,
    env: parallel.DistEnv,
    storage,
    attempt: Attempt,
    flag: StopFlag,
    checkpointer: Checkpointer,
) -> str:
    t = config.train
    accum = accumulation_steps(t, env.world_size)  # before anything slow: a bad batch fails fast
    data_storage = open_storage(config.data_uri)  # the dataset may live on another scheme than the run
    manifest = data.read_manifest(data_storage, config.data_uri)
    vocab = config.model.vocab_size or manifest["tokenizer"]["vocab_size"]
    if vocab < manifest["tokenizer"]["vocab_size"]:
        raise ValueError(
            f"model.vocab_size={vocab} is smaller than the dataset's tokenizer "
            f"({manifest['tokenizer']['vocab_size']}); set model.vocab_size=0 to take the dataset's"
        )
    stream = data.open_split(data_storage, config.data_uri, manifest, "train")
    batches = data.TrainBatches(stream, t.seq_len, config.seed, t.micro_batch_size, env.world_size, env.rank)
    global_batch = data.global_batch_size(t.micro_batch_size, accum, env.world_size)
    log.info(
        "batch: %d samples per step = micro batch %d x %d accumulation steps x %d ranks",
        global_batch,
        t.micro_batch_size,
        accum,
        env.world_size,
    )

    torch.manual_seed(config.seed)  # every rank builds the same initial weights before sharding
    built = build_model(config.model.preset, config.model.builder, vocab, t.seq_len)
    model = built.model.to(env.device)
    log.info("model: %s, precision %s, world size %d", built.describe(), config.precision, env.world_size)
    if t.activation_checkpointing != "none":
        parallel.apply_activation_checkpointing(model, built.block_names, t.activation_checkpointing)
    if t.compile:
        parallel.apply_compile(model, built.block_names)
    parallel.apply_fsdp(model, built.block_names, config.precision)
    log.info(
        "step options: %s",
        parallel.describe_step_options(
            t.activation_checkpointing,
            len(built.block_names),
            t.compile,
            t.skip_grad_sync_in_accum and accum > 1,
        ),
    )
    flops_per_token = built.flops_per_token(t.seq_len)
    device_peak = peak_flops(
        torch.cuda.get_device_name(env.device) if torch.cuda.is_available() else None, config.precision
    )
    optimizer = build_optimizer(model, t.lr, t.weight_decay)
    scheduler = build_scheduler(
        optimizer, warmup_steps=t.warmup_steps, max_steps=t.max_steps, min_lr_ratio=t.min_lr_ratio
    )
    scaler = parallel.grad_scaler(config.precision)

    step, cursor = 0, 0
    if config.resume == "auto":
        restored = checkpointer.load_latest(model, optimizer)
        if restored is not None:
            step, extras = restored
            cursor = extras["cursor"]
            scheduler.load_state_dict(extras["scheduler"])
            if scaler is not None and extras.get("scaler"):
                scaler.load_state_dict(extras["scaler"])
            torch.set_rng_state(extras["rng"]["torch"])
            if extras["rng"].get("cuda") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state(extras["rng"]["cuda"], env.device)
            attempt.resumed_from_step = attempt.checkpoint_step = step
            log.info("resume: step %d, data cursor %d", step, cursor)
    attempt.last_step = step
    metrics = (
        MetricsLog(storage, RunLayout(config.run_uri).metrics, attempt.number, config.metrics.flush_every)
        if env.is_main
        else None
    )
    meta = {"model": built.spec, "data_uri": config.data_uri, "precision": config.precision}

    def save(at_step: int, background: bool) -> None:
        extras = {
            "step": at_step,
            "cursor": cursor,
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "world_size": env.world_size,
            "rng": {
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(env.device) if torch.cuda.is_available() else None,
            },
        }
        if background:
            checkpointer.save_async(at_step, model, optimizer, extras, {**meta, "cursor": cursor})
        else:  # waits for any save in flight first
            checkpointer.save(at_step, model, optimizer, extras, {**meta, "cursor": cursor})

    started, first_step = time.monotonic(), step
    while step < t.max_steps:
        step_started = time.monotonic()
        lr = scheduler.get_last_lr()[0]
        micro_batches = (
            tuple(x.to(env.device) for x in batches.micro_batch(cursor, micro)) for micro in range(accum)
        )
        loss_sum = forward_backward(model, micro_batches, accum, scaler, t.skip_grad_sync_in_accum)
        apply_gradients(model, optimizer, scheduler, scaler, t.grad_clip)
        step, cursor = step + 1, cursor + global_batch
        attempt.last_step = step

        # One collective per step: the stop flag and the loss, so all ranks agree on both.
        flag_sum, loss_total = parallel.all_reduce_sum(
            [1.0 if flag.is_set else 0.0, loss_sum.item()], env.device
        )
        loss_mean = loss_total / env.world_size
        if not math.isfinite(loss_mean):
            raise NonFiniteLoss(step, loss_mean)
        stop, signal_name = stop_decision(flag_sum, flag.signal_name)
        stop = stop and step < t.max_steps  # on the last step, finishing is the quickest way out

        if env.is_main:
            now = time.monotonic()
            tokens_per_s = global_batch * t.seq_len / max(now - step_started, 1e-9)
            step_mfu = mfu(
                tokens_per_s, flops_per_token, device_peak * env.world_size if device_peak else None
            )
            peak_mem = (
                torch.cuda.max_memory_allocated(env.device) / 2**30 if torch.cuda.is_available() else None
            )
            metrics.add(
                step=step,
                loss=loss_mean,
                lr=lr,
                tokens_per_s=tokens_per_s,
                time=time.time(),
                **({"mfu": step_mfu} if step_mfu is not None else {}),
                **({"peak_mem_gib": peak_mem} if peak_mem is not None else {}),
            )
            if step % t.log_every == 0 or step == t.max_steps or stop:
                print(
                    progress_line(
                        step,
                        t.max_steps,
                        loss_mean,
                        lr,
                        tokens_per_s,
                        now - started,
                        step - first_step,
                        mfu=step_mfu,
                        peak_mem_gib=peak_mem,
                    ),
                    flush=True,
                )
        if step == t.max_steps:
            save(step, background=False)  # the final checkpoint: the export and the record follow it
        elif step % config.checkpoint.every_steps == 0:
            save(step, background=True)  # the loop waits only while the state is copied
        if stop:
            checkpointer.wait()  # a regular save of this very step may still be in flight
            if checkpointer.last_committed != step:
                save(step, background=False)  # the emergency checkpoint: synchronous, so nothing is lost
            if env.is_main:
                metrics.flush()
                attempt.write("preempted", signal=signal_name)
                log.info("preempted by %s: committed step %d, exiting", signal_name, step)
            parallel.barrier()  # no rank may exit before the record exists
            return "preempted"

    # The loop saved step max_steps; a relaunch of a finished run only re-exports.
    full_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        write_export(
            storage,
            RunLayout(config.run_uri).export,
            full_state,
            built,
            step=step,
            data_uri=config.data_uri,
            run_uri=config.run_uri,
            precision=config.precision,
            seq_len=t.seq_len,
        )
        metrics.flush()
        attempt.write("completed")
        log.info("completed: %d steps, checkpoint and export committed", step)
    parallel.barrier()
    return "completed"
