"""Warm start (``init.from``): load a Hugging Face Llama folder into the sharded model, each rank
its own rows.

The source is a folder with ``config.json`` and either ``model.safetensors`` or shards
(``model-0000i-of-0000n.safetensors``) named by ``model.safetensors.index.json``: a promoted
version (``.../models/<name>/versions/<v>/``), a run's ``export/``, or any Llama checkpoint in
that layout, on ``file://`` or ``s3://``. The model was built on the ``meta`` device and
sharded (``trainer.train.build_sharded_model``), so every rank holds only its rows of each
parameter; it reads exactly those rows out of the safetensors files through a memory map
(``safe_open(...).get_slice``), never a whole tensor (a q/k projection: the whole heads its
rows fall in, for the RoPE reordering), so no rank ever holds the full model. A ``file://``
source is read in place; an ``s3://`` one is downloaded once per node into the node's cache
(the first rank to ask fetches it, the others wait on a lock and read the same file).

A Hugging Face model's folder (``model.hf``) is read under the model's own names; a classifier
may start from a base encoder's folder (``bert-base-uncased``), its new head from the seed
(:func:`hf_name_map`, the rule of transformers' ``from_pretrained``).

Names and the RoPE row order come from ``trainer.export.hf`` (``to_hf_name``, ``from_hf_state_dict``);
shapes and every key that changes what the weights compute (RoPE theta and scaling, the norm's
epsilon, ...) are checked with the operator's own rule (``trainer.config.hf.check_init_fit``) before
a byte of weights is read. Weights only: the optimizer, step, data cursor and schedule are the
run's own, fresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from trainer.checkpoint import node_cache
from trainer.config import Config, ConfigError, check_init_model, init_source, model_label, pin_hf_config
from trainer.config.hf import check_hf_init_fit, check_init_fit
from trainer.contract import TASK_CLASSIFICATION, join
from trainer.data import cache_dir
from trainer.export import hf
from trainer.export.folder import HF_CONFIG, WEIGHTS, WEIGHTS_INDEX, weight_map
from trainer.models.builder import HF_PREFIX
from trainer.parallel import plain_name
from trainer.presets import ModelArgs
from trainer.storage import NotFound, Storage, open_storage

log = logging.getLogger("trainer.warm_start")


class WarmStartError(RuntimeError):
    """The ``init.from`` folder cannot be read as a Hugging Face Llama folder; the message says why."""


@dataclass(frozen=True)
class Source:
    """An ``init.from`` folder: its ``config.json`` and which file holds each tensor."""

    uri: str
    config: dict[str, Any]
    files: dict[str, str]  # HF tensor name -> file name in the folder


def read_source(storage: Storage, uri: str, key: str = "init.from") -> Source:
    """The folder at ``uri``: its ``config.json`` and the file of every tensor (from
    ``model.safetensors.index.json`` when there is one, else all in ``model.safetensors``).

    :param key: the config key that names the folder (``init.from``, ``model.hf``), for errors.
    """
    what = (
        "a Hugging Face Llama folder (a promoted version, a run's export/)"
        if key == "init.from"
        else ("a Hugging Face model folder (config.json, safetensors weights, tokenizer files)")
    )
    try:
        config = storage.get_json(join(uri, HF_CONFIG))
    except NotFound:
        raise WarmStartError(f"{key}={uri!r} holds no {HF_CONFIG}; point {key} at {what}") from None
    if not isinstance(config, dict):
        raise WarmStartError(f"{join(uri, HF_CONFIG)} is not a JSON object; re-export the source model")
    try:
        files = weight_map(storage, uri)
    except ValueError as exc:
        raise WarmStartError(f"{exc} ({key}={uri!r})") from None
    if files is not None:
        return Source(uri, config, files)
    if storage.head(join(uri, WEIGHTS)) is None:
        raise WarmStartError(
            f"{key}={uri!r} holds neither {WEIGHTS} nor {WEIGHTS_INDEX}; point {key} at a folder with the weights"
        )
    return Source(uri, config, {})  # one file: names are read from its header


def pinned_hf_config(config: Config) -> Config:
    """``config`` with the ``model.hf`` folder's ``config.json`` pinned (``trainer.config.pin_hf_config``:
    refused when it changed since the operator pinned it); ``config`` itself without ``model.hf``."""
    if not config.model.hf:
        return config
    uri = config.model.hf
    return pin_hf_config(config, read_source(open_storage(uri), uri, "model.hf").config)


def local_file(storage: Storage, uri: str) -> Path:
    """A local path holding the object at ``uri``: the file itself on ``file://``, else the
    node's cached copy, fetched once per node by the first rank that asks
    (``trainer.checkpoint.node_cache``, keyed by the object's URI, size and etag, so a changed object is
    fetched again; a Hugging Face folder records no checksum, so its size is what is verified)."""
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    head = storage.head(uri)
    if head is None:
        raise WarmStartError(f"{uri} does not exist; the init.from folder changed while it was read")
    key = hashlib.sha256(f"{uri}\n{head.get('size')}\n{head.get('etag')}".encode()).hexdigest()[:24]
    path = cache_dir() / "warm-start" / key / uri.rsplit("/", 1)[-1]
    try:
        node_cache.fetch(storage, uri, path, sha256=None, size=head.get("size"))
    except node_cache.Mismatch as exc:
        raise WarmStartError(
            f"{uri} changed while it was fetched ({exc.size} bytes, {head['size']} listed); retry"
        ) from None
    return path


def _shard(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's local rows of ``param`` and the index of the first of them in the full tensor."""

    if isinstance(param, DTensor):
        _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        return param.to_local(), (offset[0] if offset else 0)
    return param.data, 0


