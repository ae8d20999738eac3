"""What the training operator launches: the run's config, checked before anything is written,
and each attempt's JobSpec, sized from the config as written and the dataset it reads."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from trainer.config import Config, config_from_mapping
from trainer.contract import RunLayout
from trainer.storage import Storage
from trainops.hooks.storage import job_env_for, storage_for
from trainops.operators import warm_start
from trainops.operators.base import TaskIdentity, TaskLog
from trainops.operators.launch_plan import (
    AttemptLaunch,
    LaunchSettings,
    checked_run_config,
    sized,
    training_attempt,
)
from trainops.operators.preflight import check_builder, check_fit, check_gpus, dataset_manifest
from trainops.operators.sizing import disk_options, estimate
from trainops.recovery import bad_nodes


def checked_config(
    trainer_config: Mapping[str, Any],
    settings: LaunchSettings,
    *,
    cluster: str,
    data_uri: str,
    layout: RunLayout,
    store: Storage,
    model_name: str | None,
    storage_root: str | None,
    aws_conn_id: str | None,
) -> Config:
    """The run's config from ``trainer_config``, checked against this host's GPUs (local), the
    dataset's manifest (a staged version that can feed the run) and the model builder, with a
    ``model.hf`` folder's config pinned (:func:`trainops.operators.warm_start.pin_hf_model`) and
    ``init.from`` resolved (:func:`trainops.operators.warm_start.prepare`); ValueError naming
    the bad value. Nothing is written.

    :param settings: what every attempt's job is made of (:class:`LaunchSettings`).
    """
    config = checked_run_config(
        trainer_config, run_uri=layout.run_uri, data_uri=data_uri, world_size=settings.world_size
    )
    config = warm_start.pin_hf_model(config, lambda uri: storage_for(uri, aws_conn_id))
    job_env = settings.job_options.get("env") or {}
    check_gpus(cluster, nodes=settings.nodes, gpus_per_node=settings.gpus_per_node, env=job_env)
    manifest = dataset_manifest(storage_for(data_uri, aws_conn_id), data_uri)
    check_fit(config, manifest, world_size=settings.world_size)
    warm_start.check_hf_tokenizer(config, manifest, lambda uri: storage_for(uri, aws_conn_id))
    check_builder(config.model.builder, cluster, env=job_env)
    return warm_start.prepare(
        config,
        manifest,
        model_name=model_name,
        storage_root=storage_root,
        store=store,
        config_uri=layout.config,
        storage_of=lambda uri: storage_for(uri, aws_conn_id),
    )


def run_config(store: Storage, layout: RunLayout) -> Config:
    """The run's config as written (``config.yaml``): an attempt's pods are sized from it."""
    return config_from_mapping(yaml.safe_load(store.get(layout.config).decode()), layout.config)


def pod_disk(
    config: Config, *, nodes: int, gpus_per_node: int, aws_conn_id: str | None, log: TaskLog
) -> dict[str, str]:
    """The pods' cache ``sizeLimit`` and ``ephemeral-storage`` request (Kubernetes), from the
    run's config and its dataset's manifest (:mod:`trainops.operators.sizing`); said in ``log``."""
    manifest = dataset_manifest(storage_for(config.data_uri, aws_conn_id), config.data_uri)
    found = estimate(config, manifest, procs_per_node=max(1, gpus_per_node), nodes=nodes)
    if found is not None:
        log.info("pod disk: %s (job_options cache_size, ephemeral_storage override it)", found.describe())
    return disk_options(found)


def attempt_launch(
    store: Storage,
    layout: RunLayout,
    settings: LaunchSettings,
    *,
    cluster: str,
    identity: TaskIdentity,
    attempt: int,
    job: Mapping[str, Any],
    aws_conn_id: str | None,
    log: TaskLog,
) -> AttemptLaunch:
    """Attempt ``attempt``'s launch on the run's capacity now (``job``: its job.json), sized
    from the run's config as written (and, on Kubernetes, the pods' disk from its dataset),
    kept off the nodes its earlier attempts failed on twice (:mod:`trainops.recovery.bad_nodes`).

    :param settings: the operator's launch settings (the pods' disk not sized yet)."""
    capacity = job["capacity"]
    avoid = bad_nodes.avoided(job.get("attempts") or [], now=time.time())
    if avoid:
        log.warning(
            "attempt %d keeps off %d node(s) earlier attempts failed on twice: %s",
            attempt,
            len(avoid),
            bad_nodes.describe(avoid),
        )
    config = run_config(store, layout)
    if cluster == "kubernetes":
        disk = pod_disk(
            config,
            nodes=settings.nodes,
            gpus_per_node=settings.gpus_per_node,
            aws_conn_id=aws_conn_id,
            log=log,
        )
        settings = replace(settings, disk=disk)
    return training_attempt(
        sized(settings, config),
        identity=identity,
        run_uri=layout.run_uri,
        attempt=attempt,
        capacity=capacity,
        storage_env=job_env_for(layout.run_uri, aws_conn_id),
        avoid_nodes=sorted(avoid),
        cluster=cluster,
    )
