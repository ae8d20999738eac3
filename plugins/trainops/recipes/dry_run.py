"""The dry run: what the training task would launch for a run plan, launching nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainops.operators.train import FSDPTrainingOperator


def dry_run_report(
    plan: Mapping[str, Any], train: FSDPTrainingOperator, *, dag_id: str, run_id: str
) -> dict[str, Any]:
    """What ``train`` would launch as attempt 1 for ``plan`` (:func:`.form.plan_run`),
    launching nothing: the resolved trainer config (validated by the trainer's own schema),
    attempt 1's JobSpec, and the Kubernetes manifests that JobSpec becomes (what
    ``cluster='kubernetes'`` submits; the local cluster runs the same arguments as process
    groups on this host).

    :param train: the DAG's training task. Its own settings (cluster, image, namespace,
        grace period, ``job_options``, storage) are used as they are; the plan's values stand
        in for its templated sizing fields, which the plan's XCom feeds when it runs.
    """
    import yaml

    from trainer.contract import join, run_prefix, safe_segment
    from trainops.cluster.kubernetes.render import render_manifests
    from trainops.hooks.storage import job_env_for
    from trainops.operators.base import TaskIdentity
    from trainops.operators.launch_plan import run_config, training_attempt
    from trainops.settings import resolve_storage_root

    root = resolve_storage_root(train.storage_root)
    identity: TaskIdentity = {"dag_id": dag_id, "run_id": run_id, "task_id": train.task_id, "map_index": -1}
    run_uri = run_prefix(root, dag_id, run_id, train.task_id)
    data_uri = join(root, "datasets", safe_segment(plan["dataset_name"]), "<version staged from dataset_uri>")
    # The task's own launch settings, with the plan's values where its templates will render.
    settings = replace(train.launch_settings(), nodes=plan["nodes"], gpus_per_node=plan["gpus_per_node"])
    config = run_config(
        plan["trainer_config"], run_uri=run_uri, data_uri=data_uri, world_size=settings.world_size
    )
    spec = training_attempt(
        settings,
        identity=identity,
        run_uri=run_uri,
        attempt=1,
        capacity=plan["capacity"],
        storage_env=job_env_for(run_uri, train.aws_conn_id),
    ).spec
    return {
        "cluster": train.cluster,
        "dataset_uri": plan["dataset_uri"],
        "max_preemptions": plan["max_preemptions"],
        "capacity": plan["capacity"],
        "trainer_config": yaml.safe_load(config),
        "job_spec": spec.to_dict(),
        # The cache size needs the staged dataset's manifest, which a dry run does not have yet.
        "disk": (
            "sized at launch from the staged dataset and the checkpoint"
            if spec.cache_size is None
            else f"cache {spec.cache_size}, ephemeral-storage {spec.ephemeral_storage or spec.cache_size}"
        ),
        "manifests": render_manifests(spec),
    }
