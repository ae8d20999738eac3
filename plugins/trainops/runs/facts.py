"""What storage holds about a run and a model, read for the terminal (no Airflow): a run's
``job.json``, its metrics (progress), ``config.yaml`` (``train.max_steps``), the gate's
decision, the promotion record, and the production pointer of the model it was judged for."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import yaml

from trainer.contract import MetricsReader, RunLayout, join, safe_segment
from trainer.storage import NotFound, Storage, StorageError
from trainops.runs.outcome import RunFacts
from trainops.runs.progress import progress
from trainops.runs.refs import RunRef


def json_at(store: Storage, uri: str) -> dict[str, Any] | None:
    """The JSON object at ``uri``; None when it is not there or is not an object."""
    try:
        data = json.loads(store.get(uri))
    except (NotFound, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def max_steps(store: Storage, layout: RunLayout) -> int | None:
    try:
        config = yaml.safe_load(store.get(layout.config))
    except (NotFound, yaml.YAMLError):
        return None
    train = config.get("train") if isinstance(config, dict) else None
    value = train.get("max_steps") if isinstance(train, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def pointer(store: Storage, root: str, model: str) -> dict[str, Any] | None:
    """``models/<model>/production.json``, or None."""
    return json_at(store, join(root, "models", safe_segment(model), "production.json"))


def _promoted_version(history: list[Any], run_uri: str) -> int | None:
    for entry in history:
        if (
            isinstance(entry, Mapping)
            and entry.get("action") == "promote"
            and entry.get("run_uri") == run_uri
        ):
            version = entry.get("version")
            return version if isinstance(version, int) else None
    return None


def read_facts(
    store: Storage, ref: RunRef, *, now: float | None = None, with_progress: bool = True
) -> RunFacts:
    """Everything :func:`trainops.runs.outcome.outcome` and ``status`` need about ``ref``.
    Raises StorageError when storage cannot be read (not for a missing file)."""
    layout = RunLayout(ref.run_uri)
    job = json_at(store, layout.job)
    if job is None:
        return RunFacts(
            ref.run_uri, ref.dag_id, ref.run_id, ref.task, problem=f"no readable job.json at {layout.job}"
        )
    airflow = _dict(job.get("airflow"))
    run_id = str(airflow.get("run_id") or ref.run_id)
    attempts = [a for a in _list(job.get("attempts")) if isinstance(a, dict)]
    last = attempts[-1] if attempts else {}
    decision = _dict(last.get("decision"))
    status = job.get("status") if isinstance(job.get("status"), str) else None
    cost = _dict(job.get("cost"))
    gate = json_at(store, layout.eval_gate)
    if gate is not None:  # a damaged decision: its verdict, with the checks that can be read
        gate = {**gate, "checks": [c for c in _list(gate.get("checks")) if isinstance(c, dict)]}
    model = (gate or {}).get("model_name")
    promoted = None
    if isinstance(model, str) and ref.root:
        found = pointer(store, ref.root, model)
        promoted = _promoted_version(_list((found or {}).get("history")), ref.run_uri)
    step = eta = limit = None
    if with_progress and status == "running":
        limit = max_steps(store, layout)
        here = progress(
            MetricsReader(store, ref.run_uri).records(), limit, time.time() if now is None else now
        )
        if here is not None:
            step, eta = here["step"], here["eta_s"]
    return RunFacts(
        ref.run_uri,
        ref.dag_id,
        run_id,
        ref.task,
        status=status,
        failure=str(decision.get("reason")) if status == "failed" and decision.get("reason") else None,
        step=step,
        max_steps=limit,
        eta_s=eta,
        gate=gate,
        promotion=json_at(store, layout.promotion),
        promoted_version=promoted,
        model_name=model if isinstance(model, str) else None,
        started_at=(str(attempts[0].get("launched_at") or "") or None) if attempts else None,
        ended_at=(str(last.get("ended_at") or "") or None) if status in ("succeeded", "failed") else None,
        cost=cost.get("cost") if isinstance(cost.get("cost"), int | float) else None,
        attempts=len(attempts),
    )


def read_job(store: Storage, ref: RunRef) -> dict[str, Any]:
    """The run's job.json; StorageError (NotFound) when missing."""
    data = json_at(store, RunLayout(ref.run_uri).job)
    if data is None:
        raise NotFound(f"no readable job.json at {RunLayout(ref.run_uri).job}")
    return data


__all__ = ["StorageError", "max_steps", "pointer", "read_facts", "read_job"]
