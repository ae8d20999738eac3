"""Warm start before launch: resolve ``init.from`` into the URI of a folder, and check that the
folder can start the run (docs/trainer.md, "Warm start").

``production`` is the current production version of the operator's ``model_name`` (its
pointer, ``trainops.registry.pointer``); ``auto`` is the same, or ``none`` while the model has
no production version (or the operator no ``model_name``). A retried task keeps the folder its run resolved first (in the run's
``config.yaml``): production may have moved since, and the run's checkpoints and its card's
lineage belong to the first. Then the folder's ``config.json`` must describe the run's model
(``trainer.config.hf.check_init_fit``, the trainer's own rule: architecture, every dimension, the
vocabulary, and every key that changes what the weights compute: RoPE theta and scaling, the
norm's epsilon, the activation, biases, tied embeddings, a sliding window), and the
tokenizer the folder was trained with (its ``export.json``'s, else its dataset's manifest's)
must be the run's dataset's. Each mismatch is a ValueError naming both sides, raised before
anything is written or launched.

:func:`resolve` and :func:`check_tokenizer` are pure; :func:`prepare` does the reading.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import yaml

from trainer.config import (
    INIT_AUTO,
    INIT_NONE,
    INIT_PRODUCTION,
    ConfigError,
    check_init_model,
    init_source,
    pin_hf_config,
    pin_labels,
)
from trainer.config.hf import check_hf_init_fit, check_init_fit
from trainer.contract import MANIFEST_NAME, join, task_labels
from trainer.presets import PRESETS
from trainer.storage import NotFound
from trainops.registry.pointer import read_production
from trainops.settings import resolve_storage_root

if TYPE_CHECKING:
    from trainer.config import Config
    from trainer.storage import Storage
    from trainops.registry.pointer import Pointer

log = logging.getLogger(__name__)

EXPORT_INFO = "export.json"


def resolve(
    value: str, *, model_name: str | None, pointer: Pointer | None, earlier: str | None
) -> tuple[str, str]:
    """``(init.from for the trainer, what to log)`` for the user's ``value``: ``none`` or a URI.

    :param pointer: the production pointer of ``model_name`` (None: never promoted).
    :param earlier: the URI this run resolved ``production``/``auto`` to on an earlier try, if any.
    """
    kind = init_source(value)
    if kind == INIT_NONE:
        return INIT_NONE, "init.from=none: training from random weights"
    if kind == "uri":
        return value, f"warm start from {value}"
    if earlier:
        return earlier, f"warm start from {earlier}, as this run's first try resolved init.from={value}"
    if not model_name and value == INIT_AUTO:
        return (
            INIT_NONE,
            "init.from=auto: the training operator has no model_name, training from random weights",
        )
    if not model_name:
        raise ValueError(
            f"init.from={value!r} is the production version of the model being trained, but the training "
            "operator has no model_name: pass model_name (the promote task's), or set init.from to a URI or none"
        )
    if pointer is None:
        if value == INIT_AUTO:
            return (
                INIT_NONE,
                f"init.from=auto: {model_name!r} has no production version yet, training from random weights",
            )
        raise ValueError(
            f"init.from={INIT_PRODUCTION} but model {model_name!r} has no production version yet; "
            "set init.from=auto (none until one exists) or none"
        )
    uri = pointer["uri"]
    return uri, f"init.from={value}: warm start from {model_name!r} production v{pointer['version']} ({uri})"


def check_tokenizer(
    source: Mapping[str, Any] | None, dataset: Mapping[str, Any], *, source_uri: str, data_uri: str
) -> str | None:
    """ValueError when the tokenizer the source was trained with is not the dataset's; a warning
    to log when the source records none (only shapes and vocabulary are then checked)."""
    if source is None:
        return (
            f"init.from={source_uri!r} records no tokenizer (no export.json with one, no dataset manifest): "
            f"only its shapes and vocabulary were checked against {data_uri!r}"
        )
    if dict(source) != dict(dataset):
        raise ValueError(
            f"init.from={source_uri!r} was trained with tokenizer {dict(source)!r}, but dataset {data_uri!r} "
            f"is tokenized with {dict(dataset)!r}; re-stage the data with the source's tokenizer, warm start "
            "from a model trained on this tokenizer, or set init.from=none"
        )
    return None


def source_tokenizer(storage_of: Callable[[str], Storage], source_uri: str) -> dict[str, Any] | None:
    """The tokenizer spec the folder at ``source_uri`` was trained with: its ``export.json``'s
    ``tokenizer``, else the ``tokenizer`` of the manifest of its ``data_uri``; None when neither
    can be read."""
    try:
        info = storage_of(source_uri).get_json(join(source_uri, EXPORT_INFO))
    except (NotFound, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    if isinstance(info.get("tokenizer"), dict):
        return dict(info["tokenizer"])
    data_uri = info.get("data_uri")
    if not isinstance(data_uri, str) or "://" not in data_uri:
        return None
    try:
        manifest = storage_of(data_uri).get_json(join(data_uri, MANIFEST_NAME))
    except (NotFound, ValueError):
        return None
    tokenizer = manifest.get("tokenizer") if isinstance(manifest, dict) else None
    return dict(tokenizer) if isinstance(tokenizer, dict) else None


def prepare(
    config: Config,
    manifest: Mapping[str, Any],
    *,
    model_name: str | None,
    storage_root: str | None,
    store: Storage,
    config_uri: str,
    storage_of: Callable[[str], Storage],
) -> Config:
    """``config`` with ``init.from`` resolved (:func:`resolve`) and checked against the folder and
    the dataset's ``manifest``, before launch; ValueError naming both sides of a mismatch.

    :param storage_root: the operator's ``storage_root`` (None: the default root).
    :param store: the operator's storage (the root's), where the pointer and ``config_uri`` (the
        run's ``config.yaml``, from an earlier try) live.
    :param storage_of: the storage client for another URI (the source folder's, its dataset's).
    """
    value = config.init.from_
    pointer, earlier = None, None
    if init_source(value) == "production":
        earlier = _earlier_source(store, config_uri)
        if not earlier and model_name:
            pointer = read_production(store, resolve_storage_root(storage_root), model_name)
    resolved, message = resolve(value, model_name=model_name, pointer=pointer, earlier=earlier)
    log.info("%s", message)
    config.init.from_ = resolved
    if resolved == INIT_NONE:
        return config
    check_init_model(config, resolved)
    try:
        source_config = storage_of(resolved).get_json(join(resolved, "config.json"))
    except NotFound:
        raise ValueError(
            f"init.from={resolved!r} holds no config.json; point init.from at a Hugging Face Llama folder "
            "(a promoted version, a run's export/) or set it to none"
        ) from None
    tokenizer = dict(manifest["tokenizer"])
    source_config = source_config if isinstance(source_config, dict) else {}
    try:
        if config.model.hf_config is not None:  # a Hugging Face model: a version of itself
            labels = task_labels(manifest)
            run = pin_labels(config, labels) if labels is not None else config
            check_hf_init_fit(run.model.hf_config or {}, source_config, resolved)
        else:
            args = PRESETS[config.model.preset].with_vocab(
                config.model.vocab_size or int(tokenizer["vocab_size"])
            )
            check_init_fit(args, source_config, resolved)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    warning = check_tokenizer(
        source_tokenizer(storage_of, resolved), tokenizer, source_uri=resolved, data_uri=config.data_uri
    )
    if warning:
        log.warning("%s", warning)
    return config


def pin_hf_model(config: Config, storage_of: Callable[[str], Storage]) -> Config:
    """``config`` with the ``model.hf`` folder's ``config.json`` pinned into ``model.hf_config``
    (``trainer.config.pin_hf_config``: the family and shape checked, the model every attempt
    builds), after checking the folder holds weights; ``config`` itself without ``model.hf``.
    ValueError naming the folder and what to fix."""
    uri = config.model.hf
    if not uri:
        return config
    storage = storage_of(uri)
    what = "a Hugging Face model folder (config.json, safetensors weights, tokenizer files)"
    try:
        values = storage.get_json(join(uri, "config.json"))
    except NotFound:
        raise ValueError(f"model.hf={uri!r} holds no config.json; point model.hf at {what}") from None
    weights = ("model.safetensors", "model.safetensors.index.json")
    if all(storage.head(join(uri, name)) is None for name in weights):
        raise ValueError(f"model.hf={uri!r} holds neither {' nor '.join(weights)}; point model.hf at {what}")
    pinned = pin_hf_config(config, values)
    kind = (pinned.model.hf_config or {}).get("model_type")
    log.info("model.hf: %s, a %s model; its config.json is pinned for every attempt", uri, kind)
    return pinned


def hf_tokenizer_problem(
    folder_uri: str,
    *,
    export_tokenizer: Mapping[str, Any] | None,
    tokenizer_sha256: str | None,
    dataset: Mapping[str, Any],
    data_uri: str,
) -> tuple[str | None, str | None]:
    """``(error, warning)``: whether the dataset was tokenized with the ``model.hf`` folder's own
    tokenizer. A trainops export names the spec it was trained with (``export_tokenizer``);
    another folder has its ``tokenizer.json`` (``tokenizer_sha256``), which staging records by
    its sha256. A folder with neither cannot be checked (a warning). Pure."""
    stage = (
        f"stage the data with the model's tokenizer (StageDatasetOperator tokenizer="
        f"{join(folder_uri, 'tokenizer.json')!r})"
    )
    if export_tokenizer is not None:
        if dict(export_tokenizer) != dict(dataset):
            return (
                f"model.hf={folder_uri!r} was trained with tokenizer {dict(export_tokenizer)!r}, but dataset "
                f"{data_uri!r} is tokenized with {dict(dataset)!r}; {stage}",
                None,
            )
        return None, None
    if tokenizer_sha256 is None:
        return None, (
            f"model.hf={folder_uri!r} holds no tokenizer.json: whether dataset {data_uri!r} was tokenized "
            "with the model's tokenizer cannot be checked (only the vocabulary is)"
        )
    if dataset.get("kind") != "huggingface" or dataset.get("sha256") != tokenizer_sha256:
        said = dataset.get("sha256") or dataset.get("kind")
        return (
            f"model.hf={folder_uri!r} has its own tokenizer (tokenizer.json, sha256 {tokenizer_sha256[:12]}), "
            f"but dataset {data_uri!r} is tokenized with another ({said}); {stage}",
            None,
        )
    return None, None


def check_hf_tokenizer(
    config: Config, manifest: Mapping[str, Any], storage_of: Callable[[str], Storage]
) -> None:
    """ValueError when the ``model.hf`` folder's tokenizer is not the one the dataset was staged
    with (:func:`hf_tokenizer_problem`), before launch; nothing without ``model.hf``."""
    uri = config.model.hf
    if not uri:
        return
    storage = storage_of(uri)
    try:
        data = storage.get(join(uri, "tokenizer.json"))
    except NotFound:
        data = None
    error, warning = hf_tokenizer_problem(
        uri,
        export_tokenizer=source_tokenizer(storage_of, uri),
        tokenizer_sha256=hashlib.sha256(data).hexdigest() if data is not None else None,
        dataset=dict(manifest.get("tokenizer") or {}),
        data_uri=config.data_uri,
    )
    if error:
        raise ValueError(error)
    if warning:
        log.warning("%s", warning)


def _earlier_source(store: Storage, config_uri: str) -> str | None:
    """The URI ``init.from`` was resolved to in the run's ``config.yaml`` by an earlier try, if any."""
    try:
        written = yaml.safe_load(store.get(config_uri))
    except (NotFound, yaml.YAMLError):
        return None
    value = ((written or {}).get("init") or {}).get("from") if isinstance(written, dict) else None
    try:
        return value if isinstance(value, str) and init_source(value) == "uri" else None
    except ValueError:  # a config.yaml edited by hand: resolve afresh
        return None
