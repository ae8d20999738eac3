"""The lineage card of a promoted model version (``models/<name>/versions/<v>/card.json``).

:func:`build_card` gathers what the upstream operators returned and what the run left in
storage; :func:`trainops.registry.promotion.promote` adds the version, the copied files, the
trainops version and the time. Keys (docs/promotion.md lists them with an example):

- ``dataset``: name, version, URIs, rows and tokens, and ``validation``: the summary of
  its great-expectations validation (``validation.json``);
- ``run_uri``, ``config_uri``, ``config`` (the resolved trainer config) and
  ``config_sha256`` (of the ``config.yaml`` bytes);
- ``eval_basis``: what the evaluation scored (:func:`trainops.registry.regate.eval_basis`);
- ``metrics``: the candidate's and the production model's evaluation, per slice too;
- ``gate``: the decision, its checks and their definitions, and any re-gates;
- ``training``: steps, attempts, ``preemptions`` (also ``preemptions_survived``),
  ``restarts_in_place`` (torchrun's, inside the attempts; None for a run from before it), steps lost,
  ``steps_skipped`` (the step windows bad-loss rollbacks skipped, ``[[first, last], ...]``);
- ``training_cost``: what training the version cost (:func:`training_cost`, from the run's
  ``job.json`` ``cost``), every figure an estimate; None for a run that recorded no cost;
- ``lineage``: ``{"parent": {"name", "version", "uri"}}``, the weights the run started from
  (its config's ``init.from``, as the training operator resolved it: :func:`parent_of`), or
  ``{"parent": None}`` for a run from random weights. Each parent's card has its own, so the
  chain of versions can be followed back to a cold start.

- ``promoted_by``: who or what started the DAG run that promoted it (:func:`trigger_of`):
  ``{"user", "trigger", "run_id"}``; ``user`` is the DAG run's triggering user (None for a
  scheduled, asset-triggered or backfill run, whose ``trigger`` says which).

Readers of earlier cards are unaffected: ``training_cost``, ``lineage`` and ``promoted_by`` are
keys they never read.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import yaml

from trainer.storage import NotFound, Storage
from trainops.registry.errors import PromotionError
from trainops.registry.promotion import read_config_bytes
from trainops.registry.regate import eval_basis

__all__ = [
    "COST_KEYS",
    "build_card",
    "by_label",
    "parent_of",
    "training_cost",
    "trigger_of",
    "validation_summary",
]

# A promoted version's folder: <root>/models/<name>/versions/<v> (``trainer.contract.model_version_prefix``).
_VERSION_URI = re.compile(r"/models/(?P<name>[^/]+)/versions/(?P<version>\d+)/?$")

# The figures of the run's cost (``trainops.cost.accounting.RunCost``) that a card keeps; the
# per-attempt timeline stays in the run's job.json.
COST_KEYS = (
    "format",
    "currency",
    "cost",
    "on_demand_cost",
    "savings",
    "goodput",
    "billed_gpu_hours",
    "productive_gpu_hours",
    "lost_gpu_hours",
    "preemptions",
    "recovery_s",
    "seconds",
    "notes",
)


def validation_summary(storage: Storage, validation_uri: str | None) -> dict[str, Any] | None:
    """The GX validation summary of the dataset version, or None when it has none."""
    if not validation_uri:
        return None
    try:
        report = storage.get_json(validation_uri)
    except NotFound:
        return {"uri": validation_uri, "missing": True}
    report = report if isinstance(report, dict) else {}
    failed = []
    for entry in report.get("failed") or []:
        column = entry.get("column")
        failed.append(f"{entry.get('expectation')}({column})" if column else str(entry.get("expectation")))
    return {
        "uri": validation_uri,
        "success": report.get("success"),
        "evaluated_expectations": report.get("evaluated_expectations"),
        "successful_expectations": report.get("successful_expectations"),
        "rows": report.get("rows"),
        "failed": failed,
    }


def training_cost(storage: Storage, training: dict[str, Any]) -> dict[str, Any] | None:
    """The card's training-cost section: the run's cost as its ``job.json`` records it (the
    training result's ``cost`` when the record cannot be read or holds none), labelled an
    estimate, with ``job_uri`` for the per-attempt detail. None when the run recorded no cost
    (one trained before trainops accounted for cost)."""
    job_uri = training.get("job_uri")
    cost = None
    if job_uri:
        try:
            job = storage.get_json(job_uri)
        except (NotFound, ValueError):  # no record, or a damaged one: the result's copy, if any
            job = None
        cost = job.get("cost") if isinstance(job, dict) else None
    if not isinstance(cost, dict):
        cost = training.get("cost")
    if not isinstance(cost, dict):
        return None
    return {"estimate": True, **{key: cost.get(key) for key in COST_KEYS}, "job_uri": job_uri}


def parent_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The card's ``lineage.parent`` for a run's resolved ``config``: the model ``name`` and
    ``version`` its ``init.from`` names (None for a folder that is not a promoted version, such
    as another run's export), and the ``uri``; None when the run started from random weights."""
    source = (config.get("init") or {}).get("from") if isinstance(config.get("init"), dict) else None
    if not isinstance(source, str) or source in ("", "none"):
        return None
    match = _VERSION_URI.search(source)
    return {
        "name": match["name"] if match else None,
        "version": int(match["version"]) if match else None,
        "uri": source,
    }


def _read_config(storage: Storage, config_uri: str) -> tuple[bytes, dict[str, Any]]:
    data = read_config_bytes(storage, config_uri)
    try:
        config = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise PromotionError(
            f"trainer config {config_uri!r} is not valid YAML ({str(exc).splitlines()[0]})"
        ) from None
    return data, config if isinstance(config, dict) else {}


def build_card(
    storage: Storage,
    *,
    gate: dict[str, Any],
    training: dict[str, Any],
    dataset: dict[str, Any],
    evaluation: dict[str, Any],
) -> dict[str, Any]:
    """The card's lineage, from the upstream results (as their operators return them)."""
    data, config = _read_config(storage, training["config_uri"])
    return {
        "dataset": {
            **{
                key: dataset.get(key)
                for key in (
                    "dataset_name",
                    "version",
                    "uri",
                    "manifest_uri",
                    "rows",
                    "train_tokens",
                    "eval_tokens",
                    "quarantined_rows",
                )
            },
            "validation": validation_summary(storage, dataset.get("validation_uri")),
        },
        "run_uri": training["run_uri"],
        "config_uri": training["config_uri"],
        "config_sha256": hashlib.sha256(data).hexdigest(),
        "config": config,
        "eval_basis": eval_basis(config),
        "metrics": {
            "candidate": evaluation["candidate"],
            "production": evaluation.get("production"),
            "production_version": evaluation.get("production_version"),
            "metrics_uri": evaluation.get("metrics_uri"),
        },
        "gate": {
            "approved": True,
            "checks": gate["checks"],
            "gate_uri": gate.get("gate_uri"),
            "production_version": gate["production_version"],
            "check_definitions": gate.get("check_definitions"),
        },
        "training": {
            key: training.get(key)
            for key in (
                "steps",
                "attempts",
                "preemptions",
                "restarts_in_place",
                "steps_lost",
                "steps_skipped",
                "final_loss",
                "job_uri",
            )
        },
        "preemptions_survived": training.get("preemptions"),
        "steps": training.get("steps"),
        # The checkpoint mid-run evaluation picked (EvaluateCheckpointsOperator), and why; None:
        # the run's last one, as the training exported it.
        "checkpoint_pick": training.get("checkpoint_pick"),
        "training_cost": training_cost(storage, training),
        "lineage": {"parent": parent_of(config)},
    }


def trigger_of(dag_run: object) -> dict[str, str | None]:
    """Who or what started ``dag_run`` (the task context's): ``user``, Airflow 3's
    ``triggering_user_name`` (the UI or API user; None for runs the scheduler makes),
    ``trigger``, the run type (``manual``, ``scheduled``, ``asset_triggered``, ``backfill``),
    and ``run_id``. Without a DAG run (a call outside Airflow) every value is None."""
    run_type = getattr(dag_run, "run_type", None)
    user = getattr(dag_run, "triggering_user_name", None)
    return {
        "user": user if isinstance(user, str) and user else None,
        "trigger": None if run_type is None else str(getattr(run_type, "value", run_type)),
        "run_id": getattr(dag_run, "run_id", None),
    }


def by_label(trigger: dict[str, str | None]) -> str | None:
    """The pointer history's ``by`` for a promotion: the user, else ``"<trigger> run"``."""
    if trigger.get("user"):
        return trigger["user"]
    return f"{trigger['trigger']} run" if trigger.get("trigger") else None
