"""The model of the stored checkpoint (tests/data/checkpoint_v1): a one-layer Llama with dim 16, so
that the run folder with its optimizer state stays a few hundred kilobytes."""

from __future__ import annotations

from torch import nn

from trainer.models.llama import Transformer
from trainer.presets import ModelArgs


def build(vocab_size: int, seq_len: int) -> tuple[nn.Module, list[nn.Module]]:
    """``model.builder=tiny_llama:build``; ``seq_len`` is not needed (rotary positions)."""
    model = Transformer(ModelArgs(dim=16, n_layers=1, n_heads=2, multiple_of=16, vocab_size=vocab_size))
    return model, list(model.layers)
