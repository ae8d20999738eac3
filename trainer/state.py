"""What a checkpoint holds, as ``Stateful`` objects (``state_dict`` / ``load_state_dict``).

- :class:`TrainState`: the step, the data cursor (a global sample index) and this rank's RNG
  state (torch's, and CUDA's when there is a GPU). Small, and per rank.
- :class:`ModelState` and :class:`OptimizerState`: the model and its optimizer through
  torch's distributed state-dict API, so that a save writes every rank's shards and a load
  reshards them for another world size.

:func:`checkpoint_states` names them for :class:`trainer.checkpoint.save.Checkpointer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful


@dataclass
class TrainState:
    """Where training stands: optimizer steps done and samples consumed, plus the RNG to go on with.

    :param device: this rank's device; its CUDA generator is saved when CUDA is available.
    """

    device: torch.device
    step: int = 0
    cursor: int = 0

    def state_dict(self) -> dict[str, Any]:
        """Step, cursor and the RNG state as of now (the RNG is read, not kept)."""
        cuda = torch.cuda.get_rng_state(self.device) if torch.cuda.is_available() else None
        return {
            "step": self.step,
            "cursor": self.cursor,
            "rng": {"torch": torch.get_rng_state(), "cuda": cuda},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take step and cursor, and set this process's RNG to the saved one.

        A CUDA state saved on a GPU is not restored on a CPU-only resume (nothing draws from it).
        """
        self.step, self.cursor = int(state_dict["step"]), int(state_dict["cursor"])
        rng = state_dict["rng"]
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"], self.device)


class ModelState:
    """The (possibly FSDP-sharded) model's parameters: each rank saves and loads its own shards."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state_dict)


class OptimizerState:
    """The optimizer's state, keyed by parameter name (not position), so it reshards with the model."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


def checkpoint_states(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Stateful,
    scaler: Stateful | None,
    train_state: TrainState,
) -> dict[str, Stateful]:
    """The states a training checkpoint owns, by the names it stores them under.

    ``model`` and ``optim`` are sharded (the names are also their DCP keys); ``scheduler``,
    ``scaler`` (fp16 only) and ``train_state`` are per rank.
    """
    states: dict[str, Stateful] = {
        "model": ModelState(model),
        "optim": OptimizerState(model, optimizer),
        "scheduler": scheduler,
        "train_state": train_state,
    }
    if scaler is not None:
        states["scaler"] = scaler
    return states