def _rows(handle: Any, hf_name: str, ours: str, lo: int, hi: int, args: ModelArgs) -> torch.Tensor:
    """Rows ``lo:hi`` of our tensor ``ours``, read from the file's HF tensor ``hf_name``: for a
    q/k projection, the whole heads the rows fall in, reordered by ``trainer.export.hf``, then cut."""
    part = handle.get_slice(hf_name)
    if not ours.endswith((".attention.wq.weight", ".attention.wk.weight")):
        return part[lo:hi]
    head_dim = args.head_dim
    first, last = lo // head_dim, -(-hi // head_dim)
    heads = last - first
    block = part[first * head_dim : last * head_dim]
    converted = hf.from_hf_state_dict(
        {hf_name: block}, dataclasses.replace(args, n_heads=heads, n_kv_heads=heads)
    )
    start = first * head_dim
    return converted[ours][lo - start : hi - start]


@torch.no_grad()
def load_into(model: nn.Module, args: ModelArgs, source: Source, storage: Storage) -> int:
    """Fill this rank's shards of every parameter of ``model`` (built from ``args``) from
    ``source``; the number of tensors read. Every parameter must be in the source with the
    model's shape (WarmStartError naming the tensor otherwise)."""

    check_init_fit(args, source.config, source.uri)
    wanted = {hf.to_hf_name(plain_name(raw)): (raw, param) for raw, param in model.named_parameters()}
    return _fill(
        wanted,
        source,
        storage,
        lambda handle, name, raw, lo, hi: _rows(handle, name, plain_name(raw), lo, hi, args),
        "init.from",
        "a complete Llama folder of the run's shape",
    )


@dataclass(frozen=True)
class NameMap:
    """How a Hugging Face folder's tensors meet the model's parameters (:func:`hf_name_map`)."""

    source: dict[str, str]  # the model's parameter name -> the folder's tensor that fills it
    fresh: list[str]  # the task's new head, absent from the folder: kept as the seed made it
    unused: list[str]  # the folder's tensors no parameter takes (a pre-training head)


