"""PromoteModelOperator: publish an approved model version and make it production."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainops.gate import failed_checks


class PromoteModelOperator(BaseOperator):
    """Copy the trained export to ``models/<name>/versions/<v>`` and move the production pointer.

    If the gate rejected the model, the task is skipped with a message naming the failed
    checks. Otherwise the next version number is claimed, the export and a lineage card
    (``card.json``: dataset, run, config hash, metrics, gate decision, preemptions) are
    written, and ``production.json`` is moved with a compare-and-swap write. If production
    changed after the gate compared against it, the task fails without retrying: the
    comparison is stale and the run must be evaluated again.

    XCom result: ``{"model_name", "version", "version_uri", "production_uri",
    "previous_version"}``.

    :param model_name: name of the model in the registry, e.g. ``demo-lm`` (templated).
    :param gate: the result of EvaluationGateOperator (templated).
    :param training: the result of FSDPTrainingOperator (templated): ``export_uri``,
        ``config_uri``, ``run_uri``, ``steps``, ``preemptions`` ...
    :param dataset: the result of StageDatasetOperator (templated): ``dataset_name``,
        ``version``, ``uri`` ...
    :param evaluation: the result of EvaluateModelOperator (templated); its metrics go
        into the card.
    :param storage_root: storage root URI (``file://`` or ``s3://``); defaults to the
        configured root.
    :param aws_conn_id: Airflow AWS connection used for ``s3://`` storage.
    :param cluster: accepted for uniformity with the other trainops operators; promotion
        runs in the worker.
    """

    template_fields: Sequence[str] = ("model_name", "gate", "training", "dataset", "evaluation")
    ui_color = "#c8e6c9"

    def __init__(
        self,
        *,
        model_name: str,
        gate: Any,
        training: Any,
        dataset: Any,
        evaluation: Any,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        cluster: str = "local",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model_name = model_name
        self.gate = gate
        self.training = training
        self.dataset = dataset
        self.evaluation = evaluation
        self.storage_root = storage_root
        self.aws_conn_id = aws_conn_id
        self.cluster = cluster

    def execute(self, context: Context) -> dict:
        from trainops.promotion import ProductionMovedError, config_sha256, promote
        from trainops.settings import resolve_storage_root
        from trainops.storage_conn import storage_for

        gate = _require(self.gate, "gate", ("approved", "checks", "production_version"))
        if not gate["approved"]:
            raise AirflowSkipException(f"not promoting {self.model_name}: {_rejection(gate)}")
        training = _require(self.training, "training", ("export_uri", "config_uri", "run_uri"))
        dataset = _require(self.dataset, "dataset", ("dataset_name", "version", "uri"))
        evaluation = _require(self.evaluation, "evaluation", ("candidate",))
        gated_name = gate.get("model_name") or evaluation.get("model_name")
        if gated_name and gated_name != self.model_name:
            raise ValueError(
                f"the gate compared model {gated_name!r}, but model_name is {self.model_name!r}; "
                "pass the same model_name to EvaluateModelOperator and PromoteModelOperator"
            )

        root = resolve_storage_root(self.storage_root)
        storage = storage_for(root, self.aws_conn_id)
        card = {
            "dataset": {key: dataset.get(key) for key in
                        ("dataset_name", "version", "uri", "manifest_uri", "rows",
                         "train_tokens", "eval_tokens")},
            "run_uri": training["run_uri"],
            "config_uri": training["config_uri"],
            "config_sha256": config_sha256(storage, training["config_uri"]),
            "metrics": {"candidate": evaluation["candidate"],
                        "production": evaluation.get("production"),
                        "metrics_uri": evaluation.get("metrics_uri")},
            "gate": {"approved": True, "checks": gate["checks"], "gate_uri": gate.get("gate_uri"),
                     "production_version": gate["production_version"]},
            "training": {key: training.get(key) for key in
                         ("steps", "attempts", "preemptions", "steps_lost", "final_loss")},
            "preemptions_survived": training.get("preemptions"),
            "steps": training.get("steps"),
        }
        try:
            result = promote(storage, root, self.model_name, export_uri=training["export_uri"],
                             card=card, expected_production_version=gate["production_version"])
        except ProductionMovedError as exc:
            # Retrying this task cannot help: the gate's comparison is stale.
            raise AirflowFailException(str(exc)) from exc
        was = f"v{result['previous_version']}" if result["previous_version"] is not None else "none"
        self.log.info("promoted %s v%d (was %s)", self.model_name, result["version"], was)
        return {"model_name": self.model_name, **result}


def _require(value: Any, what: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be the dict returned by the upstream trainops operator, "
                         f"got {type(value).__name__} {str(value)[:200]!r}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise ValueError(f"{what} result lacks {missing[0]!r} (has {sorted(value)}); "
                         f"pass the XCom result of the upstream trainops operator")
    return value


def _rejection(gate: dict) -> str:
    failed = failed_checks(gate)
    if not failed:
        return "the gate rejected it"
    parts = []
    for check in failed:
        observed = (f"{check['observed']:.6g}" if check.get("observed") is not None
                    else check.get("note") or "missing")
        part = f"{check['name']} (observed {observed}, expected {check.get('expected') or '-'})"
        parts.append(part)
    return "the gate rejected it: " + "; ".join(parts)
