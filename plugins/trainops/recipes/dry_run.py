"""The dry run: what the training task would launch for a run plan, and what it would cost,
launching nothing."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import yaml

from trainer.config import ConfigError, config_from_mapping, dump_yaml
from trainer.contract import MetricsReader, MetricsTooLarge, join, run_prefix, safe_segment
from trainer.storage import NotFound, StorageError
from trainops.cluster.kubernetes.nodes import instance_type
from trainops.cluster.kubernetes.pod import masked
from trainops.cluster.kubernetes.render import review_manifests
from trainops.cost.estimate import estimate_run, measure_run, same_model
from trainops.cost.prices import PRICES_VARIABLE, load_prices
from trainops.cost.runs import runs_below, task_matches
from trainops.hooks.storage import job_env_for, storage_for
from trainops.operators.base import TaskIdentity
from trainops.operators.launch_plan import checked_run_config, sized, training_attempt
from trainops.operators.params import known_at_run_time
from trainops.operators.sizing import sizing_record
from trainops.recovery.record import as_job_record
from trainops.settings import resolve_storage_root

if TYPE_CHECKING:
    from trainer.config import Config
    from trainer.storage import Storage
    from trainops.cluster.spec import JobSpec
    from trainops.cost.estimate import Estimate, Measured
    from trainops.operators.train import FSDPTrainingOperator

log = logging.getLogger(__name__)
# The most metrics bytes read from one earlier run to measure its step time (as the report app
# reads at most for a run page); a larger run is passed over, with a warning.
MAX_METRICS_BYTES = 32 * 1024 * 1024


def dry_run_report(
    plan: Mapping[str, Any],
    train: FSDPTrainingOperator,
    *,
    dag_id: str,
    run_id: str,
    prices_variable: str | None = None,
) -> dict[str, Any]:
    """What ``train`` would launch as attempt 1 for ``plan`` (:func:`.form.plan_run`),
    launching nothing: the resolved trainer config (validated by the trainer's own schema),
    attempt 1's JobSpec, the Kubernetes manifests that JobSpec becomes (what
    ``cluster='kubernetes'`` submits; the local cluster runs the same arguments as process
    groups on this host) and the cost estimate (:func:`run_estimate`).

    A variable that looks like a literal credential (:mod:`trainops.cluster.credentials`) is
    shown as ``***`` in the JobSpec and the manifests, and ``refused_at_launch`` (None: nothing)
    names each such variable, never its value, as the launch on kubernetes would refuse it;
    the log says so too. Secrets are only ever referenced (``env_from_secrets``), so no Secret's
    value is in the report; what comes from the AWS connection is its endpoint, without
    userinfo, and region (:func:`trainops.hooks.storage.job_env_for`), never its keys.

    :param train: the DAG's training task. Its own settings (cluster, image, namespace,
        grace period, ``job_options``, storage) are used as they are; the plan's values stand
        in for its templated sizing fields, which the plan's XCom feeds when it runs.
    :param prices_variable: the Variable ``trainops_prices`` (JSON text; None: not set).
    """
    root = resolve_storage_root(train.storage_root)
    identity: TaskIdentity = {"dag_id": dag_id, "run_id": run_id, "task_id": train.task_id, "map_index": -1}
    run_uri = run_prefix(root, dag_id, run_id, train.task_id)
    data_uri = join(root, "datasets", safe_segment(plan["dataset_name"]), "<version staged from dataset_uri>")
    # The task's own launch settings, with the plan's values where its templates will render.
    settings = replace(
        train.launch_settings(),
        nodes=plan["nodes"],
        gpus_per_node=plan["gpus_per_node"],
        restarts_in_place=plan["restarts_in_place"],
    )
    config = checked_run_config(
        plan["trainer_config"], run_uri=run_uri, data_uri=data_uri, world_size=settings.world_size
    )
    spec = training_attempt(
        sized(settings, config),
        identity=identity,
        run_uri=run_uri,
        attempt=1,
        capacity=plan["capacity"],
        storage_env=job_env_for(run_uri, train.aws_conn_id),
    ).spec
    manifests, refusal = review_manifests(spec)
    if refusal:
        # The launch on kubernetes refuses it (the task already did, when its DAG was parsed);
        # the local cluster runs it. Either way the dry run shows it masked, and says so.
        local = "" if train.cluster == "kubernetes" else f" (this task's cluster, {train.cluster!r}, runs it)"
        refusal = f"on cluster 'kubernetes'{local}: {refusal}"
        log.warning("would be refused at launch %s", refusal)
    return {
        "cluster": train.cluster,
        "dataset_uri": plan["dataset_uri"],
        "max_preemptions": plan["max_preemptions"],
        "restarts_in_place": plan["restarts_in_place"],
        "capacity": plan["capacity"],
        "trainer_config": yaml.safe_load(dump_yaml(config)),
        "job_spec": masked(spec).to_dict(),
        # The cache size needs the staged dataset's manifest, which a dry run does not have yet.
        "disk": (
            "sized at launch from the staged dataset and the checkpoint"
            if spec.cache_size is None
            else f"cache {spec.cache_size}, ephemeral-storage {spec.ephemeral_storage or spec.cache_size}"
        ),
        "sizing": sizing_record(config, spec),
        "manifests": manifests,
        "refused_at_launch": refusal,
        "estimate": run_estimate(
            train,
            config,
            spec,
            root=root,
            dag_id=dag_id,
            capacity=plan["capacity"],
            prices_variable=prices_variable,
        ),
    }


def run_estimate(
    train: FSDPTrainingOperator,
    config: Config,
    spec: JobSpec,
    *,
    root: str,
    dag_id: str,
    capacity: str,
    prices_variable: str | None,
) -> Estimate:
    """The run's cost estimate (:func:`trainops.cost.estimate.estimate_run`): the step time
    measured by the last run of ``dag_id`` that trained the same model (:func:`last_run`), else
    the preset's FLOPs; the instance type from the job's node selector, else the one that run
    ran on; prices from the task's ``prices``, the Variable and the shipped table."""
    notes = []
    try:
        measured = last_run(storage_for(root, train.aws_conn_id), root, dag_id, train.task_id, config)
    except (StorageError, OSError) as exc:  # the estimate is a guess anyway: never fail the dry run for it
        log.warning("the earlier runs of %s could not be read for the estimate: %s", dag_id, exc)
        notes.append(f"the earlier runs of {dag_id} could not be read ({exc}): no measured step time")
        measured = None
    kind = instance_type(spec.node_selector)
    if kind is None and measured is not None and measured["instance_type"]:
        kind = measured["instance_type"]
        notes.append(f"instance type {kind}: what the last run of this DAG and model ran on")
    param = train.prices  # the operator's ``prices``, laid over the Variable
    if param is not None and known_at_run_time(param):
        notes.append("the task's prices parameter is a template, rendered only when it runs: not used here")
        param = None
    try:
        table, source = load_prices(param, prices_variable)
    except ValueError as exc:  # the operator checks its own parameter at parse: the Variable is at fault
        notes.append(f"Variable {PRICES_VARIABLE} ignored ({exc})")
        table, source = load_prices(param, None)
    notes.append(f"prices from the {source}")
    return estimate_run(
        config,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        capacity=capacity,
        prices=table,
        instance_type=kind,
        measured=measured,
        notes=notes,
    )