def hf_name_map(wanted: Iterable[str], present: Iterable[str], base_prefix: str, new_head: bool) -> NameMap:
    """Which of the folder's tensors (``present``) fills each of the model's parameters
    (``wanted``, the Hugging Face model's own names), by the rule transformers' ``from_pretrained``
    follows: the same name; else, for a parameter of the base model (under ``base_prefix``, the
    class's ``base_model_prefix``: ``bert``, ``roberta``), the name without it, as a base model
    (``BertModel``) saves it. The folder's other tensors (a pre-training head: ``cls.*``,
    ``lm_head.*``) are unused.

    With ``new_head`` (a classifier from a base encoder's folder), two parts of the model may be
    new: the task's head (every parameter outside the base model) and the base model's pooler
    (``<base>.pooler.*``, which a masked-LM checkpoint leaves out). Each is ``fresh``, kept as
    initialised from the seed, when the folder holds none of it; a part the folder holds only
    some of is not new, and the rest of it is missing. A parameter neither filled nor fresh is
    missing (in neither list): the caller refuses the folder, naming it. Pure.
    """
    have = set(present)
    prefix = f"{base_prefix}." if base_prefix else ""
    source: dict[str, str] = {}
    parts: dict[str, list[str]] = {}  # the parts that may be new -> their parameters
    for name in wanted:
        if name in have:
            source[name] = name
        elif prefix and name.startswith(prefix) and name[len(prefix) :] in have:
            source[name] = name[len(prefix) :]
        if not prefix:
            continue
        if not name.startswith(prefix):
            parts.setdefault("head", []).append(name)
        elif name.startswith(f"{prefix}pooler."):
            parts.setdefault("pooler", []).append(name)
    filled = set(source)
    fresh = [n for names in parts.values() if not filled & set(names) for n in names] if new_head else []
    return NameMap(source, sorted(fresh), sorted(have - set(source.values())))


def _folder_tensors(source: Source, storage: Storage) -> list[str]:
    """Every tensor name of the folder: its index's, or its one weights file's."""
    if source.files:
        return list(source.files)
    with safe_open(str(local_file(storage, join(source.uri, WEIGHTS))), framework="pt") as handle:
        return list(handle.keys())


