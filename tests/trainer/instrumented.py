"""``python -m trainer`` with two test instruments, for the resume tests (run it with ``-m``).

- ``TRAINOPS_TEST_SAMPLES_DIR``: every rank appends what each micro-batch read (cursor,
  micro-step, global positions, sample ids) to ``samples_a<attempt>_r<rank>.jsonl`` there.
- ``TRAINOPS_TEST_SIGTERM_AT=<cursor>:<micro>``: every rank sends itself SIGTERM as it reads
  that micro-batch, so the signal lands inside a step, deterministically.

Both wrap ``TrainBatches.micro_batch``; the trainer runs unchanged otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from trainer import data
from trainer.cli import main


def install() -> None:
    original = data.TrainBatches.micro_batch
    samples_dir = os.environ.get("TRAINOPS_TEST_SAMPLES_DIR")
    sigterm_at = os.environ.get("TRAINOPS_TEST_SIGTERM_AT")
    target = tuple(int(x) for x in sigterm_at.split(":")) if sigterm_at else None

    def micro_batch(self, cursor: int, micro_step: int):
        if target == (cursor, micro_step):
            os.kill(os.getpid(), signal.SIGTERM)
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

    data.TrainBatches.micro_batch = micro_batch


if __name__ == "__main__":  # the guard matters: async checkpointing may re-import the main module
    install()
    sys.exit(main())
