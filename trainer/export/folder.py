"""Export: consolidated weights (bf16 by default), model config and tokenizer under ``<run_uri>/export``.

A built-in preset is exported in the Hugging Face Llama layout, so
``AutoModelForCausalLM.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)``
load it as is (docs/promotion.md, "Serving a promoted version"):

- ``config.json``: a ``LlamaConfig`` (``trainer.export.hf.hf_config``) with the tokenizer's
  ``bos_token_id`` / ``eos_token_id`` (and ``pad_token_id`` when it has one);
- ``generation_config.json``: the same ids, ``max_length`` the trained context;
- ``model.safetensors``: bf16 tensors (``export.dtype: fp32``: the trained fp32 weights bit for
  bit) under HF names, q/k rows in HF's RoPE order; above ``export.max_shard_bytes`` (5 GiB)
  ``model-0000i-of-0000N.safetensors`` files with ``model.safetensors.index.json``, as HF shards;
- the tokenizer the dataset was staged with (``trainer.export.tokenizer_files``): ``tokenizer.json``,
  ``tokenizer_config.json`` (and ``special_tokens_map.json``), found through the manifest at
  ``data_uri``;
- ``model_config.json``: what rebuilds our model (``ModelArgs`` fields, or a user builder's
  ``{"builder", "vocab_size", "seq_len"}``); a user model's weights keep its own names;
- ``export.json``: step, data, run, precision, dtype, parameter count, layout, weight files.

Written at the end of ``train`` (every rank gathers one tensor at a time, rank 0 streams it
into the file: no full copy of the model on one CPU, and one weight file on the local disk at a
time) and by the ``export`` command (a single process, from the newest valid checkpoint). Both
give the same bytes for the same checkpoint, dtype and size limit.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.checkpoint.fence import fence_of, read_latest
from trainer.checkpoint.files import checked_marker, download, find_latest, load_model_weights, local_root
from trainer.contract import RunLayout, checkpoint_step_of, join
from trainer.data import cache_dir, read_manifest
from trainer.export import hf
from trainer.export.safetensors_writer import INDEX_FILE, SINGLE_FILE, Entry, ShardedWriter, ordered
from trainer.export.tokenizer_files import (
    GENERATION_CONFIG,
    TokenizerFiles,
    generation_config,
    tokenizer_files,
)
from trainer.models.builder import HF_PREFIX, BuiltModel, build_from_spec, build_preset
from trainer.parallel import tied_parameters
from trainer.presets import ModelArgs
from trainer.storage import NotFound, Storage, open_storage

if TYPE_CHECKING:
    from trainer.config import Config

log = logging.getLogger("trainer.export")

WEIGHTS = SINGLE_FILE
WEIGHTS_INDEX = INDEX_FILE
HF_CONFIG = "config.json"
MODEL_CONFIG = "model_config.json"
INFO = "export.json"
DEFAULT_MAX_POSITIONS = 2048  # config.json's max_position_embeddings when the context is unknown
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # export.max_shard_bytes: HF's own default shard size
# A weight file of an earlier export in this folder (removed when this one does not write it).
_WEIGHT_FILE = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?$")


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


def _is_hf(spec: Mapping[str, Any]) -> bool:
    """Whether ``spec`` rebuilds a Hugging Face model (``model.hf_config``): its export is a
    folder of its own class, under its own names."""
    return "hf_config" in spec


def stored_name(raw: str, args: ModelArgs | None, spec: Mapping[str, Any]) -> str:
    """A state dict key's name in the export: HF Llama's for a preset, the HF model's own for a
    ``model.hf_config`` model (without the trainer's ``hf.`` wrapper), a user model's own."""
    if args is not None:
        return hf.to_hf_name(raw)
    name = hf.clean_name(raw)
    return name.removeprefix(HF_PREFIX) if _is_hf(spec) else name


def _plan(state_dict: Mapping[str, torch.Tensor], model: ModelArgs | BuiltModel, dtype: str) -> _Plan:
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not one of {', '.join(EXPORT_DTYPES)}; set export.dtype")
    stored = EXPORT_DTYPES[dtype]
    args, spec = _spec_of(model)
    # A tied weight (an LM head sharing the embedding) is stored once, under its first name, as
    # transformers saves it; loading ties it again.
    aliases = set() if isinstance(model, ModelArgs) else set(tied_parameters(model.model))
    names = {stored_name(raw, args, spec): raw for raw in state_dict if raw not in aliases}
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
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    tokenizer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the export folder, one tensor at a time; ``model`` is the preset's ``ModelArgs`` or a ``BuiltModel``.

    ``state_dict`` may hold DTensors (a sharded model's own ``state_dict()``): each is gathered
    in turn, so every other rank calls :func:`join_export` meanwhile. At most one full tensor
    (and its HF-layout copy) is held at a time: the memory this takes is about the largest
    tensor, not the model.

    :param seq_len: the training context, ``max_position_embeddings`` in ``config.json``.
    :param dtype: ``export.dtype``: floating tensors are stored as ``bf16`` or ``fp32`` (the
        trained weights bit for bit); other dtypes are kept.
    :param max_shard_bytes: ``export.max_shard_bytes``: above it the weights are split into
        several files with an index; at or below it they are one ``model.safetensors``.
    :param tokenizer: the manifest's tokenizer spec; by default read from ``data_uri``'s manifest.
        Weights made outside a run (``data_uri`` empty, no ``tokenizer``) are exported without
        tokenizer files or token ids: there is no dataset to say how text was tokenized.
    """
    args, spec = _spec_of(model)
    plan = _plan(state_dict, model, dtype)
    context = int(seq_len or DEFAULT_MAX_POSITIONS)
    # The tokenizer first: a missing or changed tokenizer fails before the weights are gathered.
    tokens = _tokenizer_files(data_uri, tokenizer, context) if data_uri or tokenizer is not None else None
    if tokens is None:
        log.warning("export: no data_uri, so no tokenizer files and no token ids in config.json")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:

        def upload(path: str, name: str) -> None:
            storage.upload_file(path, join(export_uri, name), move=True)

        with ShardedWriter(
            tmp, plan.entries, max_shard_bytes, metadata={"format": "pt"}, done=upload
        ) as writer:
            _stream(state_dict, plan, writer)
    if writer.index is not None:
        storage.put_json(join(export_uri, WEIGHTS_INDEX), writer.index)
    _remove_stale_weights(
        storage, export_uri, keep={*writer.names, *([WEIGHTS_INDEX] if writer.index else [])}
    )
    info = {
        "step": int(step),
        "data_uri": data_uri,
        "run_uri": run_uri,
        "precision": precision,
        "dtype": dtype,
        "param_count": sum(math.prod(e.shape) for e in plan.entries),
        "layout": "hf-llama" if args is not None else "hf" if _is_hf(spec) else "state-dict",
        "model": spec["hf_config"]["model_type"] if _is_hf(spec) else spec.get("builder", "llama"),
        "weight_files": list(writer.names),
        # what a warm start from this export checks the new dataset's tokenizer against
        **({"tokenizer": tokens.spec} if tokens else {}),
    }
    for name, data in (tokens.files if tokens else {}).items():
        storage.put(join(export_uri, name), data)
    stored = str(plan.dtype).removeprefix("torch.")
    token_ids = tokens.ids.fields() if tokens else None
    if args is not None:
        storage.put_json(
            join(export_uri, HF_CONFIG), hf.hf_config(args, context, dtype=stored, token_ids=token_ids)
        )
    elif _is_hf(spec) and not isinstance(model, ModelArgs):
        storage.put_json(join(export_uri, HF_CONFIG), _hf_model_config(model, stored, token_ids))
    if (args is not None or _is_hf(spec)) and tokens is not None:
        storage.put_json(join(export_uri, GENERATION_CONFIG), generation_config(tokens.ids, context))
    storage.put_json(join(export_uri, MODEL_CONFIG), spec)
    storage.put_json(join(export_uri, INFO), info)
    log.info(
        "export: step %d, %s parameters (%s layout, %s, %d weight file(s)), written to %s",
        step,
        f"{info['param_count']:,}",
        info["layout"],
        dtype,
        len(writer.names),
        export_uri,
    )
    return info


def _hf_model_config(
    built: BuiltModel, dtype: str, token_ids: Mapping[str, int | None] | None
) -> dict[str, Any]:
    """``config.json`` of a ``model.hf_config`` model: its transformers config, every default
    spelt out, its class, the stored dtype and the dataset tokenizer's special ids."""
    model = built.model.get_submodule(HF_PREFIX.rstrip("."))
    values = dict(getattr(model, "config").to_dict())  # noqa: B009 (a PreTrainedModel, typed as a Module here)
    values.update({"architectures": [type(model).__name__], "dtype": dtype, **(token_ids or {})})
    return values


def _tokenizer_files(data_uri: str, tokenizer: Mapping[str, Any] | None, context: int) -> TokenizerFiles:
    """The tokenizer files for ``tokenizer`` or, by default, for the manifest at ``data_uri``."""
    if tokenizer is None:
        tokenizer = read_manifest(open_storage(data_uri), data_uri).get("tokenizer") or {}

    def read(uri: str) -> bytes | None:
        try:
            return open_storage(uri).get(uri)
        except NotFound:
            return None

    return tokenizer_files(tokenizer, context, read)


def _remove_stale_weights(storage: Storage, export_uri: str, keep: set[str]) -> None:
    """Delete weight files an earlier export left here that this one did not write (other sharding)."""
    base = export_uri.rstrip("/")
    for uri in storage.list(base):
        name = uri[len(base) + 1 :]
        if _WEIGHT_FILE.match(name) and name not in keep:
            storage.delete(uri)


def join_export(
    state_dict: Mapping[str, torch.Tensor], model: ModelArgs | BuiltModel, *, dtype: str = "bf16"
) -> None:
    """A rank other than the writer's part in :func:`write_export`: the same gathers, nothing kept."""
    _stream(state_dict, _plan(state_dict, model, dtype), None)


def _stream(state_dict: Mapping[str, torch.Tensor], plan: _Plan, writer: ShardedWriter | None) -> None:
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

    A bf16 export loads into fp32 parameters exactly (every bf16 value is an fp32 value). The
    weights may be one ``model.safetensors`` or files listed by ``model.safetensors.index.json``.

    Also reads exports written before the HF layout (our own names) and plain HF Llama folders.
    """
    files = weight_files(storage, export_uri)
    if storage.head(join(export_uri, MODEL_CONFIG)) is not None:
        built = build_from_spec(_json_object(storage, join(export_uri, MODEL_CONFIG)))
    else:
        built = build_preset(hf.args_from_hf_config(_json_object(storage, join(export_uri, HF_CONFIG))))
    tensors: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        for name in files:  # one file on the local disk at a time
            path = os.path.join(tmp, name)
            storage.download_file(join(export_uri, name), path)
            tensors.update(load_file(path))
            os.remove(path)
    if built.args is not None and "model.embed_tokens.weight" in tensors:
        tensors = hf.from_hf_state_dict(tensors, built.args)
    if _is_hf(built.spec):
        tensors = {HF_PREFIX + name: value for name, value in tensors.items()}
    load_weights(built.model, tensors, export_uri)
    return built.model.eval(), built.args


def load_weights(model: nn.Module, tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """Every parameter and buffer of ``model`` from ``tensors`` (names as built); a tied
    weight stored once under its first name is tied again. Errors name what differs."""
    aliases = tied_parameters(model)
    missing, unexpected = model.load_state_dict(dict(tensors), strict=False)
    missing = [name for name in missing if name not in aliases]
    if missing or unexpected:
        raise ValueError(
            f"{source}: the weights do not fit the model: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; export the model again from its run"
        )


def weight_map(storage: Storage, folder_uri: str) -> dict[str, str] | None:
    """A sharded folder's tensor name -> file name (its ``model.safetensors.index.json``); None
    when the folder has no index (its weights are one ``model.safetensors``). Raises
    ``ValueError`` for an index without a ``weight_map``."""
    index_uri = join(folder_uri, WEIGHTS_INDEX)
    try:
        document = storage.get_json(index_uri)
    except NotFound:
        return None
    mapping = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(mapping, dict) or not mapping:
        raise ValueError(f"{index_uri} has no weight_map of tensor names to files; re-export the model")
    return {str(k): str(v) for k, v in mapping.items()}


def weight_files(storage: Storage, export_uri: str) -> list[str]:
    """The weight files of an export folder: the index's files when sharded, else ``model.safetensors``."""
    mapping = weight_map(storage, export_uri)
    if mapping is not None:
        return sorted(set(mapping.values()))
    if storage.head(join(export_uri, WEIGHTS)) is None:
        raise FileNotFoundError(
            f"{export_uri} holds no {WEIGHTS} (nor {WEIGHTS_INDEX}); point the model URI at an export "
            f"folder (<run_uri>/export), a checkpoint (<run_uri>/checkpoints/step_<N>) or a run's "
            f"checkpoints/ prefix (the newest committed one)"
        )
    return [WEIGHTS]


def _json_object(storage: Storage, uri: str) -> dict[str, Any]:
    document = storage.get_json(uri)
    if not isinstance(document, dict):
        raise ValueError(f"{uri} holds {type(document).__name__} JSON, not an object; re-export the model")
    return document


def load_checkpoint_model(storage: Storage, checkpoint_uri: str) -> tuple[BuiltModel, int, dict[str, Any]]:
    """``(BuiltModel, step, marker)`` from ``.../checkpoints/step_<N>`` or ``.../checkpoints`` (newest valid).

    A single process reads the DCP shards of every rank into one unsharded fp32 model.
    """

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


def export_from_checkpoint(
    config: Config, checkpoint_uri: str | None = None, export_uri: str | None = None
) -> dict[str, Any]:
    """The ``export`` command: newest valid checkpoint of ``config.run_uri`` -> ``<run_uri>/export``.

    :param checkpoint_uri: one ``.../checkpoints/step_<N>`` instead (mid-run evaluation's).
    :param export_uri: where to write it instead of ``<run_uri>/export``."""
    storage = open_storage(config.run_uri)
    layout = RunLayout(config.run_uri)
    built, step, marker = load_checkpoint_model(storage, checkpoint_uri or layout.checkpoints)
    target = export_uri or layout.export
    return write_export(
        open_storage(target),
        target,
        built.model.state_dict(),
        built,
        step=step,
        data_uri=marker.get("data_uri", config.data_uri),
        run_uri=config.run_uri,
        precision=marker.get("precision", config.precision),
        seq_len=config.train.seq_len,
        dtype=config.export.dtype,
        max_shard_bytes=config.export.max_shard_bytes,
    )
