"""What the job-launching operators share: run identity, trainer config, events, job records."""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def task_identity(context) -> dict:
    """dag_id, run_id, task_id and map_index of the running task instance."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": map_index if map_index is not None else -1,
    }


def job_labels(identity: dict) -> dict[str, str]:
    """Labels that find a task's live job again after a worker or scheduler restart."""
    from trainer.contract import safe_segment

    return {
        "trainops/dag": safe_segment(identity["dag_id"]),
        "trainops/run": safe_segment(identity["run_id"]),
        "trainops/task": safe_segment(identity["task_id"]),
        "trainops/map-index": str(identity["map_index"]),
    }


def job_name(prefix: str, identity: dict, attempt: int) -> str:
    """A DNS-1123 name unique per run and attempt, short enough for pod names."""
    import hashlib

    digest = hashlib.sha1(
        f"{identity['dag_id']}/{identity['run_id']}/{identity['task_id']}/{identity['map_index']}".encode()
    ).hexdigest()[:8]
    return f"{prefix}-{digest}-a{attempt}"


def nest(flat_or_nested: dict | None) -> dict:
    """Accept ``{"train.lr": 1e-3}`` and ``{"train": {"lr": 1e-3}}`` alike; return nested."""
    out: dict = {}
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


def resolve_trainer_config(base: dict, world_size: int) -> str:
    """Validate a trainer config (defaults < ``base``) for ``world_size`` ranks; the resolved YAML.

    Uses the trainer's own schema (``trainer.config``: dataclasses and PyYAML, no torch), so
    an unknown key, a wrong type or a global batch the ranks cannot split fails here, naming
    the key, before any job is launched.
    """
    import yaml

    from trainer.config import accumulation_steps, dump_yaml, load_config

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(base, f)
        path = f.name
    try:
        config = load_config(path, [])
    finally:
        os.unlink(path)
    accumulation_steps(config.train, world_size)
    return dump_yaml(config)


def cluster_options(
    cluster: str, kubernetes_conn_id: str | None, namespace: str, unschedulable_timeout: float | None = None
) -> dict:
    """What a backend (in the worker and in the trigger) needs besides its name."""
    if cluster == "kubernetes":
        options = {"kubernetes_conn_id": kubernetes_conn_id, "namespace": namespace}
        if unschedulable_timeout is not None:
            options["unschedulable_deadline_s"] = unschedulable_timeout
        return options
    return {}


# JobSpec fields the operators set themselves, and what to do instead of job_options.
OPERATOR_OWNED = {
    "name": "the operator names each attempt's job after the task",
    "args": "the operator builds the trainer command from trainer_config",
    "distributed": "the operator decides (training: torchrun; evaluation: one process)",
    **{
        f: f"use the operator's {f!r} parameter"
        for f in ("nodes", "gpus_per_node", "image", "namespace", "capacity", "termination_grace_seconds")
    },
}


def check_job_options(options: dict | None) -> dict:
    """Validate ``job_options`` (extra JobSpec fields for the cluster: kind, scheduler,
    spot_flavour, cpu, memory, env_from_secrets, service_account, node_selector, ...) at DAG
    parse time, so a typo fails before anything runs. Returns a copy."""
    import dataclasses

    from trainops.cluster.spec import JobSpec

    options = dict(options or {})
    allowed = sorted(f.name for f in dataclasses.fields(JobSpec) if f.name not in OPERATOR_OWNED)
    for key in options:
        if key in OPERATOR_OWNED:
            raise ValueError(f"job_options must not set {key!r}: {OPERATOR_OWNED[key]}")
        if key not in allowed:
            raise ValueError(f"job_options has an unknown field {key!r}; known fields: {allowed}")
    JobSpec(name="check", args=["check"], **options)  # field values (JobSpecError names the bad one)
    return options


def known_at_run_time(value) -> bool:
    """A Jinja template or an XComArg: its value exists only once the task runs."""
    return (isinstance(value, str) and "{{" in value) or callable(getattr(value, "resolve", None))


def as_int(name: str, value, *, minimum: int) -> int:
    """``value`` (an int, or a rendered template's text such as ``"2"``) as an int >= minimum."""
    text = value.strip() if isinstance(value, str) else None
    if isinstance(value, bool) or not (isinstance(value, int) or (text and text.lstrip("-").isdigit())):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    number = int(value)
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def check_renders(cluster: str, **fields) -> None:
    """On ``cluster='kubernetes'``, render a trial JobSpec with the operator's settings, so what
    only rendering can refuse (a literal credential in env, a placement or grace period the job
    kind cannot express) fails when the DAG is parsed, not at launch."""
    if cluster != "kubernetes":
        return
    from trainops.cluster.kubernetes.render import render_manifests
    from trainops.cluster.spec import JobSpec

    render_manifests(JobSpec(name="check", args=["python", "-m", "trainer", "check"], **fields))


def merge_job_options(options: dict, *, env: dict, labels: dict) -> dict:
    """``options`` with the operator's env and labels merged in; the operator's win, and a user
    value that would be overridden is an error rather than silently dropped."""
    merged = dict(options)
    for field_name, ours in (("env", env), ("labels", labels)):
        theirs = dict(options.get(field_name) or {})
        clash = sorted(k for k in theirs if k in ours and theirs[k] != ours[k])
        if clash:
            raise ValueError(f"job_options {field_name} sets {clash}, which the operator sets itself")
        merged[field_name] = {**theirs, **ours}
    return merged


def default_deferrable() -> bool:
    """``[trainops] default_deferrable`` (env ``AIRFLOW__TRAINOPS__DEFAULT_DEFERRABLE``), True
    when unset. Not Airflow's ``[operators] default_deferrable``, which ships False: a training
    gang runs for hours and must not hold a worker slot unless someone asks for it."""
    from airflow.configuration import conf

    return conf.getboolean("trainops", "default_deferrable", fallback=True)


def wait_here(trigger) -> dict:
    """Run ``trigger`` in this process until its first event (``deferrable=False``): the same
    waiting, polling and logging as in the triggerer, holding this worker slot."""
    import asyncio

    trigger.settle_s = 0.0  # no scheduler to race here (see trainops.triggers.job)

    async def first():
        async for event in trigger.run():
            return event.payload
        raise RuntimeError(f"{type(trigger).__name__} ended without an event")

    return asyncio.run(first())


def manifests_of(cluster: str, spec) -> list[dict]:
    """The manifests a Kubernetes attempt submitted (for job.json; no secret values are ever
    in them, only references); nothing for other backends."""
    if cluster != "kubernetes":
        return []
    from trainops.cluster.kubernetes.render import render_manifests

    return render_manifests(spec)


def node_types(state: dict) -> list[dict]:
    """Per node of a finished attempt: instance type and capacity type, when the backend knows
    them (Kubernetes, with permission to read nodes). The raw material of the cost report."""
    return [
        {
            "index": n.get("index"),
            "node_name": n.get("node_name"),
            "instance_type": n.get("instance_type"),
            "capacity_type": n.get("capacity_type"),
        }
        for n in state.get("nodes") or []
        if n.get("instance_type") or n.get("capacity_type")
    ]


def check_event(event: dict | None) -> dict:
    """A trigger event must carry a status and a job handle; anything else is a bug to report."""
    if not isinstance(event, dict) or event.get("status") not in ("finished", "timeout", "error", "gone"):
        raise RuntimeError(
            f"malformed trigger event {event!r}; expected a dict with status "
            "'finished', 'gone', 'timeout' or 'error'"
        )
    if not isinstance(event.get("handle"), dict):
        raise RuntimeError(f"trigger event without a job handle: {event!r}")
    return event
