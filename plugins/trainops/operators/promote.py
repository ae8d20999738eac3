"""PromoteModelOperator: publish an approved model version and make it production."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from trainer.contract import RunLayout
from trainops.gate.verdict import rejection_reason
from trainops.hooks.storage import root_and_storage
from trainops.links import ModelCardLink, push_report
from trainops.operators import notes  # write_notes looked up at each call: tests replace it
from trainops.operators.base import ReportingOperator
from trainops.operators.fail_fast import fail_fast
from trainops.operators.params import known_at_run_time, name_param
from trainops.operators.production_asset import announce, production_alias
from trainops.registry.card import build_card, by_label, trigger_of
from trainops.registry.errors import MalformedPointer, RegistryNameConflict
from trainops.registry.identity import compare_with_production
from trainops.registry.promotion import ProductionMovedError, RegateRejected, promote
from trainops.registry.regate import make_regate
from trainops.registry.retention import (
    apply_plan,
    check_policy,
    plan_pruning,
    protected_runs,
    runs_scope,
    scan_runs,
)
from trainops.runs.outcome import PROMOTION_FORMAT

# The report app's XCom key for the promoted version's card (see trainops.links).
MODEL_CARD_KEY = "trainops_model_card"
ON_REJECTION = ("skip", "fail")


class PromoteModelOperator(ReportingOperator):
    """Copy the trained export to ``models/<name>/versions/<v>`` and move the production pointer.

    If the gate rejected the model, the task is skipped with a message naming the failed
    checks. If the candidate's weights are byte for byte those of the production version (the
    same data, config and seed retrained), it is skipped too, with ``identical to production
    vN (same weights sha256 ...)`` as its message and the run's note: no new version is
    published (:mod:`trainops.registry.identity`). Otherwise the next version number is claimed, the export and a lineage card
    (``card.json``, see docs/promotion.md) are written, and ``production.json`` is moved
    with a compare-and-swap write; the card's URI is pushed to XCom under
    ``trainops_model_card``.

    If production moved after the gate compared against it (another DAG run promoted
    first), the candidate is re-gated: when the new production model's card holds metrics
    on the same evaluation basis (dataset version, token windows, tokens scored), the gate's
    checks run again against them, and the candidate is either promoted from there or
    skipped with the failed checks. Otherwise the task fails without retrying, saying the
    candidate must be evaluated against the new production model.

    Nothing a pointer names is deleted: a claimed version is abandoned (its files deleted, its
    claim kept) only when the pointer, read again, names it nowhere, and a promotion whose
    pointer write took effect although the call failed (a reply lost in a storage outage) is
    reported as the promotion it was. Retrying the task reports a promotion already made.

    XCom result: ``{"model_name", "version", "version_uri", "card_uri", "production_uri",
    "previous_version", "production_version", "regated_against", "pruned"}``;
    ``production_version`` is where production is now (another version, when a later
    promotion moved it on before this task finished).

    A promotion emits an event on the Asset ``trainops://models/<name>``
    (:mod:`trainops.operators.production_asset`), its extra the version and its URI, so a
    deploy DAG can be scheduled on it; a skipped promotion emits none.

    :param model_name: name of the model in the registry, e.g. ``demo-lm`` (templated): 1 to 128
        characters, no control characters, no whitespace at either end (checked at DAG parse, or
        once rendered, before anything is written). Its registry folder must hold no other
        model's pointer: one that does is refused naming both (a folder made by trainops before
        #25 may hold another name's registry).
    :param gate: the result of EvaluationGateOperator (templated).
    :param training: the result of FSDPTrainingOperator (templated): ``export_uri``,
        ``config_uri``, ``run_uri``, ``steps``, ``preemptions`` ...
    :param dataset: the result of StageDatasetOperator (templated): ``dataset_name``,
        ``version``, ``uri``, ``validation_uri`` ...
    :param evaluation: the result of EvaluateModelOperator (templated); its metrics go
        into the card.
    :param retention: None (default: delete nothing) or ``{"keep_last_runs": N}``: after
        the promotion or the rejection, prune checkpoints of this DAG's finished runs for
        this model except the N most recent ones (:mod:`trainops.registry.retention`).
    :param storage_root: storage root URI (``file://`` or ``s3://``); defaults to the
        configured root.
    :param aws_conn_id: Airflow AWS connection used for ``s3://`` storage.
    :param cluster: accepted for uniformity with the other trainops operators; promotion
        runs in the worker.
    :param on_rejection: ``"skip"`` (default): a rejected candidate skips this task, and the
        DAG run succeeds with the rejection in its note; ``"fail"``: the task fails without
        retrying, with the same message, for teams whose alerts watch failed tasks (the DAG
        run is then failed, and shown red).
    """

    operator_extra_links = (ModelCardLink(),)
    reports_known_in_process = True  # never defers (see trainops.links)
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
        retention: dict | None = None,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        cluster: str = "local",
        on_rejection: str = "skip",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if on_rejection not in ON_REJECTION:
            raise ValueError(f"on_rejection must be one of {ON_REJECTION}, got {on_rejection!r}")
        self.on_rejection = on_rejection
        if not known_at_run_time(model_name):
            name_param("model_name", model_name)  # else when the task runs, once rendered
        self.outlets = [*self.outlets, production_alias()]  # trainops://models/<name>, on a move
        self.model_name = model_name
        self.gate = gate
        self.training = training
        self.dataset = dataset
        self.evaluation = evaluation
        self.retention = check_policy(retention)
        self.storage_root = storage_root
        self.aws_conn_id = aws_conn_id
        self.cluster = cluster

    @fail_fast
    def execute(self, context: Context) -> dict:
        name_param("model_name", self.model_name)  # before anything is read or written
        gate = _require(self.gate, "gate", ("approved", "checks", "production_version"))
        try:
            return self._promote(context, gate)
        except (RegistryNameConflict, MalformedPointer) as exc:
            # A person must move a registry or mend a pointer: every retry would fail the same way.
            raise AirflowFailException(str(exc)) from exc

    def _promote(self, context: Context, gate: dict) -> dict:
        """:meth:`execute` once the name and the gate result are checked."""
        root, storage = root_and_storage(self.storage_root, self.aws_conn_id)
        if not gate["approved"]:
            if self.retention is not None:
                self._prune(storage, root, _require(self.training, "training", ("run_uri",)))
            message = f"not promoting {self.model_name}: {rejection_reason(gate)}"
            if self.on_rejection == "fail":
                raise AirflowFailException(message)
            raise AirflowSkipException(message)
        training = _require(self.training, "training", ("export_uri", "config_uri", "run_uri"))
        dataset = _require(self.dataset, "dataset", ("dataset_name", "version", "uri"))
        evaluation = _require(self.evaluation, "evaluation", ("candidate",))
        gated_name = gate.get("model_name") or evaluation.get("model_name")
        if gated_name and gated_name != self.model_name:
            raise ValueError(
                f"the gate compared model {gated_name!r}, but model_name is {self.model_name!r}; "
                "pass the same model_name to EvaluateModelOperator and PromoteModelOperator"
            )

        compared = compare_with_production(
            storage, root, self.model_name, export_uri=training["export_uri"], run_uri=training["run_uri"]
        )
        if compared is not None and compared["identical"]:
            self._record(storage, training, "identical", compared["version"])
            self._prune(storage, root, training)
            self._skip_identical(context, compared)
        card = build_card(storage, gate=gate, training=training, dataset=dataset, evaluation=evaluation)
        if compared is not None and compared["weights_sha256"]:
            card["weights_sha256"] = compared["weights_sha256"]  # the next comparison reads one side
        card["promoted_by"] = trigger_of(context.get("dag_run"))
        regate = make_regate(
            storage,
            root,
            self.model_name,
            gate=gate,
            candidate=evaluation["candidate"],
            basis=card["eval_basis"],
            log=self.log,
        )
        try:
            result = promote(
                storage,
                root,
                self.model_name,
                export_uri=training["export_uri"],
                card=card,
                expected_production_version=gate["production_version"],
                regate=regate,
                by=by_label(card["promoted_by"]),
            )
        except RegateRejected as exc:
            self._record(storage, training, "regate_rejected", None)
            self._prune(storage, root, training)
            note = f"REJECTED on re-gate: {exc}; promote skipped, production unchanged."
            self._skip(context, str(exc), note)
        except ProductionMovedError as exc:
            # Retrying this task cannot help: the comparison is stale and cannot be redone here.
            raise AirflowFailException(str(exc)) from exc
        push_report(self, context, MODEL_CARD_KEY, result["card_uri"])
        was = f"v{result['previous_version']}" if result["previous_version"] is not None else "none"
        regated = "".join(f", re-gated against v{v}" for v in result["regated_against"])
        who = by_label(card["promoted_by"])
        self.log.info(
            "promoted %s v%d (was %s%s)%s; card %s",
            self.model_name,
            result["version"],
            was,
            regated,
            f" for {who}" if who else "",
            result["card_uri"],
        )
        if result["production_version"] != result["version"]:
            self.log.info(
                "production of %s has since moved on to v%s",
                self.model_name,
                result["production_version"],
            )
        version, previous = result["version"], result["previous_version"]
        self._record(storage, training, "promoted", version)
        announce(context, "promote", self.model_name, version, result["version_uri"], previous, who)
        pruned = self._prune(storage, root, training)
        return {"model_name": self.model_name, **result, "pruned": pruned}

    def _record(self, storage, training: dict, outcome: str, version: int | None) -> None:
        """Write what became of the candidate (``eval/promotion.json``), for ``python -m
        trainops runs`` and the home page; a failure is logged, never fatal (the pointer and
        the notes already say it)."""
        record = {
            "format": PROMOTION_FORMAT,
            "outcome": outcome,
            "model_name": self.model_name,
            "version": version,
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        try:
            storage.put_json(RunLayout(training["run_uri"]).promotion, record)
        except Exception as exc:
            self.log.warning("could not record the promotion outcome %r: %s", outcome, exc)

    def _skip_identical(self, context: Context, compared: dict) -> NoReturn:
        """Skip: the candidate is production already."""
        same = (
            f"identical to production v{compared['version']} "
            f"(same weights sha256 {compared['weights_sha256']}); nothing new to publish"
        )
        self._skip(context, same, f"NOT PROMOTED: {self.model_name} is {same}; production unchanged.")

    def _skip(self, context: Context, reason: str, note: str) -> NoReturn:
        """Skip with ``reason`` as the task's message, and ``note`` on the run's and the task's
        notes (the gate wrote none: it approved)."""
        notes.write_notes(context, run_note=note, task_note=note, log=self.log)
        raise AirflowSkipException(f"not promoting {self.model_name}: {reason}")

    def _prune(self, storage, root: str, training: dict) -> list[str]:
        """Apply the retention policy (if any); a failure is logged, never fatal."""
        if self.retention is None:
            return []

        try:
            runs = scan_runs(storage, runs_scope(training["run_uri"]), self.model_name)
            protected = protected_runs(storage, root, self.model_name)
            plan = plan_pruning(runs, protected=protected, keep_last_runs=self.retention["keep_last_runs"])
            deleted = apply_plan(storage, plan, runs, protected)
        except Exception as exc:
            self.log.warning("retention %s: pruning failed, nothing more deleted: %s", self.retention, exc)
            return []
        for item in plan:
            self.log.info("retention: deleted step %d of %s (%s)", item["step"], item["run_uri"], item["why"])
        self.log.info(
            "retention %s: deleted %d checkpoints of %d finished runs",
            self.retention,
            len(deleted),
            len(runs),
        )
        return deleted


def _require(value: Any, what: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise ValueError(
            f"{what} must be the dict returned by the upstream trainops operator, "
            f"got {type(value).__name__} {str(value)[:200]!r}"
        )
    missing = [key for key in keys if key not in value]
    if missing:
        raise ValueError(
            f"{what} result lacks {missing[0]!r} (has {sorted(value)}); "
            f"pass the XCom result of the upstream trainops operator"
        )
    return value
