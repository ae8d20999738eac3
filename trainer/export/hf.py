"""Our Llama-style decoder <-> the Hugging Face ``LlamaForCausalLM`` layout (names, config, RoPE).

Pure mappings over state dicts and plain dicts; no file I/O and no ``transformers`` import.

RoPE: ``trainer.models.llama.apply_rope`` rotates interleaved channel pairs ``(2i, 2i+1)`` of each
head; HF Llama rotates ``(i, i + head_dim/2)`` ("rotate half"). Both use frequency ``i`` for
pair ``i``, so reordering the output rows of ``wq`` and ``wk`` within each head (evens first,
then odds) makes HF compute the same attention. Scores are dot products of q and k, and
both get the same reordering, so nothing else changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from trainer.presets import ModelArgs

# Module wrappers add these segments to parameter names (activation checkpointing, compile).
_WRAPPER_SEGMENTS = re.compile(r"(^|\.)(_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)(?=\.)")

_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_BLOCK_BACK = {hf: ours for ours, hf in _BLOCK.items()}
_TOP_BACK = {hf: ours for ours, hf in _TOP.items()}
_OUR_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def clean_name(name: str) -> str:
    """A parameter name without wrapper segments (``layers.0._checkpoint_wrapped_module.x`` -> ``layers.0.x``)."""
    return _WRAPPER_SEGMENTS.sub("", name).lstrip(".")


def interleaved_to_half(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder each head's output rows from pairs ``(2i, 2i+1)`` to halves ``(i, i + d/2)``."""
    rows, cols = weight.shape
    head_dim = rows // n_heads
    return weight.reshape(n_heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def half_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of :func:`interleaved_to_half`."""
    rows, cols = weight.shape
    head_dim = rows // n_heads
    return weight.reshape(n_heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def to_hf_name(raw: str) -> str:
    """The HF Llama name of one of our parameter names (wrapper segments dropped)."""
    name = clean_name(raw)
    if name in _TOP:
        return _TOP[name]
    match = _OUR_LAYER.match(name)
    if not match or match.group(2) not in _BLOCK:
        raise ValueError(
            f"parameter {raw!r} is not part of the Llama-style model; "
            f"only built-in presets export to the Hugging Face layout"
        )
    layer, rest = match.groups()
    return f"model.layers.{layer}.{_BLOCK[rest]}"


def to_hf_tensor(raw: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    """One of our tensors in HF's layout: q/k rows in HF's RoPE order, every other tensor as is."""
    name = clean_name(raw)
    if name.endswith(".attention.wq.weight"):
        return interleaved_to_half(tensor, args.n_heads)
    if name.endswith(".attention.wk.weight"):
        return interleaved_to_half(tensor, args.kv_heads)
    return tensor


def to_hf_state_dict(state_dict: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Our ``Transformer`` state dict under HF Llama names, q/k rows in HF's RoPE order."""
    return {to_hf_name(raw): to_hf_tensor(raw, tensor, args) for raw, tensor in state_dict.items()}


def from_hf_state_dict(tensors: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF Llama tensors back to our ``Transformer`` names and RoPE order."""
    out = {}
    for name, tensor in tensors.items():
        if name in _TOP_BACK:
            out[_TOP_BACK[name]] = tensor
            continue
        match = _HF_LAYER.match(name)
        if not match or match.group(2) not in _BLOCK_BACK:
            if name.endswith("rotary_emb.inv_freq"):  # older HF checkpoints store the RoPE table
                continue
            raise ValueError(
                f"tensor {name!r} is not a Llama tensor this trainer knows; "
                f"expected names like model.layers.0.self_attn.q_proj.weight"
            )
        layer, rest = match.groups()
        ours = _BLOCK_BACK[rest]
        if ours == "attention.wq.weight":
            tensor = half_to_interleaved(tensor, args.n_heads)
        elif ours == "attention.wk.weight":
            tensor = half_to_interleaved(tensor, args.kv_heads)
        out[f"layers.{layer}.{ours}"] = tensor
    return out


def hf_config(
    args: ModelArgs,
    max_position_embeddings: int,
    dtype: str = "float32",
    token_ids: Mapping[str, int | None] | None = None,
) -> dict:
    """``config.json`` for ``LlamaForCausalLM``.

    ``rope_theta`` is written both flat (transformers 4) and as ``rope_parameters`` (5).

    :param token_ids: ``bos_token_id``, ``eos_token_id`` (and ``pad_token_id``) of the tokenizer;
        without them ``LlamaConfig`` would assume Llama's own ids (1 and 2).
    """
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.hidden,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "max_position_embeddings": int(max_position_embeddings),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
        **(token_ids or {}),
    }


def args_from_hf_config(config: dict) -> ModelArgs:
    """Our ``ModelArgs`` for a Llama ``config.json`` (as :func:`hf_config` writes it)."""
    if config.get("model_type") != "llama":
        raise ValueError(f"config.json has model_type {config.get('model_type')!r}; only 'llama' loads here")
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    return ModelArgs(
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=config["num_attention_heads"],
        n_kv_heads=config.get("num_key_value_heads"),
        ffn_hidden=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        norm_eps=config["rms_norm_eps"],
        rope_theta=float(theta),
    )
