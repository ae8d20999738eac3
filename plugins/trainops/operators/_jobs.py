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


def check_event(event: dict | None) -> dict:
    """A trigger event must carry a status and a job handle; anything else is a bug to report."""
    if not isinstance(event, dict) or event.get("status") not in ("finished", "timeout", "error"):
        raise RuntimeError(f"malformed trigger event {event!r}; expected a dict with status "
                           "'finished', 'timeout' or 'error'")
    if not isinstance(event.get("handle"), dict):
        raise RuntimeError(f"trigger event without a job handle: {event!r}")
    return event
