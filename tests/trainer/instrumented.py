"""``python -m trainer`` with test instruments, for the resume, outage and fencing tests (run it
with ``-m``).

- ``TRAINOPS_TEST_SAMPLES_DIR``: every rank appends what each micro-batch read (cursor,
  micro-step, global positions, sample ids) to ``samples_a<attempt>_r<rank>.jsonl`` there.
- ``TRAINOPS_TEST_SIGTERM_AT=<cursor>:<micro>[:<rank>]``: every rank (or only ``rank``) sends
  itself SIGTERM as it reads that micro-batch, so the signal lands inside a step,
  deterministically.
- ``TRAINOPS_TEST_PAUSE_AT=<cursor>:<folder>``: as it reads that cursor's first micro-batch,
  every rank creates ``<folder>/paused_a<attempt>_r<rank>`` and waits (at most 120 s) until
  ``<folder>/go_a<attempt>`` exists: a gang held still, as a partitioned node would be.
- ``TRAINOPS_TEST_BLACKOUT_AT=<cursor>:<step>``: as it reads that cursor's first micro-batch,
  every rank waits (at most 120 s) until the run's ``latest.json`` names ``step``; from then on
  every storage call of the process fails as the client would after its retries, as in an
  outage that outlasts them.

- ``TRAINOPS_TEST_KILL_AT=<cursor>:<rank>:<folder>``: as it reads that cursor's first
  micro-batch, rank ``rank`` of the first incarnation (``TORCHELASTIC_RESTART_COUNT`` 0) writes
  the epoch time into ``<folder>/killed_r<rank>`` and sends itself SIGKILL: one worker process
  dies, its node and agent live on (an in-place restart, ``trainer.runtime.restarts``).

- ``TRAINOPS_TEST_RAISE_AT=<cursor>:<rank>:<folder>``: as it reads that cursor's first
  micro-batch, rank ``rank`` of every incarnation raises ``KeyError`` (a program error, as bad
  data or a bug would), after adding a file ``<folder>/raised_r<rank>_<n>`` (one per raise).

- ``TRAINOPS_TEST_NAN_AT_STEP=<step>[:grads]``: that step's loss and gradients become NaN on
  every rank, once per process (the weights its update leaves are NaN too), as a bad batch would
  make them; with ``:grads``, the gradients only: the loss read stays finite.

All but the last wrap ``TrainBatches.micro_batch`` and ``RecordBatches.micro_batch`` (and, for
the blackout, the storage the trainer opens: ``open_storage`` of ``trainer.train``,
``trainer.runtime.train_data`` and ``trainer.runtime.ending``); the last wraps
``train.train_step`` and ``train.forward_backward``. The trainer runs unchanged otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.trainer.helpers import ForwardingStorage
from trainer import data, records, train
from trainer.cli import main
from trainer.contract import RunLayout
from trainer.runtime import ending, train_data
from trainer.storage import StorageUnavailable

PAUSE_LIMIT_S = 120.0


class Blackout(ForwardingStorage):
    """A storage that forwards every call until the blackout starts, then refuses them all."""

    dark = False
    run_uri: str | None = None  # the first URI the trainer opened: its run_uri

    def before(self, action: str, uri: str) -> None:
        if Blackout.dark:
            raise StorageUnavailable(  # what the client raises once an outage outlasts its tolerance
                f"storage: {action} {uri} kept failing (last: refused (503 SlowDown)), beyond the outage "
                "tolerance (test blackout)"
            )


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"test instrument: {what} did not happen within {PAUSE_LIMIT_S:.0f}s")
        time.sleep(0.05)


def wait_for_go(folder: Path, rank: int) -> None:
    attempt = os.environ.get("TRAINOPS_ATTEMPT", "0")
    (folder / f"paused_a{attempt}_r{rank}").touch()
    wait_until((folder / f"go_a{attempt}").exists, f"{folder}/go_a{attempt}")


def go_dark_after(step: int) -> None:
    storage, latest = train.open_storage(Blackout.run_uri), RunLayout(Blackout.run_uri).latest
    wait_until(lambda: storage.get_json(latest)["step"] >= step, f"the commit of step {step}")
    Blackout.dark = True


def install() -> None:
    blackout_at = os.environ.get("TRAINOPS_TEST_BLACKOUT_AT")
    blackout = tuple(int(x) for x in blackout_at.split(":")) if blackout_at else None
    if blackout is not None:
        opened = train.open_storage

        def open_storage(uri: str, **options) -> Blackout:
            Blackout.run_uri = Blackout.run_uri or uri
            return Blackout(opened(uri, **options))

        for module in (train, train_data, ending):  # each module of the loop that opens a storage
            module.open_storage = open_storage
    for batches in (data.TrainBatches, records.RecordBatches):  # token windows, a record task's samples
        instrument(batches, blackout)
    nan_at = os.environ.get("TRAINOPS_TEST_NAN_AT_STEP")
    if nan_at:
        step, _, what = nan_at.partition(":")
        poison_step(int(step), grads_only=what == "grads")


def poison_step(step: int, grads_only: bool = False) -> None:
    """Step ``step``'s loss and gradients are NaN (once: a rollback never trains it again);
    ``grads_only``: its gradients alone."""
    armed = {"now": False, "done": False}
    train_step, forward_backward = train.train_step, train.forward_backward

    def poisoned_train_step(tr, flag):
        armed["now"] = not armed["done"] and tr.state.step + 1 == step
        return train_step(tr, flag)

    def poisoned_forward_backward(model, *args, **kwargs):
        loss = forward_backward(model, *args, **kwargs)
        if armed["now"]:
            armed["now"], armed["done"] = False, True
            for param in model.parameters():
                if param.grad is not None:
                    param.grad.mul_(float("nan"))
            if not grads_only:
                loss = loss * float("nan")
        return loss

    train.train_step, train.forward_backward = poisoned_train_step, poisoned_forward_backward


def instrument(batches: type, blackout: tuple[int, ...] | None) -> None:
    original = batches.micro_batch
    samples_dir = os.environ.get("TRAINOPS_TEST_SAMPLES_DIR")
    sigterm_at = os.environ.get("TRAINOPS_TEST_SIGTERM_AT")
    target = tuple(int(x) for x in sigterm_at.split(":")) if sigterm_at else None
    signalled_rank = target[2] if target is not None and len(target) > 2 else None
    pause_at = os.environ.get("TRAINOPS_TEST_PAUSE_AT")
    pause = (int(pause_at.split(":", 1)[0]), Path(pause_at.split(":", 1)[1])) if pause_at else None
    raise_at = os.environ.get("TRAINOPS_TEST_RAISE_AT")
    fault = raise_at.split(":", 2) if raise_at else None
    kill_at = os.environ.get("TRAINOPS_TEST_KILL_AT")
    kill = (
        kill_at.split(":", 2)
        if kill_at and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        else None
    )

    def micro_batch(self, cursor: int, micro_step: int):
        if target is not None and target[:2] == (cursor, micro_step) and signalled_rank in (None, self.rank):
            os.kill(os.getpid(), signal.SIGTERM)
        if pause is not None and pause[0] == cursor and micro_step == 0:
            wait_for_go(pause[1], self.rank)
        if kill is not None and (int(kill[0]), 0, int(kill[1])) == (cursor, micro_step, self.rank):
            (Path(kill[2]) / f"killed_r{self.rank}").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if fault is not None and (int(fault[0]), 0, int(fault[1])) == (cursor, micro_step, self.rank):
            raised = len(list(Path(fault[2]).glob(f"raised_r{self.rank}_*")))
            (Path(fault[2]) / f"raised_r{self.rank}_{raised}").write_text(repr(time.time()))
            raise KeyError(f"label of sample at cursor {cursor}")
        if blackout is not None and blackout[0] == cursor and micro_step == 0:
            go_dark_after(blackout[1])
        if samples_dir:
            positions = list(
                data.micro_batch_positions(
                    cursor, micro_step, self.micro_batch_size, self.world_size, self.rank
                )
            )
            name = f"samples_a{os.environ.get('TRAINOPS_ATTEMPT', '0')}_r{self.rank}.jsonl"
            with open(os.path.join(samples_dir, name), "a") as f:
                f.write(
                    json.dumps(
                        {
                            "cursor": cursor,
                            "micro": micro_step,
                            "positions": positions,
                            "ids": [self.order.sample_id(p) for p in positions],
                        }
                    )
                    + "\n"
                )
        return original(self, cursor, micro_step)

    batches.micro_batch = micro_batch


if __name__ == "__main__":  # the guard matters: async checkpointing may re-import the main module
    install()
    sys.exit(main())
