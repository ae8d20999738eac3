"""The model to train: a built-in preset, a Hugging Face config (``model.hf_config``,
``trainer.models.hf``), or a user's ``module:function`` builder.

A builder is called as ``function(vocab_size=..., seq_len=...)`` and returns
``(model, blocks)``: an ``nn.Module`` whose forward maps token ids ``(batch, seq)`` (int64)
to logits ``(batch, seq, vocab_size)``, and the list of its submodules that activation
checkpointing wraps, ``torch.compile`` compiles and FSDP2 shards one by one (usually the
repeated layers; ``trainer.parallel.parallelize``). Every rank calls it after seeding torch identically, so it must build the
same initial weights from torch's RNG. See docs/models.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainer import flops
from trainer.config import BUILDER_EXAMPLE
from trainer.config.functions import import_function
from trainer.models.llama import Transformer, count_parameters
from trainer.presets import PRESETS, ModelArgs, non_embedding_params

# A Hugging Face model's parameter names under the trainer's wrapper (trainer.models.hf: CausalLMLogits, ClassifierLogits)
HF_PREFIX = "hf."


@dataclass(frozen=True)
class MetaInit:
    """How a model built on the ``meta`` device gets its initial values, shard by shard
    (``trainer.parallel.init_sharded``): each parameter's rule by name, the buffers' filler,
    the rows that start at zero."""

    std: Callable[[str], float | None]
    fill_buffers: Callable[[nn.Module], None] | None = None
    zero_rows: Mapping[str, int] = field(default_factory=dict)


@dataclass
class BuiltModel:
    model: nn.Module
    blocks: list[nn.Module]
    block_names: list[str]  # each block's qualified name in ``model`` (e.g. "layers.0")
    args: ModelArgs | None  # the preset's hyper-parameters; None for a user or Hugging Face model
    param_count: int
    source: str  # "preset tiny" | "hf qwen2" | "builder mypkg.models:build"
    # what rebuilds it: ModelArgs fields, {"hf_config": {...}}, or {"builder", "vocab_size", "seq_len"}
    spec: dict
    # None: the model builds its own initial values (a user's builder, on every rank)
    meta_init: MetaInit | None = None
    # (layers, attention width) for the attention FLOPs of a model that is not a preset
    attention: tuple[int, int] = (0, 0)

    def describe(self) -> str:
        return f"{self.source}: {self.param_count:,} parameters, {len(self.blocks)} blocks" + (
            f", dim {self.args.dim}, vocab {self.args.vocab_size}" if self.args else ""
        )

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token; a user model counts its matmul parameters only (6 N), a
        Hugging Face one its attention too."""
        if self.args is not None:
            return flops.flops_per_token(
                non_embedding_params(self.args), self.args.n_layers, self.args.dim, seq_len
            )
        return flops.flops_per_token(matmul_params(self.model), *self.attention, seq_len)


def matmul_params(model: nn.Module) -> int:
    """Parameters outside ``nn.Embedding`` modules (lookups do no matmul work)."""
    lookups = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in lookups)


def build_model(
    preset: str,
    builder: str | None,
    vocab_size: int,
    seq_len: int,
    *,
    hf_config: Mapping[str, Any] | None = None,
) -> BuiltModel:
    """The model for a run: ``builder`` when set (``module:function``), else ``hf_config``
    when set (its own vocabulary), else ``preset``."""
    if builder:
        return build_user_model(builder, vocab_size, seq_len)
    if hf_config is not None:
        return build_hf(hf_config)
    if preset not in PRESETS:
        raise ValueError(
            f"unknown model preset {preset!r}; pick one of {', '.join(PRESETS)} or set model.builder"
        )
    return build_preset(PRESETS[preset].with_vocab(vocab_size), f"preset {preset}")


def build_preset(args: ModelArgs, source: str = "llama") -> BuiltModel:
    model = Transformer(args)
    blocks = list(model.layers)
    return BuiltModel(
        model,
        blocks,
        [f"layers.{i}" for i in range(len(blocks))],
        args,
        count_parameters(model),
        source,
        args.to_dict(),
        MetaInit(model.init_std),
    )


def build_hf(values: Mapping[str, Any]) -> BuiltModel:
    """The ``transformers`` model of config ``values`` (``model.hf_config``) on the current
    default device, sharded and initialised per ``trainer.models.hf``."""
    from trainer.models import hf  # noqa: PLC0415 (transformers: 2.7 s of imports a preset run never needs)

    model, names = hf.build_hf_model(values)
    return BuiltModel(
        model,
        [model.get_submodule(name) for name in names],
        names,
        None,
        count_parameters(model),
        f"hf {values['model_type']}",
        {"hf_config": dict(values)},
        MetaInit(hf.init_rule(model), hf.fill_buffers, hf.padding_rows(model)),
        hf.attention_shape(model),
    )


