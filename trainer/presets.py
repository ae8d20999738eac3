"""Model hyper-parameters and size presets: plain data, importable without torch.

The config validates preset names against this module, and the Airflow side may size
jobs from it, so it must not import torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class ModelArgs:
    """A Llama-style decoder. Embeddings and output projection are NOT tied (as in Llama)."""

    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: as many as n_heads (no grouped-query attention)
    ffn_hidden: int = 0  # 0: 2/3 * 4 * dim rounded up to a multiple of multiple_of (Llama's rule)
    multiple_of: int = 32
    vocab_size: int = 32000  # a reference size for counting; training takes it from the dataset
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        hidden = int(2 * 4 * self.dim / 3)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model hyper-parameters {unknown}; expected some of {sorted(known)}")
        return cls(**data)

    def with_vocab(self, vocab_size: int) -> ModelArgs:
        return replace(self, vocab_size=int(vocab_size))


PRESETS: dict[str, ModelArgs] = {
    # Trains in seconds on a CPU; used by the tests.
    "tiny": ModelArgs(dim=64, n_layers=2, n_heads=4, multiple_of=32),
    # GPT-2-small sized (~134M with a 32k vocabulary, untied embeddings).
    "small": ModelArgs(dim=768, n_layers=12, n_heads=12, multiple_of=256),
    # BERT-large's size (24 layers, dim 1024, 16 heads) in Llama-style blocks: SwiGLU hidden
    # 2/3 of BERT's 4096 so the MLP keeps its parameter count (rounded up to a multiple of 64);
    # ~369M with a 32k vocabulary and untied embeddings, ~8% over BERT-large's 340M.
    "bert-large-size": ModelArgs(dim=1024, n_layers=24, n_heads=16, ffn_hidden=2752),
    # TinyLlama-1.1B's shape.
    "1b": ModelArgs(dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_hidden=5632),
    # Llama-2-7B's shape.
    "7b": ModelArgs(dim=4096, n_layers=32, n_heads=32, ffn_hidden=11008),
}


def param_count(args: ModelArgs) -> int:
    """Number of parameters of :class:`trainer.models.llama.Transformer` built from ``args``."""
    kv_dim = args.kv_heads * args.head_dim
    attention = args.dim * args.dim * 2 + args.dim * kv_dim * 2  # wq, wo, wk, wv
    feed_forward = 3 * args.dim * args.hidden  # w1, w2, w3
    norms = 2 * args.dim
    block = attention + feed_forward + norms
    embeddings = 2 * args.vocab_size * args.dim  # input embedding + untied output projection
    return args.n_layers * block + embeddings + args.dim  # + final norm


def non_embedding_params(args: ModelArgs) -> int:
    """Parameters that take part in matmuls: all but the input embedding (a lookup).

    The untied output projection is a matmul, so it counts (as in torchtitan's MFU).
    """
    return param_count(args) - args.vocab_size * args.dim


def _millions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def preset_table(vocab_size: int = ModelArgs.vocab_size) -> str:
    """The built-in presets as a text table (``python -m trainer presets``).

    Parameter counts use ``vocab_size`` (training takes the dataset's) and untied embeddings.
    """
    header = ("preset", "layers", "dim", "heads", "kv_heads", "ffn_hidden", "params")
    rows = [header]
    for name, preset in PRESETS.items():
        args = preset.with_vocab(vocab_size)
        rows.append(
            (
                name,
                str(args.n_layers),
                str(args.dim),
                str(args.n_heads),
                str(args.kv_heads),
                str(args.hidden),
                _millions(param_count(args)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=False))
        )
        for row in rows
    ]
    return "\n".join(
        [
            *lines,
            f"(parameters with a {vocab_size:,}-token vocabulary and untied embeddings; "
            f"training takes the vocabulary from the dataset)",
        ]
    )
