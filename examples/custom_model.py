"""A user model for trainops: a small GPT (learned positions, LayerNorm, GELU MLP).

Train it with ``model.builder=custom_model:build`` and this folder on ``PYTHONPATH``
(see docs/models.md). The trainer calls ``build(vocab_size=..., seq_len=...)`` on every
rank after seeding torch the same way, and expects ``(model, blocks)``:

- ``model(tokens)`` maps token ids ``(batch, seq)`` to logits ``(batch, seq, vocab_size)``;
- ``blocks`` are the submodules that activation checkpointing wraps, ``torch.compile`` compiles
  and FSDP2 shards, one by one and in that order (``trainer.parallel.parallelize``).

The model itself knows nothing about distribution or precision; the trainer applies those.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DIM, LAYERS, HEADS = 64, 2, 4


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(
        self, vocab_size: int, seq_len: int, dim: int = DIM, layers: int = LAYERS, heads: int = HEADS
    ):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)
        self.positions = nn.Embedding(seq_len, dim)  # learned: sequences longer than seq_len are refused
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build(vocab_size: int, seq_len: int) -> tuple[nn.Module, list[nn.Module]]:
    """The builder trainops calls: ``model.builder=custom_model:build``."""
    model = TinyGPT(vocab_size, seq_len)
    return model, list(model.blocks)
