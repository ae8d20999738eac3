"""EvaluationGateOperator: decide whether a candidate model may be promoted."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from airflow.sdk import BaseOperator, Context

from trainops.gate import DEFAULT_CHECKS, check_evaluation, decide, format_table, validate_checks


class EvaluationGateOperator(BaseOperator):
    """Check a candidate's evaluation metrics against thresholds and the production model.

    The decision is logged as a table, written to ``<run_uri>/eval/gate.json`` and returned.
    A rejection does not fail the task: the promote task downstream skips instead, so the
    run stays green and the reason is in one place.

    Checks are validated when the DAG is parsed, so a broken gate definition shows up as a
    DAG import error rather than after hours of training.

    XCom result: ``{"approved", "gate_uri", "checks", "production_version", "model_name",
    "run_uri"}``; ``checks`` is one dict per check with ``name``, ``kind``, ``metric``,
    ``observed``, ``expected``, ``passed`` and ``note``.

    :param evaluation: the result of EvaluateModelOperator (templated), with ``run_uri``,
        ``model_name``, ``candidate`` metrics and ``production`` metrics (or None) and
        ``production_version``.
    :param checks: check definitions, for example
        ``[{"kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 3.5},
        {"kind": "no_regression", "metric": "eval_loss", "tolerance": 0.01}]``;
        defaults to :data:`trainops.gate.DEFAULT_CHECKS`.
    :param storage_root: storage root URI (``file://`` or ``s3://``); defaults to the
        configured root.
    :param aws_conn_id: Airflow AWS connection used for ``s3://`` storage.
    :param cluster: accepted for uniformity with the other trainops operators; the gate
        runs in the worker.
    """

    template_fields: Sequence[str] = ("evaluation",)
    ui_color = "#f0e4b8"

    def __init__(
        self,
        *,
        evaluation: Any,
        checks: list[dict] | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        cluster: str = "local",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.evaluation = evaluation
        self.checks = validate_checks(DEFAULT_CHECKS if checks is None else checks)
        self.storage_root = storage_root
        self.aws_conn_id = aws_conn_id
        self.cluster = cluster

    def execute(self, context: Context) -> dict:
        from trainer.contract import RunLayout
        from trainops.settings import resolve_storage_root
        from trainops.storage_conn import storage_for

        evaluation = check_evaluation(self.evaluation, self.checks)
        decision = decide(
            self.checks,
            evaluation["candidate"],
            evaluation.get("production"),
            evaluation.get("production_version"),
        )
        self.log.info("evaluation gate for %s, run %s\n%s", evaluation["model_name"],
                      evaluation["run_uri"], format_table(decision))

        root = resolve_storage_root(self.storage_root)
        run_uri = evaluation["run_uri"]
        _same_scheme(root, run_uri)
        gate_uri = RunLayout(run_uri).eval_gate
        storage_for(root, self.aws_conn_id).put_json(gate_uri, {
            **decision,
            "model_name": evaluation["model_name"],
            "run_uri": run_uri,
            "metrics_uri": evaluation.get("metrics_uri"),
            "decided_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })
        verdict = "approved" if decision["approved"] else "rejected"
        self.log.info("%s %s; decision written to %s", evaluation["model_name"], verdict, gate_uri)
        return {
            "approved": decision["approved"],
            "gate_uri": gate_uri,
            "checks": decision["checks"],
            "production_version": decision["production_version"],
            "model_name": evaluation["model_name"],
            "run_uri": run_uri,
        }


def _same_scheme(root: str, uri: str) -> None:
    # One storage client serves the whole root; a run elsewhere would need other credentials.
    if root.split("://", 1)[0] != uri.split("://", 1)[0]:
        raise ValueError(
            f"run_uri {uri!r} is not on the same storage as storage_root {root!r}; "
            "pass the storage_root the evaluation used"
        )
