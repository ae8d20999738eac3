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
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer import data, parallel
from trainer.attempts import Attempt, NonFiniteLoss, attempt_number, failure_hint, now_iso
from trainer.checkpoint import Checkpointer
from trainer.config import Config
from trainer.contract import RunLayout
from trainer.export import write_export
from trainer.metrics import MetricsLog
from trainer.model import Transformer, count_parameters
from trainer.optim import build_optimizer, build_scheduler
from trainer.preemption import StopFlag, stop_decision
from trainer.presets import PRESETS
from trainer.progress import progress_line
from trainer.storage import open_storage

log = logging.getLogger("trainer.train")

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
    attempt = None
    try:
        number = parallel.broadcast_object(attempt_number(storage, layout) if env.is_main else None)
        attempt = Attempt(storage, layout, number, env.world_size, started_at=now_iso())
        outcome = _train(config, env, storage, attempt, flag)
        return PREEMPTED_EXIT_CODE if outcome == "preempted" else 0
    except Exception as exc:
        traceback.print_exc()
        step = attempt.last_step if attempt else 0
        hint = failure_hint(exc)
        if attempt is not None:
            try:
                attempt.write("failed", error=f"{type(exc).__name__}: {exc}", hint=hint, exclusive=not env.is_main)
            except Exception as write_error:  # the storage may be what failed; still say what happened
                print(f"trainer: could not write the attempt record: {write_error}", file=sys.stderr)
        print(f"trainer: failed at step {step}: {hint or f'{type(exc).__name__}: {exc}'}", file=sys.stderr, flush=True)
        return 1
    finally:
        parallel.shutdown()


def _train(config: Config, env: parallel.DistEnv, storage, attempt: Attempt, flag: StopFlag) -> str:
    t = config.train
    manifest = data.read_manifest(storage, config.data_uri)
    args = PRESETS[config.model.preset].with_vocab(config.model.vocab_size or manifest["tokenizer"]["vocab_size"])
    if args.vocab_size < manifest["tokenizer"]["vocab_size"]:
        raise ValueError(f"model.vocab_size={args.vocab_size} is smaller than the dataset's tokenizer "
                         f"({manifest['tokenizer']['vocab_size']}); set model.vocab_size=0 to take the dataset's")
    stream = data.open_split(storage, config.data_uri, manifest, "train")
    batches = data.TrainBatches(stream, t.seq_len, config.seed, t.micro_batch_size, env.world_size, env.rank)
    global_batch = data.global_batch_size(t.micro_batch_size, t.grad_accum_steps, env.world_size)

    torch.manual_seed(config.seed)  # every rank builds the same initial weights before sharding
    model = Transformer(args).to(env.device)
    log.info("model: preset %s, %s parameters (untied embeddings), vocab %d, precision %s, world size %d",
             config.model.preset, f"{count_parameters(model):,}", args.vocab_size, config.precision, env.world_size)
    if t.activation_checkpointing:
        parallel.apply_activation_checkpointing(model)
    parallel.apply_fsdp(model, config.precision)
    optimizer = build_optimizer(model, t.lr, t.weight_decay)
    scheduler = build_scheduler(optimizer, warmup_steps=t.warmup_steps, max_steps=t.max_steps,
                                min_lr_ratio=t.min_lr_ratio)
    scaler = parallel.grad_scaler(config.precision)
    checkpointer = Checkpointer(storage, config.run_uri, env.rank, env.world_size, config.checkpoint.keep)

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
    metrics = MetricsLog(storage, RunLayout(config.run_uri).metrics, attempt.number,
                         config.metrics.flush_every) if env.is_main else None
    meta = {"model": args.to_dict(), "data_uri": config.data_uri, "precision": config.precision}

    def save(at_step: int) -> None:
        extras = {"step": at_step, "cursor": cursor, "scheduler": scheduler.state_dict(),
                  "scaler": scaler.state_dict() if scaler is not None else None, "world_size": env.world_size,
                  "rng": {"torch": torch.get_rng_state(),
                          "cuda": torch.cuda.get_rng_state(env.device) if torch.cuda.is_available() else None}}
        checkpointer.save(at_step, model, optimizer, extras, {**meta, "cursor": cursor})
        attempt.checkpoint_step = at_step

    started, first_step = time.monotonic(), step
    while step < t.max_steps:
        step_started = time.monotonic()
        lr = scheduler.get_last_lr()[0]
        loss_sum = torch.zeros((), device=env.device)
        for micro in range(t.grad_accum_steps):
            inputs, targets = (x.to(env.device) for x in batches.micro_batch(cursor, micro))
            logits = model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / t.grad_accum_steps
            (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += loss.detach()
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step, cursor = step + 1, cursor + global_batch
        attempt.last_step = step

        # One collective per step: the stop flag and the loss, so all ranks agree on both.
        flag_sum, loss_total = parallel.all_reduce_sum([1.0 if flag.is_set else 0.0, loss_sum.item()], env.device)
        loss_mean = loss_total / env.world_size
        if not math.isfinite(loss_mean):
            raise NonFiniteLoss(step, loss_mean)
        stop, signal_name = stop_decision(flag_sum, flag.signal_name)
        stop = stop and step < t.max_steps  # on the last step, finishing is the quickest way out

        if env.is_main:
            now = time.monotonic()
            tokens_per_s = global_batch * t.seq_len / max(now - step_started, 1e-9)
            metrics.add(step=step, loss=loss_mean, lr=lr, tokens_per_s=tokens_per_s, time=time.time())
            if step % t.log_every == 0 or step == t.max_steps or stop:
                print(progress_line(step, t.max_steps, loss_mean, lr, tokens_per_s, now - started,
                                    step - first_step), flush=True)
        if step % config.checkpoint.every_steps == 0 or step == t.max_steps:
            save(step)
        if stop:
            if checkpointer.last_committed != step:
                save(step)  # the emergency checkpoint: synchronous, so nothing is lost
            if env.is_main:
                metrics.flush()
                attempt.write("preempted", signal=signal_name)
                log.info("preempted by %s: committed step %d, exiting", signal_name, step)
            parallel.barrier()  # no rank may exit before the record exists
            return "preempted"

    # The loop saved step max_steps; a relaunch of a finished run only re-exports.
    full_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        write_export(storage, RunLayout(config.run_uri).export, full_state, args, step=step,
                     data_uri=config.data_uri, run_uri=config.run_uri, precision=config.precision)
        metrics.flush()
        attempt.write("completed")
        log.info("completed: %d steps, checkpoint and export committed", step)
    parallel.barrier()
    return "completed"
