"""Hugging Face ``transformers`` models on the trainer: built from a config on the ``meta``
device, sharded per repeated layer, and initialised shard by shard as the presets are.

``transformers`` builds the model (``AutoModelForCausalLM`` or
``AutoModelForSequenceClassification``, ``from_config``, SDPA attention); nothing of its
architecture is written here. What this module adds is what the trainer needs around it:

- the trainer's model contract over the HF model, which keeps its own parameter names under
  ``hf.``: :class:`CausalLMLogits` (token ids in, next-token logits out) for the causal LMs,
  :class:`ClassifierLogits` (token ids in, one row of label logits per sample out) for the
  encoder classifiers;
- the blocks FSDP2, activation checkpointing and compile apply to: the model's own repeated
  layers, the modules of the classes ``_no_split_modules`` names that sit in a ``ModuleList``;
- the initial values of each parameter, by transformers' own rule (``PreTrainedModel._init_weights``:
  linear and embedding weights N(0, ``initializer_range``), biases 0, norm weights 1), drawn by
  ``trainer.parallel.init_sharded`` shard by shard, so they do not depend on the world size;
  the buffers (rotary tables, position ids) are computed by the model's own ``_init_weights``.

Only the families in ``trainer.config.hf.HF_TASK_TYPES`` are supported; the config check
refuses any other before launch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedModel

from trainer.config.hf import HF_CLASSIFIER_TYPES, hf_config_problem


class CausalLMLogits(nn.Module):
    """``forward(token ids (batch, seq)) -> logits (batch, seq, vocab)`` over an HF causal LM,
    held as ``hf``: its parameter names are the HF model's under ``HF_PREFIX``."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.hf = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=tokens, use_cache=False).logits


class ClassifierLogits(nn.Module):
    """``forward(token ids (batch, seq)) -> logits (batch, labels)`` over an HF sequence
    classifier, held as ``hf``. A negative id is padding (``trainer.records.PADDING``): the
    model does not attend to it, and sees its config's ``pad_token_id`` there (which RoBERTa's
    positions count from)."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.hf = model
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        real = tokens >= 0
        ids = torch.where(real, tokens, torch.full_like(tokens, self.pad_id))
        return self.hf(input_ids=ids, attention_mask=real.long()).logits


HFLogits = CausalLMLogits | ClassifierLogits


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


def build_hf_model(values: Mapping[str, Any]) -> tuple[HFLogits, list[str]]:
    """The model of config ``values`` on the current default device (``meta`` to shard it
    before any memory is allocated), and its blocks' qualified names: a sequence classifier
    for an encoder family (``HF_CLASSIFIER_TYPES``), else a causal LM."""
    config = hf_config(values)
    model: HFLogits
    if values["model_type"] in HF_CLASSIFIER_TYPES:
        model = ClassifierLogits(
            AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
        )
    else:
        model = CausalLMLogits(AutoModelForCausalLM.from_config(config, attn_implementation="sdpa"))
    return model, layer_names(model)


def layer_names(model: HFLogits) -> list[str]:
    """The qualified names of the model's repeated layers, in order: the modules of the classes
    its ``_no_split_modules`` names that sit in an ``nn.ModuleList`` (BERT's embeddings are
    named there too, but are not a repeated layer)."""
    kinds = set(getattr(model.hf, "_no_split_modules", None) or ())
    in_lists = {
        id(child) for module in model.modules() if isinstance(module, nn.ModuleList) for child in module
    }
    names = [
        name
        for name, module in model.named_modules()
        if type(module).__name__ in kinds and id(module) in in_lists
    ]
    if not names:
        raise ValueError(
            f"{type(model.hf).__name__}: no module of the classes its _no_split_modules names "
            f"({sorted(kinds) or 'none'}); trainops shards a model per repeated layer"
        )
    return names


def init_rule(model: HFLogits) -> Callable[[str], float | None]:
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


def padding_rows(model: HFLogits) -> dict[str, int]:
    """Embedding rows transformers starts at zero (``padding_idx``), by parameter name."""
    return {
        f"{name}.weight": int(module.padding_idx)
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding) and module.padding_idx is not None
    }


def fill_buffers(model: nn.Module) -> None:
    """Compute the buffers (rotary tables, position ids) of an HF model by the model's own
    ``_init_weights``, on the device they were materialised on."""
    inner = model.get_submodule("hf")
    for module in inner.modules():
        if any(True for _ in module.buffers(recurse=False)):
            inner._init_weights(module)  # type: ignore[operator]


def attention_shape(model: HFLogits) -> tuple[int, int]:
    """(layers, attention width: heads x head size), for the attention term of the FLOPs."""
    config = model.hf.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return int(config.num_hidden_layers), heads * head_dim
