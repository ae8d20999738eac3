"""A Llama-style decoder in one file: RMSNorm, RoPE, SwiGLU, causal SDPA attention.

It knows nothing about distribution: ``trainer.parallel`` shards ``model.layers`` from
outside. Embeddings and the output projection are untied, so every block and the root
can be sharded independently.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.presets import ModelArgs


class _RMSNormFunction(torch.autograd.Function):
    """``x / rms(x) * weight`` with the statistics in fp32, keeping only ``x`` (in its own
    dtype) and one fp32 reciprocal RMS per row for backward.

    Written out with autograd, the same math kept two fp32 copies of ``x`` and the rounded
    product, five times the bytes of a bf16 ``x`` (docs/models.md, "Precision and memory").
    Backward recomputes the normalised ``x`` from what was kept, in fp32.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        # The same roundings as the plain formulation: normalise in fp32, round, then scale.
        return (x32 * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd
        grad32 = grad.to(rstd.dtype)
        grad_weight = (grad32 * normed).sum(dim=tuple(range(grad.dim() - 1)))
        gn = grad32 * weight.to(rstd.dtype)
        # d/dx of x * rstd: rstd * (gn - normed * mean(gn * normed)) along the normalised dim.
        grad_x = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32: bf16 sums of squares lose too much precision. Only x and the
        # per-row scale are kept for backward (_RMSNormFunction), not an fp32 copy of x.
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def rope_tables(
    seq_len: int, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs of ``x`` (batch, seq, heads, head_dim) by position.

    In fp32, as torchtitan's RoPE: it keeps no fp32 activation for backward (the products
    keep the tables, which need no gradient), so it costs time, not memory (docs/models.md).
    """
    x32 = x.float()  # one copy: the two strided halves below are views of it
    x1, x2 = x32[..., 0::2], x32[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.wq(x).view(b, t, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(self.wk(x).view(b, t, self.kv_heads, self.head_dim), cos, sin)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim)
        if self.kv_heads != self.n_heads:
            repeat = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.hidden, bias=False)
        self.w2 = nn.Linear(args.hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.reset_parameters()

    def init_std(self, name: str) -> float | None:
        """The std of the zero-mean normal that parameter ``name`` starts from; None: ones.

        GPT-2 style: small normal init, residual projections scaled down by depth, norm gains 1.
        ``trainer.parallel.init_sharded`` follows it shard by shard on a model built on ``meta``.
        """
        if name.endswith("norm.weight"):
            return None
        if name.endswith(("wo.weight", "w2.weight")):
            return 0.02 / math.sqrt(2 * self.args.n_layers)
        return 0.02

    def reset_parameters(self) -> None:
        """Initialise in place from torch's global RNG (a model built whole, on one device)."""
        for name, p in self.named_parameters():
            std = self.init_std(name)
            if std is None:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (batch, seq, vocab) for token ids (batch, seq)."""
        h = self.tok_embeddings(tokens)
        cos, sin = rope_tables(tokens.shape[1], self.args.head_dim, self.args.rope_theta, tokens.device)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
