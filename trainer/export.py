"""Export: consolidated fp32 weights + model config under ``<run_uri>/export``; loading models back.

A built-in preset is exported in the Hugging Face Llama layout, so
``LlamaForCausalLM.from_pretrained(folder)`` loads it as is:

- ``config.json``: a ``LlamaConfig`` (``trainer.hf.hf_config``);
- ``model.safetensors``: fp32 tensors under HF names, q/k rows in HF's RoPE order;
- ``model_config.json``: what rebuilds our model (``ModelArgs`` fields, or a user builder's
  ``{"builder", "vocab_size", "seq_len"}``); a user model's weights keep its own names;
- ``export.json``: step, data, run, precision, parameter count, layout.

Written at the end of ``train`` (rank 0, from the gathered full state dict) and by the
``export`` command (a single process, from the newest valid checkpoint). Both give the
same bytes for the same checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from trainer import hf
from trainer.contract import RunLayout, checkpoint_step_of, join
from trainer.data import cache_dir
from trainer.presets import ModelArgs
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


def write_export(
    storage: Storage,
    export_uri: str,
    state_dict: dict[str, torch.Tensor],
    model: ModelArgs | BuiltModel,
    *,
    step: int,
    data_uri: str,
    run_uri: str,
    precision: str,
    seq_len: int | None = None,
) -> dict[str, Any]:
    """Write the export folder; ``model`` is the preset's ``ModelArgs`` or a ``BuiltModel``.

    ``seq_len`` (the training context) becomes ``max_position_embeddings`` in ``config.json``.
    """
    args, spec = _spec_of(model)
    tensors = {hf.clean_name(name): t.detach().to("cpu", torch.float32) for name, t in state_dict.items()}
    if args is not None:
        tensors = hf.to_hf_state_dict(tensors, args)
    tensors, seen = {name: t.contiguous() for name, t in tensors.items()}, set[int]()
    for name, t in tensors.items():  # safetensors refuses shared storage (tied weights): copy repeats
        if t.data_ptr() in seen:
            tensors[name] = t.clone()
        seen.add(t.data_ptr())
    info = {
        "step": int(step),
        "data_uri": data_uri,
        "run_uri": run_uri,
        "precision": precision,
        "param_count": sum(t.numel() for t in tensors.values()),
        "layout": "hf-llama" if args is not None else "state-dict",
        "model": spec.get("builder", "llama"),
    }
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        path = f"{tmp}/{WEIGHTS}"
        save_file(tensors, path, metadata={"format": "pt"})
        storage.upload_file(path, join(export_uri, WEIGHTS))
    if args is not None:
        storage.put_json(join(export_uri, HF_CONFIG), hf.hf_config(args, seq_len or DEFAULT_MAX_POSITIONS))
    storage.put_json(join(export_uri, MODEL_CONFIG), spec)
    storage.put_json(join(export_uri, INFO), info)
    log.info(
        "export: step %d, %s parameters (%s layout), written to %s",
        step,
        f"{info['param_count']:,}",
        info["layout"],
        export_uri,
    )
    return info


def load_export(storage: Storage, export_uri: str) -> tuple[nn.Module, ModelArgs | None]:
    """``(model, args)`` from an export folder: an fp32 model in eval mode, ``args`` None for a user model.

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
    )
