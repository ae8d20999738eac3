"""The dry run: what the training task would launch for a run plan, launching nothing."""

from __future__ import annotations

from trainops.recipes.pipeline import deployment


def dry_run_report(
    plan: dict,
    *,
    dag_id: str,
    run_id: str,
    storage_root: str | None = None,
    aws_conn_id: str | None = "aws_default",
) -> dict:
    """What the training task would launch for ``plan``, launching nothing: the resolved
    trainer config (validated by the trainer's own schema), attempt 1's JobSpec, and the
    Kubernetes manifests that JobSpec becomes (what ``cluster='kubernetes'`` submits; the
    local cluster runs the same arguments as process groups on this host)."""
    import yaml

    from trainer.contract import ENV_ATTEMPT, join, run_prefix, safe_segment, trainer_argv
    from trainops.cluster.kubernetes.render import render_manifests
    from trainops.cluster.spec import JobSpec
    from trainops.hooks.storage import job_env_for
    from trainops.operators import _jobs
    from trainops.settings import resolve_storage_root

    place = deployment()
    root = resolve_storage_root(storage_root)
    kwargs = plan
    identity = {"dag_id": dag_id, "run_id": run_id, "task_id": "train", "map_index": -1}
    run_uri = run_prefix(root, dag_id, run_id, "train")
    data_uri = join(root, "datasets", safe_segment(plan["dataset_name"]), "<version staged from dataset_uri>")
    world_size = kwargs["nodes"] * max(1, kwargs["gpus_per_node"])
    config = _jobs.resolve_trainer_config(
        {"run_uri": run_uri, "data_uri": data_uri, **kwargs["trainer_config"]}, world_size
    )
    labels = {**_jobs.job_labels(identity), "trainops/attempt": "1"}
    env = {**job_env_for(run_uri, aws_conn_id), ENV_ATTEMPT: "1"}
    spec = JobSpec(
        name=_jobs.job_name("train", identity, 1),
        args=trainer_argv("train", f"{run_uri}/config.yaml"),
        nodes=kwargs["nodes"],
        gpus_per_node=kwargs["gpus_per_node"],
        distributed=True,
        image=place["image"],
        namespace=place["namespace"],
        capacity=kwargs["capacity"],
        env=env,
        labels=labels,
    )
    return {
        "cluster": place["cluster"],
        "dataset_uri": plan["dataset_uri"],
        "max_preemptions": kwargs["max_preemptions"],
        "capacity": kwargs["capacity"],
        "trainer_config": yaml.safe_load(config),
        "job_spec": spec.to_dict(),
        "manifests": render_manifests(spec),
    }
