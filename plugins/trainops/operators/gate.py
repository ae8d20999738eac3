"""EvaluationGateOperator: decide whether a candidate model may be promoted."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import Context

from trainer.contract import RunLayout
from trainer.storage import StorageUnavailable
from trainops.gate.checks import (
    DEFAULT_CHECKS,
    SLICE_KINDS,
    check_evaluation,
    decide,
    failed_checks,
    format_table,
    validate_checks,
)
from trainops.gate.slices import build_expectations, slice_rows
from trainops.gate.verdict import approval_note, rejection_note
from trainops.hooks.storage import get_json_object, storage_for
from trainops.links import GateDecisionLink, push_report
from trainops.operators import notes  # write_notes looked up at each call: tests replace it
from trainops.operators.base import ReportingOperator
from trainops.operators.fail_fast import fail_fast
from trainops.settings import resolve_storage_root

# The report app's XCom key for the gate decision (see trainops.links).
GATE_REPORT_KEY = "trainops_gate_report"


class EvaluationGateOperator(ReportingOperator):
    """Check a candidate's evaluation metrics against thresholds, the production model and
    per-slice expectations.

    The decision, with every check's observed value and verdict, is logged as a table,
    written to ``<run_uri>/eval/gate.json`` (its URI pushed to XCom under
    ``trainops_gate_report``) and returned. A rejection does not fail the task: the promote
    task downstream skips instead, naming the failed checks. The rejection is written on the
    DAG run's note and this task's note (failed checks, observed against expected, the
    decision's URI; see :mod:`trainops.operators.notes` for how a task writes a note), so a
    rejected run does not pass for a promoted one. ``on_reject`` can notify someone.

    Checks are validated when the DAG is parsed, so a broken gate definition shows up as a
    DAG import error rather than after hours of training. Numeric fields may be templates
    (``"{{ params.max_eval_loss }}"``); the rendered checks are validated again before
    anything is decided.

    XCom result: ``{"approved", "gate_uri", "checks", "check_definitions",
    "production_version", "model_name", "run_uri"}``; ``checks`` is one dict per check with
    ``name``, ``kind``, ``metric``, ``observed``, ``expected``, ``passed`` and ``note``
    (slice checks add ``slices``, the failing ones); ``check_definitions`` are the
    validated checks, which the promote task re-runs if production moves meanwhile.

    :param evaluation: the result of EvaluateModelOperator (templated), with ``run_uri``,
        ``model_name``, ``candidate`` metrics and ``production`` metrics (or None) and
        ``production_version``.
    :param checks: check definitions (templated: a list is validated when the DAG is parsed, an
        XCom or a template string once rendered), for example
        ``[{"kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 3.5},
        {"kind": "no_regression", "metric": "eval_loss", "tolerance": 0.01},
        {"kind": "slice_no_regression", "tolerance": 0.05}]``; every kind is in
        docs/promotion.md. Defaults to :data:`trainops.gate.checks.DEFAULT_CHECKS`.
    :param on_reject: called with the decision (the XCom result) when the candidate is
        rejected, e.g. to post to a chat channel. An exception it raises is logged and does
        not change the decision.
    :param storage_root: storage root URI (``file://`` or ``s3://``); defaults to the
        configured root.
    :param aws_conn_id: Airflow AWS connection used for ``s3://`` storage.
    :param cluster: accepted for uniformity with the other trainops operators; the gate
        runs in the worker.
    """

    operator_extra_links = (GateDecisionLink(),)
    reports_known_in_process = True  # never defers (see trainops.links)
    template_fields: Sequence[str] = ("evaluation", "checks")
    ui_color = "#f0e4b8"

    def __init__(
        self,
        *,
        evaluation: Any,
        checks: list[dict] | Any | None = None,
        on_reject: Callable[[dict], Any] | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        cluster: str = "local",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if on_reject is not None and not callable(on_reject):
            raise TypeError(
                f"on_reject must be a callable taking the gate decision, got "
                f"{type(on_reject).__name__} {on_reject!r}"
            )
        self.evaluation = evaluation
        # A list is checked now, when the DAG is parsed; an XCom or a template string once
        # rendered, before anything is decided (execute).
        if checks is None or isinstance(checks, (list, tuple)):
            self.checks = validate_checks(DEFAULT_CHECKS if checks is None else checks, templates="allow")
        else:
            self.checks = checks
        self.on_reject = on_reject
        self.storage_root = storage_root
        self.aws_conn_id = aws_conn_id
        self.cluster = cluster

    def report_uri(self, context: Mapping[str, Any]) -> str | None:
        """The decision's ``eval/gate.json``, under the run the (rendered) evaluation names;
        None when the evaluation is not a mapping with a ``run_uri`` (``execute`` says why)."""
        run_uri = self.evaluation.get("run_uri") if isinstance(self.evaluation, Mapping) else None
        return RunLayout(run_uri).eval_gate if isinstance(run_uri, str) and run_uri else None

    @fail_fast
    def execute(self, context: Context) -> dict:
        # Rendered now: validate again, and let GX refuse a slice expectation up front.
        checks = validate_checks(self.checks, templates="rendered")
        slice_checks = [c for c in checks if c["kind"] in SLICE_KINDS]
        if slice_checks:
            build_expectations(slice_checks)
        evaluation = check_evaluation(self.evaluation, checks)
        root = resolve_storage_root(self.storage_root)
        decision = decide(
            checks,
            evaluation["candidate"],
            evaluation.get("production"),
            evaluation.get("production_version"),
            self._paired(root, checks, evaluation),
        )
        self.log.info(
            "evaluation gate for %s, run %s\n%s",
            evaluation["model_name"],
            evaluation["run_uri"],
            format_table(decision),
        )

        run_uri = evaluation["run_uri"]
        _same_scheme(root, run_uri)
        gate_uri = RunLayout(run_uri).eval_gate
        record = {
            **decision,
            "check_definitions": checks,
            "model_name": evaluation["model_name"],
            "run_uri": run_uri,
            "metrics_uri": evaluation.get("metrics_uri"),
            "decided_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if slice_checks:
            record["slice_table"] = slice_rows(evaluation["candidate"], evaluation.get("production"))
        storage_for(root, self.aws_conn_id).put_json(gate_uri, record)
        push_report(self, context, GATE_REPORT_KEY, gate_uri)
        verdict = "approved" if decision["approved"] else "rejected"
        self.log.info("%s %s; decision written to %s", evaluation["model_name"], verdict, gate_uri)
        result = {
            "approved": decision["approved"],
            "gate_uri": gate_uri,
            "checks": decision["checks"],
            "check_definitions": checks,
            "production_version": decision["production_version"],
            "model_name": evaluation["model_name"],
            "run_uri": run_uri,
        }
        if not decision["approved"]:
            self.log.warning(
                "%s rejected: %s failed; promotion will be skipped",
                evaluation["model_name"],
                ", ".join(repr(c["name"]) for c in failed_checks(decision)),
            )
        self._leave_notes(context, result)
        if not decision["approved"]:
            self._notify(result)
        return result

    def _paired(self, root: str, checks: list[dict], evaluation: Mapping[str, Any]) -> dict | None:
        """Each record's figures of both models, read only for a ``no_regression`` check with
        ``confidence`` against a production model: the evaluation's ``records_uri`` document,
        or ``{"problem": why}`` when it cannot be used (the check then compares the totals and
        says why); only a storage outage fails the gate (its try: a retry decides)."""
        wanted = evaluation.get("production") is not None and any(c.get("confidence") for c in checks)
        if not wanted:
            return None
        uri = evaluation.get("records_uri")
        if not isinstance(uri, str) or not uri:
            return {
                "problem": "the evaluation names no per-record figures (records_uri); re-run it with this trainops"
            }
        if uri.split("://", 1)[0] != root.split("://", 1)[0]:
            return {"problem": f"records_uri {uri!r} is not on the storage root {root!r}"}
        try:
            document = get_json_object(storage_for(root, self.aws_conn_id), uri)
        except StorageUnavailable:
            # An outage: deciding on the totals now would decide otherwise than with the
            # records later. This try fails; a retry decides once storage answers.
            raise
        except Exception as exc:  # a missing or damaged file: the totals decide, and say so
            return {"problem": f"could not read {uri}: {exc}"}
        return _same_models(document, evaluation, uri)

    def _leave_notes(self, context: Context, result: dict) -> None:
        """Say what decided on the DAG run's note and this task's note, where a person looks
        first: the failed checks of a rejection, every check's metric of an approval."""
        note = approval_note(result) if result["approved"] else rejection_note(result)
        how = notes.write_notes(context, run_note=note, task_note=note, log=self.log)
        if how is not None:
            self.log.info("the DAG run's note says why (written through the %s)", how)

    def _notify(self, result: dict) -> None:
        if self.on_reject is None:
            return
        try:
            self.on_reject(result)
        except Exception:
            self.log.exception(
                "on_reject callback %r failed; the rejection stands",
                getattr(self.on_reject, "__qualname__", self.on_reject),
            )


def _same_models(document: object, evaluation: Mapping[str, Any], uri: str) -> dict:
    """``document`` when it holds the per-record figures of the very models the evaluation
    compares (an evaluation run again writes the file again), else ``{"problem": why}``."""
    if not isinstance(document, dict):
        return {"problem": f"{uri} is not a JSON object"}
    for side, key in (("candidate", "candidate"), ("production", "baseline")):
        ours = (evaluation.get(side) or {}).get("model_uri")
        theirs = document.get(f"{key}_uri")
        if ours and theirs != ours:
            return {
                "problem": f"{uri} holds the figures of {theirs or 'an unnamed model'}, not of the {side} {ours}"
            }
    return document


def _same_scheme(root: str, uri: str) -> None:
    # One storage client serves the whole root; a run elsewhere would need other credentials.
    if root.split("://", 1)[0] != uri.split("://", 1)[0]:
        raise ValueError(
            f"run_uri {uri!r} is not on the same storage as storage_root {root!r}; "
            "pass the storage_root the evaluation used"
        )
