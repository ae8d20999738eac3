"""What a checkpoint reuses from one save to the next, so that the loop's share of a save stays small.

- **Staging buffers.** An async save first copies the sharded state (this rank's shards of the
  model and the optimizer) to CPU memory, and the loop waits for that copy; the background
  thread then writes from the copy while training goes on. A :func:`reusing_stager` keeps one
  CPU buffer per tensor storage and copies into it at every save (DCP's ``DefaultStager``),
  where DCP's default allocates fresh pageable memory each time: page faults on every save, and
  on a GPU a slow pageable device-to-host copy. With CUDA the buffers are pinned and the copies
  non-blocking, synchronised before the loop goes on. The price is memory: the buffers hold one
  copy of this rank's share of the state for the rest of the process.
- **Save plans.** DCP plans every save with a gather of each rank's plan to rank 0 and a
  scatter back. The plan of a state that keeps its shapes is the same at every save, so a
  :func:`caching_planner` sends empty plans after the first one (DCP's plan caching). DCP keeps
  that cache in class-level dicts under a key, by default the planner's class name, which every
  planner in the process would share; each :class:`~trainer.checkpoint.save.Checkpointer` gets a key
  of its own (:func:`plan_key`), so two checkpointers in one process never mix their plans.
"""

from __future__ import annotations

import itertools
import logging

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

log = logging.getLogger("trainer.checkpoint")
_keys = itertools.count(1)


def reusing_stager(cuda: bool | None = None) -> DefaultStager:
    """A stager that copies into the same CPU buffers at every save (pinned ones with CUDA).

    Staging is synchronous: when ``stage`` returns, the copy is complete and the weights may
    change. The caller must not stage again while a save still writes from the buffers (the
    Checkpointer has one save in flight at most, and waits for it before the next).

    :param cuda: whether the state lives on a CUDA device (default: CUDA is available); pinned
        buffers and non-blocking copies need it.
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,  # the save runs in a thread of this process, not another process
            use_async_staging=False,  # the loop's next optimizer step would race a background copy
            use_non_blocking_copy=cuda,
        )
    )


def stager_reuse_works() -> bool:
    """Whether this torch's ``DefaultStager`` survives a second save.

    torch 2.11 closes a ``DefaultStager``'s copier at the end of every stage, so the next stage
    fails with ``KeyError: <class 'type'>`` (pytorch/pytorch#183413, fixed in #183424). Found
    by staging a one-element state twice, not by version: a backport counts.
    """
    probe = reusing_stager(cuda=False)
    try:
        for _ in range(2):
            probe.stage({"probe": torch.zeros(1)})
    except KeyError:
        return False
    finally:
        probe.close()
    return True


class SaveStagers:
    """The stager for each async save: one :func:`reusing_stager` kept for every save, or, on a
    torch whose stager cannot be reused (:func:`stager_reuse_works`), a fresh one per save
    (fresh staging memory each time, as DCP's default does: slower, still correct).

    :param cuda: whether the state lives on a CUDA device (default: CUDA is available).
    """

    def __init__(self, cuda: bool | None = None):
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.reused = stager_reuse_works()
        self._kept = reusing_stager(self.cuda) if self.reused else None
        if not self.reused:
            log.warning(
                "checkpoint: torch %s cannot reuse DCP staging buffers (pytorch/pytorch#183413); each "
                "async save stages into fresh memory, which holds the loop longer: use torch 2.13",
                torch.__version__,
            )

    def for_save(self) -> DefaultStager:
        """The stager of the next save."""
        return self._kept if self._kept is not None else reusing_stager(self.cuda)


def plan_key() -> str:
    """A key for DCP's plan cache that no other planner in this process uses."""
    return f"trainops-checkpointer-{next(_keys)}"


def caching_planner(key: str) -> DefaultSavePlanner:
    """DCP's default save planner, caching its plans under ``key`` (:func:`plan_key`).

    Make one per save: a planner holds on to the state dict of its save. The cache lives on
    under the key.
    """
    planner = DefaultSavePlanner(enable_plan_caching=True)
    planner._cached_plans_key = key  # DCP's default key is the class name, shared process-wide
    return planner
