"""Export: consolidated weights (bf16 by default) + model config under ``<run_uri>/export``; loading models back.

A built-in preset is exported in the Hugging Face Llama layout, so
``LlamaForCausalLM.from_pretrained(folder)`` loads it as is:

- ``config.json``: a ``LlamaConfig`` (``trainer.hf.hf_config``);
- ``model.safetensors``: bf16 tensors (``export.dtype: fp32``: the trained fp32 weights bit for
  bit) under HF names, q/k rows in HF's RoPE order;
- ``model_config.json``: what rebuilds our model (``ModelArgs`` fields, or a user builder's
  ``{"builder", "vocab_size", "seq_len"}``); a user model's weights keep its own names;
- ``export.json``: step, data, run, precision, dtype, parameter count, layout.

Written at the end of ``train`` (every rank gathers one tensor at a time, rank 0 streams it
into the file: no full copy of the model on one CPU) and by the ``export`` command (a single
process, from the newest valid checkpoint). Both give the same bytes for the same checkpoint
and dtype.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.tensor import DTensor

from trainer import hf
from trainer.contract import RunLayout, checkpoint_step_of, join
from trainer.data import cache_dir
from trainer.presets import ModelArgs
from trainer.safetensors_writer import Entry, StreamWriter, ordered
from trainer.storage import Storage

if TYPE_CHECKING:
    from trainer.builder import BuiltModel
    from trainer.config import Config

log = logging.getLogger("trainer.export")

WEIGHTS = "model.safetensors"
HF_CONFIG = "config.json"
MODEL_CONFIG = "model_config.json"
INFO = "export.json"
DEFAULT_MAX_POSITIONS = 2048  # config.json's max_position_embeddings when the context is unknown


def _spec_of(model: ModelArgs | BuiltModel) -> tuple[ModelArgs | None, dict[str, Any]]:
    """(preset args or None, rebuild spec) for a ``ModelArgs`` or a ``BuiltModel``."""
    if isinstance(model, ModelArgs):
        return model, model.to_dict()
    return model.args, model.spec


EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # export.dtype -> the stored dtype


@dataclass(frozen=True)
class _Plan:
    """What the export stores: file names -> state dict keys, the file's entries, the stored dtype."""

    names: dict[str, str]
    entries: list[Entry]
    dtype: torch.dtype
    args: ModelArgs | None


def _plan(state_dict: Mapping[str, torch.Tensor], args: ModelArgs | None, dtype: str) -> _Plan:
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not one of {', '.join(EXPORT_DTYPES)}; set export.dtype")
    stored = EXPORT_DTYPES[dtype]
    names = {(hf.to_hf_name(raw) if args is not None else hf.clean_name(raw)): raw for raw in state_dict}
    entries = []
    for name, raw in names.items():
        value = state_dict[raw]  # a DTensor's shape is the full one: the header needs no gather
        entries.append(Entry(name, stored if value.is_floating_point() else value.dtype, tuple(value.shape)))
    return _Plan(names, entries, stored, args)