def _listed(names: list[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


@torch.no_grad()
def load_hf_into(
    model: nn.Module, source: Source, storage: Storage, key: str = "model.hf", new_head: bool = False
) -> int:
    """Fill this rank's shards of every parameter of a Hugging Face model (``model.hf``'s, or a
    ``model.hf_config`` one warm-started from ``init.from``) from the folder, its names met as
    :func:`hf_name_map` says; the number of tensors read. A tied LM head is one parameter (the
    embedding), so a folder without it loads.

    :param key: the config key that names the folder, for errors.
    :param new_head: a classifier may start from a base encoder's folder (``bert-base-uncased``:
        a ``BertForMaskedLM``), its new head from the seed; the log names both sides."""
    wanted = {
        plain_name(raw).removeprefix(HF_PREFIX): (raw, param) for raw, param in model.named_parameters()
    }
    base = str(getattr(getattr(model, "hf", None), "base_model_prefix", "") or "")
    names = hf_name_map(wanted, _folder_tensors(source, storage), base, new_head)
    if names.fresh:
        log.info(
            "%s: %s holds a base encoder without this task's head: %s start from the seed "
            "(the model's own initialisation), as transformers' from_pretrained starts them",
            key,
            source.uri,
            _listed(names.fresh),
        )
    if names.unused and names.source:
        log.info(
            "%s: %d tensor(s) of the folder unused (not this model's): %s",
            key,
            len(names.unused),
            _listed(names.unused),
        )
    fresh = set(names.fresh)
    by_source = {names.source.get(name, name): wanted[name] for name in wanted if name not in fresh}
    return _fill(
        by_source,
        source,
        storage,
        lambda handle, name, raw, lo, hi: handle.get_slice(name)[lo:hi],
        key,
        "a complete folder of the model its config.json describes"
        + (", or of its base encoder (a BertModel, a BertForMaskedLM)" if new_head else ""),
    )


RowReader = Callable[[Any, str, str, int, int], torch.Tensor]


def _fill(
    wanted: Mapping[str, tuple[str, torch.Tensor]],
    source: Source,
    storage: Storage,
    rows_of: RowReader,
    key: str,
    complete: str,
) -> int:
    """Copy rows ``lo:hi`` of each source tensor (``rows_of(handle, source name, our raw name,
    lo, hi)``) into this rank's shard of the parameter ``wanted`` maps it to; one weight file
    open at a time."""
    files = source.files or dict.fromkeys(wanted, WEIGHTS)
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise WarmStartError(
            f"{key}={source.uri!r} lacks {len(missing)} tensor(s) the model needs, such as {missing[0]!r}; "
            f"point {key} at {complete}"
        )
    by_file: dict[str, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    for file_name, names in sorted(by_file.items()):
        path = local_file(storage, join(source.uri, file_name))
        with safe_open(str(path), framework="pt") as handle:
            present = set(handle.keys())
            for name in names:
                raw, param = wanted[name]
                if name not in present:
                    raise WarmStartError(
                        f"{join(source.uri, file_name)} holds no tensor {name!r}; re-export the source"
                    )
                shape = tuple(handle.get_slice(name).get_shape())
                if shape != tuple(param.shape):
                    fix = (
                        "pick a source of the run's shape or init.from=none"
                        if key == "init.from"
                        else (f"point {key} at {complete}")
                    )
                    raise WarmStartError(
                        f"tensor {name!r} of {key}={source.uri!r} has shape {shape}, the run's model "
                        f"{tuple(param.shape)}; {fix}"
                    )
                local, lo = _shard(param)
                if local.numel():
                    rows = local.shape[0] if local.dim() else 1
                    local.copy_(rows_of(handle, name, raw, lo, lo + rows).view_as(local))
    return len(wanted)


def warm_start(config: Config, model: nn.Module, args: ModelArgs | None) -> str | None:
    """Load ``init.from`` into ``model`` (a fresh run: the caller skips this on resume); the
    source URI, or None for ``init.from: none``. ``production`` and ``auto`` never reach the
    trainer from the operator, which resolves them: here they are a configuration error."""
    value = config.init.from_
    if config.model.hf_config is not None and init_source(value) == "uri":
        # a Hugging Face model from a version of itself (its production): the folder's weights
        check_init_model(config, value)
        storage = open_storage(value)
        source = read_source(storage, value)
        check_hf_init_fit(config.model.hf_config, source.config, value)
        count = load_hf_into(model, source, storage, "init.from")
        log.info("warm start: %d tensors from %s (weights only: fresh optimizer, step 0)", count, value)
        return value
    if config.model.hf:  # the folder is the model and its initial weights
        uri = config.model.hf
        storage = open_storage(uri)
        new_head = config.task.kind == TASK_CLASSIFICATION
        count = load_hf_into(model, read_source(storage, uri, "model.hf"), storage, new_head=new_head)
        log.info("model.hf: %d tensors from %s (weights only: fresh optimizer, step 0)", count, uri)
        return uri
    value = config.init.from_
    kind = init_source(value)
    if kind == "none":
        return None
    if kind == "production":
        raise ConfigError(
            f"init.from={value!r} is resolved by the Airflow operator (FSDPTrainingOperator with model_name) "
            "into a version URI; outside it, set init.from to the version's URI "
            "(<root>/models/<name>/versions/<v>/) or none"
        )
    check_init_model(config, value)
    if args is None:
        raise ConfigError(f"init.from={value!r}: {model_label(config)} has no preset shape to load into")
    storage = open_storage(value)
    count = load_into(model, args, read_source(storage, value), storage)
    log.info("warm start: %d tensors from %s (weights only: fresh optimizer, step 0)", count, value)
    return value