def build_from_spec(spec: dict) -> BuiltModel:
    """Rebuild the model a checkpoint marker or ``export.json`` describes (fresh weights)."""
    if "hf_config" in spec:
        return build_hf(spec["hf_config"])
    if "builder" in spec:
        return build_user_model(spec["builder"], int(spec["vocab_size"]), int(spec["seq_len"]))
    return build_preset(ModelArgs.from_dict(spec))


def load_builder(builder: str) -> Callable[..., Any]:
    """The function named by ``module:function``; errors name the string and what to fix.

    The string's form is ``trainer.config.builder_parts``' to judge, as the operator judges it
    before launch (a ``ConfigError`` naming the value)."""
    return import_function("model.builder", builder, BUILDER_EXAMPLE)


def build_user_model(builder: str, vocab_size: int, seq_len: int) -> BuiltModel:
    built = load_builder(builder)(vocab_size=vocab_size, seq_len=seq_len)
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module)):
        raise TypeError(
            f"model.builder {builder!r} returned {_kind(built)}; it must return "
            f"(model: nn.Module, blocks: list[nn.Module])"
        )
    model, blocks = built
    blocks = list(blocks) if isinstance(blocks, (list, tuple, nn.ModuleList)) else blocks
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, nn.Module) for b in blocks):
        raise TypeError(
            f"model.builder {builder!r} returned blocks {_kind(blocks)}; it must be a non-empty "
            f"list of the model's submodules (e.g. its transformer layers)"
        )
    names = block_names(model, blocks, builder)
    count = sum(p.numel() for p in model.parameters())
    result = BuiltModel(
        model,
        blocks,
        names,
        None,
        count,
        f"builder {builder}",
        {"builder": builder, "vocab_size": int(vocab_size), "seq_len": int(seq_len)},
    )
    check_forward(result, vocab_size, min(4, seq_len))
    return result


def block_names(model: nn.Module, blocks: list[nn.Module], builder: str) -> list[str]:
    """Each block's qualified name; refuses blocks outside the model, the root, repeats, nesting
    and shared parameters (FSDP2 shards each block's parameters once)."""
    by_id = {id(m): name for name, m in model.named_modules(remove_duplicate=False) if name}
    names = []
    for index, block in enumerate(blocks):
        if block is model:
            raise ValueError(
                f"model.builder {builder!r}: block {index} is the model itself; "
                f"return its repeated layers as blocks"
            )
        if id(block) not in by_id:
            raise ValueError(
                f"model.builder {builder!r}: block {index} ({type(block).__name__}) is not a "
                f"submodule of the model; register it (e.g. in an nn.ModuleList) first"
            )
        names.append(by_id[id(block)])
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"model.builder {builder!r}: block {name!r} is listed twice")
        inside = [other for other in names if other != name and other.startswith(name + ".")]
        if inside:
            raise ValueError(
                f"model.builder {builder!r}: block {inside[0]!r} lies inside block {name!r}; "
                f"blocks must not nest"
            )
    owner: dict[int, str] = {}
    for name, block in zip(names, blocks, strict=False):
        for param in block.parameters():
            if id(param) in owner:
                raise ValueError(
                    f"model.builder {builder!r}: blocks {owner[id(param)]!r} and {name!r} share "
                    f"a parameter; give each block its own weights"
                )
            owner[id(param)] = name
    return names


def check_forward(built: BuiltModel, vocab_size: int, seq_len: int = 4) -> None:
    """Run a 2 x ``seq_len`` batch through the model on CPU and check the logits' shape.

    Cheap insurance before any process group starts: a wrong contract otherwise surfaces as
    a shape error deep inside the first step on every rank. The RNG state is left untouched.
    """
    was_training = built.model.training
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        built.model.eval()
        tokens = torch.randint(0, vocab_size, (2, seq_len))
        try:
            logits = built.model(tokens)
        finally:
            built.model.train(was_training)
    expected = (2, seq_len, vocab_size)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else _kind(logits)
        raise ValueError(
            f"{built.source}: forward of token ids (2, {seq_len}) returned {got}; it must return "
            f"logits of shape (batch, seq, vocab_size) = {expected}"
        )


def _kind(value) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"