def write_export(
    storage: Storage,
    export_uri: str,
    state_dict: Mapping[str, torch.Tensor],
    model: ModelArgs | BuiltModel,
    *,
    step: int,
    data_uri: str,
    run_uri: str,
    precision: str,
    seq_len: int | None = None,
    dtype: str = "bf16",
) -> dict[str, Any]:
    """Write the export folder, one tensor at a time; ``model`` is the preset's ``ModelArgs`` or a ``BuiltModel``.

    ``state_dict`` may hold DTensors (a sharded model's own ``state_dict()``): each is gathered
    in turn, so every other rank calls :func:`join_export` meanwhile. At most one full tensor
    (and its HF-layout copy) is held at a time: the memory this takes is about the largest
    tensor, not the model.

    :param seq_len: the training context, ``max_position_embeddings`` in ``config.json``.
    :param dtype: ``export.dtype``: floating tensors are stored as ``bf16`` or ``fp32`` (the
        trained weights bit for bit); other dtypes are kept.
    """
    args, spec = _spec_of(model)
    plan = _plan(state_dict, args, dtype)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        path = f"{tmp}/{WEIGHTS}"
        with StreamWriter(path, plan.entries, metadata={"format": "pt"}) as writer:
            _stream(state_dict, plan, writer)
        storage.upload_file(path, join(export_uri, WEIGHTS))
    info = {
        "step": int(step),
        "data_uri": data_uri,
        "run_uri": run_uri,
        "precision": precision,
        "dtype": dtype,
        "param_count": sum(math.prod(e.shape) for e in plan.entries),
        "layout": "hf-llama" if args is not None else "state-dict",
        "model": spec.get("builder", "llama"),
    }
    if args is not None:
        storage.put_json(
            join(export_uri, HF_CONFIG),
            hf.hf_config(
                args, seq_len or DEFAULT_MAX_POSITIONS, dtype=str(plan.dtype).removeprefix("torch.")
            ),
        )
    storage.put_json(join(export_uri, MODEL_CONFIG), spec)
    storage.put_json(join(export_uri, INFO), info)
    log.info(
        "export: step %d, %s parameters (%s layout, %s), written to %s",
        step,
        f"{info['param_count']:,}",
        info["layout"],
        dtype,
        export_uri,
    )
    return info


def join_export(
    state_dict: Mapping[str, torch.Tensor], model: ModelArgs | BuiltModel, *, dtype: str = "bf16"
) -> None:
    """A rank other than the writer's part in :func:`write_export`: the same gathers, nothing kept."""
    _stream(state_dict, _plan(state_dict, _spec_of(model)[0], dtype), None)


def _stream(state_dict: Mapping[str, torch.Tensor], plan: _Plan, writer: StreamWriter | None) -> None:
    """Gather each tensor in file order and hand it to ``writer`` (None: only take part in the gathers)."""
    for entry in ordered(plan.entries):  # the same order on every rank: the gathers are collectives
        raw = plan.names[entry.name]
        full = _gathered(state_dict[raw], plan.dtype, keep=writer is not None)
        if writer is not None and full is not None:
            writer.write(entry.name, hf.to_hf_tensor(raw, full, plan.args) if plan.args is not None else full)
        del full  # before the next gather: one full tensor at a time


def _gathered(value: torch.Tensor, dtype: torch.dtype, keep: bool) -> torch.Tensor | None:
    """One state dict value as a full CPU tensor (floating ones as ``dtype``); None where not ``keep``.

    A DTensor is cast before it is gathered: the cast is elementwise, so the result is the
    same, and a bf16 export moves half the bytes. ``full_tensor()`` is a collective: every
    rank calls this for every value, in the same order.
    """
    value = value.detach()
    if value.is_floating_point():
        value = value.to(dtype)  # no copy when it already is (an fp32 export of fp32 weights)
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return value.to("cpu") if keep else None


def load_export(storage: Storage, export_uri: str) -> tuple[nn.Module, ModelArgs | None]:
    """``(model, args)`` from an export folder: an fp32 model in eval mode, ``args`` None for a user model.

    A bf16 export loads into fp32 parameters exactly (every bf16 value is an fp32 value).

    Also reads exports written before the HF layout (our own names) and plain HF Llama folders.
    """
    from trainer.builder import build_from_spec, build_preset

    if storage.head(join(export_uri, WEIGHTS)) is None:
        raise FileNotFoundError(
            f"{export_uri} holds no {WEIGHTS}; point the model URI at an export folder "
            f"(<run_uri>/export), a checkpoint (<run_uri>/checkpoints/step_<N>) or a run's "
            f"checkpoints/ prefix (the newest committed one)"
        )
    if storage.head(join(export_uri, MODEL_CONFIG)) is not None:
        built = build_from_spec(_json_object(storage, join(export_uri, MODEL_CONFIG)))
    else:
        built = build_preset(hf.args_from_hf_config(_json_object(storage, join(export_uri, HF_CONFIG))))
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        path = f"{tmp}/{WEIGHTS}"
        storage.download_file(join(export_uri, WEIGHTS), path)
        tensors = load_file(path)
    if built.args is not None and "model.embed_tokens.weight" in tensors:
        tensors = hf.from_hf_state_dict(tensors, built.args)
    built.model.load_state_dict(tensors)
    return built.model.eval(), built.args


