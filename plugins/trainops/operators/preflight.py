"""What an attempt needs that only the running task can see, checked in ``execute`` before
anything is written or launched: the dataset version (its manifest, read from storage), whether
the trainer's config fits it, the model builder where this host can see it, and, on the local
cluster, this host's GPUs. Each failure is a ValueError that names the value and what to do;
the job never starts, so no GPU time is spent finding out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainer.config import USER_METRIC_EXAMPLE, builder_parts, check_data_fit
from trainer.config.functions import function_parts
from trainer.contract import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    dataset_task,
    join,
    split_records,
    task_labels,
)
from trainer.storage import NotFound
from trainops.cluster.local.builder_lookup import find_builder, local_problem
from trainops.cluster.local.gpus import host_gpus, shortfall

if TYPE_CHECKING:
    from trainer.config import Config
    from trainer.storage import Storage

STAGED_VERSION = (
    "a staged dataset version (<root>/datasets/<name>/<version>, the 'uri' StageDatasetOperator returns)"
)


def dataset_manifest(storage: Storage, data_uri: str) -> dict[str, Any]:
    """The manifest of the dataset version at ``data_uri``; ValueError saying what is there
    instead when it is not a staged version."""
    uri = join(data_uri, MANIFEST_NAME)
    try:
        manifest = storage.get_json(uri)
    except NotFound:
        raise ValueError(missing_dataset(data_uri, storage.list(data_uri))) from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{uri} is not a {MANIFEST_FORMAT} manifest: point dataset at {STAGED_VERSION}")
    return manifest


def missing_dataset(data_uri: str, stored: list[str]) -> str:
    """What to say about ``data_uri``, which holds no manifest, given what is stored under it (pure)."""
    if not stored:
        return f"dataset {data_uri!r} does not exist (nothing is stored under it): point dataset at {STAGED_VERSION}"
    versions = [u.removesuffix(f"/{MANIFEST_NAME}") for u in stored if u.endswith(f"/{MANIFEST_NAME}")]
    if versions:
        return (
            f"dataset {data_uri!r} is not one dataset version but holds {len(versions)} of them, such as "
            f"{versions[-1]!r}: point dataset at one version folder"
        )
    return (
        f"dataset {data_uri!r} holds {len(stored)} object(s) (such as {stored[0]!r}) but no {MANIFEST_NAME}, "
        f"so it is not a staged dataset version (a failed staging leaves only its validation.json): "
        f"point dataset at {STAGED_VERSION}"
    )


def check_fit(config: Config, manifest: Mapping[str, Any], *, world_size: int) -> None:
    """The trainer's own rule (``trainer.config.check_data_fit``) on the manifest's numbers."""
    try:
        train_tokens = int(manifest["splits"]["train"]["tokens"])
        vocab = int(manifest["tokenizer"]["vocab_size"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"the manifest of dataset {config.data_uri!r} lacks splits.train.tokens or tokenizer.vocab_size: "
            "re-stage the dataset"
        ) from None
    task = dataset_task(manifest)  # ValueError naming an unknown task
    records = split_records(manifest, "train")
    check_data_fit(
        config,
        train_tokens=train_tokens,
        tokenizer_vocab=vocab,
        world_size=world_size,
        dataset_task=task,
        train_records=int(records.get("count", 0)) if records else None,
        labels=task_labels(manifest),  # ValueError naming them
    )


def check_builder(builder: str | None, cluster: str, *, env: Mapping[str, str]) -> None:
    """A ``model.builder`` the trainer could not call, where this host can tell: on the local
    cluster, its module must be on the cluster's Python path (with ``env``, the job's own
    environment) and define the function; for
    Kubernetes (an image-only module, usually), a module found on this host must define the
    function, and one not found here is left to the trainer in the image."""
    if builder is None:
        return

    module, function = builder_parts(builder)
    problem = local_problem(builder, env) if cluster == "local" else find_builder(module, function).problem
    if problem:
        raise ValueError(problem)


def check_scorers(specs: list[str], cluster: str, *, env: Mapping[str, str]) -> None:
    """A team's ``eval.metrics`` scorers the evaluation could not call, where this host can
    tell, as :func:`check_builder` judges a builder: on the local cluster each must be on the
    cluster's Python path and define its function; for Kubernetes one found here must define it."""
    for spec in specs:
        module, function = function_parts("eval.metrics", spec, USER_METRIC_EXAMPLE)
        if cluster == "local":
            problem = local_problem(spec, env, key="eval.metrics")
        else:
            problem = find_builder(module, function, key="eval.metrics").problem
        if problem:
            raise ValueError(problem)


def check_gpus(cluster: str, *, nodes: int, gpus_per_node: int, env: Mapping[str, str]) -> None:
    """On the local cluster, GPUs asked for must be on this host (``nvidia-smi`` or the NVIDIA
    driver's ``/proc`` entries; never torch); ``env`` is the job's own environment."""
    if cluster != "local" or gpus_per_node == 0:
        return

    problem = shortfall(nodes, gpus_per_node, host_gpus({**os.environ, **env}))
    if problem:
        raise ValueError(problem)
