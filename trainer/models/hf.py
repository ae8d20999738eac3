"""Hugging Face ``transformers`` causal LMs on the trainer: built from a config on the ``meta``
device, sharded per decoder layer, and initialised shard by shard as the presets are.

``transformers`` builds the model (``AutoModelForCausalLM.from_config``, SDPA attention); nothing
of its architecture is written here. What this module adds is what the trainer needs around it:

- :class:`CausalLMLogits`, the trainer's model contract (token ids in, logits out) over the
  HF model, which keeps its own parameter names under ``hf.``;
- the blocks FSDP2, activation checkpointing and compile apply to: the model's own repeated
  layers, the modules whose class ``_no_split_modules`` names;
- the initial values of each parameter, by transformers' own rule (``PreTrainedModel._init_weights``:
  linear and embedding weights N(0, ``initializer_range``), biases 0, norm weights 1), drawn by
  ``trainer.parallel.init_sharded`` shard by shard, so they do not depend on the world size;
  the buffers (rotary tables) are computed by the model's own ``_init_weights``.

Only the families in ``trainer.config.hf.HF_CAUSAL_LM_TYPES`` are supported; the config check
refuses any other before launch. This is the first part of issue #27: a model from a config
(random initial weights). Loading an HF folder's weights, the classification and SFT tasks and
the export as an HF folder of the same class come next.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from trainer.config.hf import hf_config_problem


class CausalLMLogits(nn.Module):
    """``forward(token ids (batch, seq)) -> logits (batch, seq, vocab)`` over an HF causal LM,
    held as ``hf``: its parameter names are the HF model's under ``HF_PREFIX``."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.hf = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=tokens, use_cache=False).logits


# config.json keys that say nothing of the model's function: how it was saved (the trainer sets
# its own precision), which class and which transformers wrote it.
_NOT_SHAPE = ("model_type", "architectures", "transformers_version", "dtype", "torch_dtype")


def hf_config(values: Mapping[str, Any]):
    """The ``transformers`` config of ``values`` (a ``config.json``'s keys), refused with the
    reason when its family is not supported."""
    problem = hf_config_problem(values)
    if problem:
        raise ValueError(problem)
    keys = {k: v for k, v in values.items() if k not in _NOT_SHAPE}
    return AutoConfig.for_model(values["model_type"], **keys)


def build_hf_causal_lm(values: Mapping[str, Any]) -> tuple[CausalLMLogits, list[str]]:
    """The model of config ``values`` on the current default device (``meta`` to shard it
    before any memory is allocated), and its blocks' qualified names."""
    config = hf_config(values)
    model = CausalLMLogits(AutoModelForCausalLM.from_config(config, attn_implementation="sdpa"))
    return model, layer_names(model)


def layer_names(model: CausalLMLogits) -> list[str]:
    """The qualified names of the model's repeated layers (``_no_split_modules``), in order."""
    kinds = set(getattr(model.hf, "_no_split_modules", None) or ())
    names = [name for name, module in model.named_modules() if type(module).__name__ in kinds]
    if not names:
        raise ValueError(
            f"{type(model.hf).__name__}: no module of the classes its _no_split_modules names "
            f"({sorted(kinds) or 'none'}); trainops shards a model per repeated layer"
        )
    return names


def init_rule(model: CausalLMLogits) -> Callable[[str], float | None]:
    """Parameter name -> the std of its zero-mean normal, 0.0 for zeros, None for ones:
    transformers' ``_init_weights`` rule for the module that holds it."""
    std = float(getattr(model.hf.config, "initializer_range", None) or 0.02)
    rules: dict[str, float | None] = {}
    for module_name, module in model.named_modules():
        kind = type(module).__name__
        for param_name, _ in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            if param_name == "bias":
                rules[name] = 0.0
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                rules[name] = std
            elif "Norm" in kind and param_name == "weight":
                rules[name] = None
            else:
                raise ValueError(
                    f"{type(model.hf).__name__}: no initial value rule for {name} ({kind}); "
                    "this model family is not supported"
                )

    def rule(name: str) -> float | None:
        return rules[name]

    return rule


def padding_rows(model: CausalLMLogits) -> dict[str, int]:
    """Embedding rows transformers starts at zero (``padding_idx``), by parameter name."""
    return {
        f"{name}.weight": int(module.padding_idx)
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding) and module.padding_idx is not None
    }


def fill_buffers(model: nn.Module) -> None:
    """Compute the buffers (the rotary tables) of a :class:`CausalLMLogits` by the model's own
    ``_init_weights``, on the device they were materialised on."""
    inner = model.get_submodule("hf")
    for module in inner.modules():
        if any(True for _ in module.buffers(recurse=False)):
            inner._init_weights(module)  # type: ignore[operator]


def attention_shape(model: CausalLMLogits) -> tuple[int, int]:
    """(layers, attention width: heads x head size), for the attention term of the FLOPs."""
    config = model.hf.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return int(config.num_hidden_layers), heads * head_dim