def _json_object(storage: Storage, uri: str) -> dict[str, Any]:
    document = storage.get_json(uri)
    if not isinstance(document, dict):
        raise ValueError(f"{uri} holds {type(document).__name__} JSON, not an object; re-export the model")
    return document


def load_checkpoint_model(storage: Storage, checkpoint_uri: str) -> tuple[BuiltModel, int, dict[str, Any]]:
    """``(BuiltModel, step, marker)`` from ``.../checkpoints/step_<N>`` or ``.../checkpoints`` (newest valid).

    A single process reads the DCP shards of every rank into one unsharded fp32 model.
    """
    from trainer.builder import build_from_spec
    from trainer.checkpoint_files import checked_marker, download, find_latest, load_model_weights, local_root
    from trainer.fence import fence_of, read_latest

    uri = checkpoint_uri.rstrip("/")
    if uri.endswith("/checkpoints"):
        layout = RunLayout(uri[: -len("/checkpoints")])
        found = find_latest(storage, layout)
        if found is None:
            raise RuntimeError(
                f"no committed checkpoint under {layout.checkpoints}; "
                f"run `trainer train` first or check the URI"
            )
        step, marker = found
    else:
        named_step = checkpoint_step_of(uri)
        if named_step is None:
            raise ValueError(f"{checkpoint_uri} is not a checkpoint: expected .../checkpoints[/step_<N>]")
        layout = RunLayout(uri.rsplit("/", 2)[0])
        fence = fence_of(read_latest(storage, layout)[0])
        named, problem = checked_marker(storage, layout, named_step, fence=fence)
        if problem or named is None:
            raise RuntimeError(
                f"checkpoint {layout.checkpoint(named_step)} cannot be used: {problem}; "
                f"pick a committed one or the run's checkpoints/ prefix (the newest valid one)"
            )
        step, marker = named_step, named
    built = build_from_spec(marker["model"])
    local = download(storage, layout, step, marker, local_root(layout.run_uri, 0))
    try:
        load_model_weights(local, built.model)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return built, step, marker


def is_checkpoint_uri(uri: str) -> bool:
    """A run's ``checkpoints`` prefix or one ``checkpoints/step_<N>`` folder (else: an export)."""
    uri = uri.rstrip("/")
    return uri.endswith("/checkpoints") or (
        checkpoint_step_of(uri) is not None and uri.rsplit("/", 2)[-2] == "checkpoints"
    )


def load_model(storage: Storage, model_uri: str) -> tuple[nn.Module, ModelArgs | None]:
    """``(model, args)`` in eval mode from an export folder or a checkpoint URI (see ``is_checkpoint_uri``)."""
    if is_checkpoint_uri(model_uri):
        built, step, _ = load_checkpoint_model(storage, model_uri)
        log.info("model: %s from checkpoint step %d", built.describe(), step)
        return built.model.eval(), built.args
    return load_export(storage, model_uri)


def export_from_checkpoint(config: Config) -> dict[str, Any]:
    """The ``export`` command: newest valid checkpoint of ``config.run_uri`` -> ``<run_uri>/export``."""
    from trainer.storage import open_storage

    storage = open_storage(config.run_uri)
    layout = RunLayout(config.run_uri)
    built, step, marker = load_checkpoint_model(storage, layout.checkpoints)
    return write_export(
        storage,
        layout.export,
        built.model.state_dict(),
        built,
        step=step,
        data_uri=marker.get("data_uri", config.data_uri),
        run_uri=config.run_uri,
        precision=marker.get("precision", config.precision),
        seq_len=config.train.seq_len,
        dtype=config.export.dtype,
    )
