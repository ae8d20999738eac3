"""The launch plan: the one place a training run's config is resolved and an attempt's JobSpec
is built, for :class:`~trainops.operators.train.FSDPTrainingOperator` and for the dry run
(:mod:`trainops.recipes.dry_run`), so a dry run shows exactly what attempt 1 launches.
The one-process jobs of staging and evaluation are built here too.

Pure apart from reading the trainer's schema and logging the sizing (:func:`sized`): the storage environment (which needs the
Airflow connection) is passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from trainer.config import accumulation_steps, config_from_mapping, dump_yaml, model_shape, replicate_degree
from trainer.contract import ENV_ATTEMPT, ENV_GPUS_PER_NODE, ENV_SPOT_NOTICE, RunLayout, trainer_argv
from trainer.presets import param_count
from trainops.cluster.kubernetes.nodes import instance_type
from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec, JobSpecError
from trainops.operators.base import TaskIdentity, job_labels, job_name
from trainops.operators.cleanup import ttl_options
from trainops.operators.job_options import merge_job_options
from trainops.operators.sizing import fit_warnings, pod_resources

if TYPE_CHECKING:
    from trainer.config import Config
    from trainops.cluster.base import Chaos
    from trainops.cluster.spec import JobSpec

log = logging.getLogger(__name__)
# trainer_config keys the operator derives itself (from the run prefix and the dataset).
DERIVED_KEYS = ("run_uri", "data_uri")
NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


@dataclass(frozen=True)
class LaunchSettings:
    """What the training operator's parameters say about every attempt's job.

    :param inject_preemption: the local cluster's injected preemption (a demo and test aid):
        ``{"node": 1, "at_step": 40}``, for attempt ``"attempt"`` (default 1).
    :param disk: the pods' ``cache_size`` and ``ephemeral_storage`` estimated for the run
        (``trainops.operators.sizing``); ``job_options`` override them.
    :param keep_finished_jobs: finished attempts are kept (with a TTL where the kind has one)
        instead of deleted.
    :param resources: the pods' ``cpu``, ``memory`` and ``shm_size`` derived from the GPUs and
        the model (:func:`sized`); ``job_options`` override them.
    :param restarts_in_place: torchrun's restarts of a node's workers in the same pods before
        the whole gang is relaunched (the JobSpec's ``restarts_in_place``).
    """

    nodes: int
    gpus_per_node: int
    image: str
    namespace: str
    termination_grace_seconds: int
    job_options: Mapping[str, Any] = field(default_factory=dict)
    inject_preemption: Mapping[str, Any] | str | None = None  # a str: a template left unrendered
    disk: Mapping[str, str] = field(default_factory=dict)
    keep_finished_jobs: bool = False
    resources: Mapping[str, str] = field(default_factory=dict)
    restarts_in_place: int = 0

    @property
    def world_size(self) -> int:
        """Ranks of the gang: one per GPU, or one per node on CPU."""
        return self.nodes * max(1, self.gpus_per_node)


@dataclass(frozen=True)
class AttemptLaunch:
    """One attempt as it is launched: the JobSpec, and the injected preemption (None: none)."""

    spec: JobSpec
    chaos: Chaos | None


def nest(flat_or_nested: Mapping[str, Any] | None) -> dict[str, Any]:
    """Accept ``{"train.lr": 1e-3}`` and ``{"train": {"lr": 1e-3}}`` alike; return nested."""
    out: dict[str, Any] = {}
    for key, value in (flat_or_nested or {}).items():
        if isinstance(value, dict):
            value = nest(value)
        node = out
        *parents, leaf = str(key).split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf].update(value)
        else:
            node[leaf] = value
    return out


def resolve_trainer_config(base: Mapping[str, Any], world_size: int) -> str:
    """Validate a trainer config (defaults < ``base``) for ``world_size`` ranks; the resolved YAML.

    Uses the trainer's own schema (``trainer.config``: dataclasses, no torch), so an unknown
    key, a wrong type, a value that is not finite or a global batch the ranks cannot split
    fails here, naming the key, before any job is launched.
    """
    return str(dump_yaml(_checked(base, world_size)))


def _checked(base: Mapping[str, Any], world_size: int | None) -> Config:
    config = config_from_mapping(base)
    if world_size is not None:
        accumulation_steps(config.train, world_size)
        # a replica count that does not divide the ranks (``auto`` always fits some mesh)
        replicate_degree(config.parallel.replicate, world_size, 1)
    return config


def checked_run_config(
    user: Mapping[str, Any] | None, *, run_uri: str, data_uri: str, world_size: int | None
) -> Config:
    """The training run's config: the user's ``trainer_config`` (nested or dotted) with the run
    prefix and the dataset the operator derives, checked by the trainer's schema for
    ``world_size`` ranks (None: not known yet, so the global batch is not checked). Pure, so a
    plain ``trainer_config`` is checked when the DAG is parsed."""
    if user is not None and not isinstance(user, Mapping):
        raise ValueError(
            f"trainer_config must be a dict of trainer keys such as {{'train.lr': 0.001}}, got {user!r}"
        )
    nested = nest(user)
    for key in DERIVED_KEYS:
        if key in nested:
            raise ValueError(
                f"trainer_config must not set {key!r}: the operator derives it "
                "from the run prefix and the dataset"
            )
    return _checked({"run_uri": run_uri, "data_uri": data_uri, **nested}, world_size)


def run_config(user: Mapping[str, Any] | None, *, run_uri: str, data_uri: str, world_size: int) -> str:
    """The resolved ``config.yaml`` of a training run (:func:`checked_run_config` as YAML)."""
    return str(dump_yaml(checked_run_config(user, run_uri=run_uri, data_uri=data_uri, world_size=world_size)))


def sized(settings: LaunchSettings, config: Config) -> LaunchSettings:
    """``settings`` with the pods' CPU, memory and shm derived from the GPUs per node and the
    model's size (:func:`trainops.operators.sizing.pod_resources`), saying so in the log, and a
    warning in the log for each way the model cannot fit the GPUs
    (:func:`trainops.operators.sizing.fit_warnings`). For the operator and the dry run alike, so
    both show the same numbers."""
    args = model_shape(config)
    found = pod_resources(
        gpus_per_node=settings.gpus_per_node,
        nodes=settings.nodes,
        params=None if args is None else param_count(args),
    )
    overridden = sorted(set(found.options()) & set(settings.job_options))
    log.info(
        "%s%s", found.describe(), f" (job_options override {', '.join(overridden)})" if overridden else ""
    )
    for warning in fit_warnings(
        config,
        nodes=settings.nodes,
        gpus_per_node=settings.gpus_per_node,
        instance_type=instance_type(settings.job_options.get("node_selector")),
    ):
        log.warning("sizing: %s", warning["message"])
    return replace(settings, resources=found.options())


def training_attempt(
    settings: LaunchSettings,
    *,
    identity: TaskIdentity,
    run_uri: str,
    attempt: int,
    capacity: str,
    storage_env: Mapping[str, str],
    avoid_nodes: Sequence[str] = (),
    cluster: str = "local",
) -> AttemptLaunch:
    """Attempt ``attempt`` of the training run under ``run_uri``.

    :param capacity: the run's capacity now (``spot-then-on-demand`` moves to ``on-demand``).
    :param storage_env: the storage endpoint and region (``trainops.hooks.storage.job_env_for``).
    :param cluster: the backend (``kubernetes`` spot capacity watches for the cloud's notice).
    :param avoid_nodes: Node names earlier attempts failed on twice for the node's sake
        (:func:`trainops.recovery.bad_nodes.avoided`), kept out of this attempt's placement.
    """
    layout = RunLayout(run_uri)
    options = {
        **settings.disk,
        **settings.resources,
        **ttl_options(
            settings.keep_finished_jobs, settings.job_options.get("kind", "indexed-job"), settings.job_options
        ),
        **settings.job_options,
    }
    spec = JobSpec(
        name=job_name("train", identity, attempt),
        args=trainer_argv("train", layout.config),
        nodes=settings.nodes,
        gpus_per_node=settings.gpus_per_node,
        distributed=True,
        image=settings.image,
        namespace=settings.namespace,
        capacity=capacity,
        termination_grace_seconds=settings.termination_grace_seconds,
        restarts_in_place=settings.restarts_in_place,
        avoid_nodes=sorted({*avoid_nodes, *_listed_nodes(options.get("avoid_nodes"))}),
        **merge_job_options(
            {k: v for k, v in options.items() if k != "avoid_nodes"},
            # The GPUs too: a trainer that cannot see them fails as its node's fault, where it
            # would otherwise train on the CPU without a word.
            env={
                **storage_env,
                ENV_ATTEMPT: str(attempt),
                ENV_GPUS_PER_NODE: str(settings.gpus_per_node),
                **watchdog_env(settings.job_options),
                **spot_notice_env(cluster, capacity, settings.job_options),
            },
            labels={**job_labels(identity), "trainops/attempt": str(attempt)},
        ),
    )
    inject = settings.inject_preemption
    if inject is not None and not isinstance(inject, Mapping):
        raise ValueError(
            f"inject_preemption must be a mapping such as {{'node': 1, 'at_step': 40}}, or None; got {inject!r}"
        )
    chaos: Chaos | None = None
    if inject and int(inject.get("attempt", 1)) == attempt:
        if not isinstance(inject.get("at_step"), int):
            raise ValueError(
                f"inject_preemption needs an integer 'at_step' (the step to preempt at), got {inject!r}"
            )
        chaos = {
            "at_step": inject["at_step"],
            "node": int(inject.get("node", 0)),
            "attempt": attempt,
            "metrics_uri": layout.metrics,
        }
    return AttemptLaunch(spec=spec, chaos=chaos)


def _listed_nodes(value: Any) -> list[str]:
    """``job_options`` ``avoid_nodes``: a list of Node names (a string would be its letters)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise JobSpecError(
            f"job_options avoid_nodes {value!r}: use a list of Node names such as ['gpu-node-1']"
        )
    return value


def watchdog_env(job_options: Mapping[str, Any]) -> dict[str, str]:
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` unless the user set it (``env`` or ``nccl_env``):
    NCCL's watchdog then aborts a collective stuck past the trainer's process-group timeout
    (``train.collective_timeout_s``) and the rank crashes, instead of the gang hanging."""
    user = {**(job_options.get("env") or {}), **(job_options.get("nccl_env") or {})}
    return {} if NCCL_ASYNC_ERROR_HANDLING in user else {NCCL_ASYNC_ERROR_HANDLING: "1"}


def spot_notice_env(cluster: str, capacity: str, job_options: Mapping[str, Any]) -> dict[str, str]:
    """``TRAINOPS_SPOT_NOTICE=auto`` for training on Kubernetes spot capacity, unless the user
    set it (``env``): each node then watches its cloud's metadata for the interruption notice
    (``trainer.runtime.notice``), which comes before any SIGTERM, or instead of one. The local
    backend watches nothing unless told: its "node" is the machine the tests run on."""
    if ENV_SPOT_NOTICE in (job_options.get("env") or {}) or cluster != "kubernetes" or capacity != "spot":
        return {}
    return {ENV_SPOT_NOTICE: "auto"}


def one_process_job(
    prefix: str,
    *,
    identity: TaskIdentity,
    attempt: int,
    args: list[str],
    labels: Mapping[str, str],
    image: str,
    namespace: str,
    capacity: str,
    job_options: Mapping[str, Any],
    storage_env: Mapping[str, str],
    gpus_per_node: int = 0,
) -> JobSpec:
    """A one-node, one-process job (staging, evaluation) named ``<prefix>-<hash>-a<attempt>``.

    :param labels: the job's labels (the task's, and whatever else marks this job).
    :param gpus_per_node: GPUs of the node, also told to the process (``TRAINOPS_GPUS_PER_NODE``).
    """
    return JobSpec(
        name=job_name(prefix, identity, attempt),
        args=args,
        nodes=1,
        gpus_per_node=gpus_per_node,
        distributed=False,
        image=image,
        namespace=namespace,
        capacity=capacity,
        **merge_job_options(
            job_options, env={**storage_env, ENV_GPUS_PER_NODE: str(gpus_per_node)}, labels=labels
        ),
    )


def manifests_of(cluster: str, spec: JobSpec) -> list[dict[str, Any]]:
    """The manifests a Kubernetes attempt submits (for job.json and the dry run; no secret
    values are ever in them, only references); nothing for other backends."""
    if cluster != "kubernetes":
        return []

    return list(render_manifests(spec))
