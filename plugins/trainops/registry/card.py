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
- ``training``: steps, attempts, ``preemptions`` (also ``preemptions_survived``), steps lost.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trainer.storage import NotFound, Storage
from trainops.registry.errors import PromotionError
from trainops.registry.promotion import read_config_bytes
from trainops.registry.regate import eval_basis

__all__ = ["build_card", "validation_summary"]


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


def _read_config(storage: Storage, config_uri: str) -> tuple[bytes, dict[str, Any]]:
    import yaml

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
            for key in ("steps", "attempts", "preemptions", "steps_lost", "final_loss", "job_uri")
        },
        "preemptions_survived": training.get("preemptions"),
        "steps": training.get("steps"),
    }
