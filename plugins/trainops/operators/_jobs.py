"""What the job-launching operators share: run identity, trainer config, events, job records."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def task_identity(context) -> dict:
    """dag_id, run_id, task_id and map_index of the running task instance."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id,
            "map_index": map_index if map_index is not None else -1}


def job_labels(identity: dict) -> dict[str, str]:
    """Labels that find a task's live job again after a worker or scheduler restart."""
    from trainer.contract import safe_segment

    return {"trainops/dag": safe_segment(identity["dag_id"]),
            "trainops/run": safe_segment(identity["run_id"]),
            "trainops/task": safe_segment(identity["task_id"]),
            "trainops/map-index": str(identity["map_index"])}


def job_name(prefix: str, identity: dict, attempt: int) -> str:
    """A DNS-1123 name unique per run and attempt, short enough for pod names."""
    import hashlib

    digest = hashlib.sha1(f"{identity['dag_id']}/{identity['run_id']}/{identity['task_id']}/"
                          f"{identity['map_index']}".encode()).hexdigest()[:8]
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


def cluster_options(cluster: str, kubernetes_conn_id: str | None, namespace: str) -> dict:
    """What a backend (in the worker and in the trigger) needs besides its name."""
    if cluster == "kubernetes":
        return {"kubernetes_conn_id": kubernetes_conn_id, "namespace": namespace}
    return {}


def retire(cluster, handle: dict, grace_s: float, log) -> None:
    """Delete an attempt's job and wait until every pod (process) of it is gone.

    The next attempt resumes from the newest committed checkpoint; an old pod still writing
    its emergency checkpoint must not race it. Polls with a deadline: the grace period plus
    two minutes for the API server and kubelets.
    """
    import time

    cluster.delete(handle)
    deadline = time.monotonic() + grace_s + 120
    while not cluster.all_gone(handle):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {handle['job_id']} still has pods {grace_s + 120:.0f}s after its deletion; "
                               "not relaunching over it: check its pods (kubectl get pods -l trainops/job=...)")
        log.info("waiting for the pods of %s to be gone before relaunching", handle["job_id"])
        time.sleep(2)


def check_event(event: dict | None) -> dict:
    """A trigger event must carry a status and a job handle; anything else is a bug to report."""
    if not isinstance(event, dict) or event.get("status") not in ("finished", "timeout", "error"):
        raise RuntimeError(f"malformed trigger event {event!r}; expected a dict with status "
                           "'finished', 'timeout' or 'error'")
    if not isinstance(event.get("handle"), dict):
        raise RuntimeError(f"trigger event without a job handle: {event!r}")
    return event