def last_run(storage: Storage, root: str, dag_id: str, task_id: str, config: Config) -> Measured | None:
    """What the newest earlier run of ``dag_id`` that trained the same model as ``config``
    measured (:func:`trainops.cost.estimate.measure_run`), or None when there is none.

    Finds the runs' ``job.json`` under ``<root>/.../runs/<dag_id>/<run>/<task_id>[.<map_index>]/``
    (``trainops.cost.runs``: one listing of the DAG's runs), newest first by their last attempt's launch or end; a run whose record
    or config cannot be read, whose metrics pass :data:`MAX_METRICS_BYTES`, or hold no two
    consecutive steps, is passed over.
    """
    task = safe_segment(task_id)
    found = []
    for uri, run in runs_below(storage, root, dag_id=safe_segment(dag_id)):
        if not task_matches(run.task, task):
            continue
        try:
            job = as_job_record(storage.get_json(uri), uri)
        except (NotFound, ValueError):
            continue
        times = [t for a in job["attempts"] for t in (a.get("ended_at"), a.get("launched_at")) if t]
        if times:
            found.append((max(times), job))
    for _, job in sorted(found, key=lambda item: item[0], reverse=True):
        try:
            data = yaml.safe_load(storage.get(job["config_uri"]))
            earlier = config_from_mapping(data if isinstance(data, dict) else {}, job["config_uri"])
        except (NotFound, ConfigError, yaml.YAMLError):
            continue
        if not same_model(earlier, config):
            continue
        try:
            records = MetricsReader(storage, job["run_uri"], max_bytes=MAX_METRICS_BYTES).records()
        except MetricsTooLarge as exc:
            log.warning("not measuring the step time of %s: %s", job["run_uri"], exc)
            continue
        last = job["attempts"][-1]
        kinds = [n["instance_type"] for n in last.get("node_types") or [] if n.get("instance_type")]
        measured = measure_run(
            run_uri=job["run_uri"],
            config=earlier,
            nodes=last["nodes"],
            gpus_per_node=last["gpus_per_node"],
            instance_type=kinds[0] if kinds else None,
            records=records,
        )
        if measured is not None:
            return measured
    return None
