"""Re-gating a candidate when production moved between its gate and its promotion.

The gate compared the candidate with the production model that EvaluateModelOperator
evaluated on the candidate's own eval split. If another DAG run promotes first, that
comparison is stale, and the new production model was never evaluated in this run. Its
``card.json`` holds the metrics of its own evaluation, which can stand in for a fresh one
only when both evaluations scored the same tokens the same way:

- the same dataset version (``data_uri``: same records, same eval split, same tokenizer);
- the same token windows (``train.seq_len``) and, when the evaluation is capped
  (``eval.max_batches`` > 0), the same cap and batch size;
- and, as a check on all of that, the same number of tokens evaluated.

This set is the **evaluation basis**, recorded in every card. When the bases match, the
gate's own check definitions run again with the new production model's card metrics in
place of production's (threshold checks give the same answer as before). Otherwise there
is nothing honest to compare, and promotion stops saying the candidate must be evaluated
again. Losses of models evaluated on different splits are never compared.

:func:`eval_basis`, :func:`comparability`, :func:`regate` and :func:`rejected_message` are
pure; :func:`make_regate` wires them to storage for :func:`trainops.registry.promotion.promote`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from trainer.storage import NotFound, Storage
from trainops.gate.checks import decide, failed_checks, format_table
from trainops.registry.errors import ProductionMovedError, RegateRejected, version_label
from trainops.registry.pointer import Pointer
from trainops.registry.promotion import card_uri

__all__ = ["BASIS_FIELDS", "comparability", "eval_basis", "make_regate", "regate", "rejected_message"]

BASIS_FIELDS = ("data_uri", "seq_len", "max_batches", "batch_size")


class _Log(Protocol):
    def info(self, event: Any, /, *args: Any) -> Any: ...


def eval_basis(config: object) -> dict[str, Any]:
    """The evaluation basis of a run, from its resolved trainer config (``config.yaml``)."""
    config = config if isinstance(config, dict) else {}
    train = config["train"] if isinstance(config.get("train"), dict) else {}
    evaluation = config["eval"] if isinstance(config.get("eval"), dict) else {}
    max_batches = int(evaluation.get("max_batches") or 0)
    return {
        "data_uri": config.get("data_uri") or None,
        "seq_len": train.get("seq_len", 64),
        "max_batches": max_batches,
        # Without a cap every window is scored whatever the batch size.
        "batch_size": evaluation.get("batch_size", 8) if max_batches else None,
    }


def comparability(basis: dict[str, Any], candidate: dict[str, Any], card: object, version: int) -> str | None:
    """None when the card's metrics are comparable with the candidate's; otherwise why not,
    as a clause of a sentence (``"v3 was evaluated on ..."``)."""
    if not isinstance(card, dict):
        return f"v{version} has no model card to compare with"
    theirs = card.get("eval_basis")
    if not isinstance(theirs, dict):
        return f"v{version}'s card records no evaluation basis (it predates re-gating)"
    if not basis.get("data_uri"):
        return "this run's trainer config names no data_uri"
    for field in BASIS_FIELDS:
        if theirs.get(field) != basis.get(field):
            return (
                f"v{version} was evaluated with {field} {theirs.get(field)!r}, this "
                f"candidate with {basis.get(field)!r}, so their losses are not comparable"
            )
    metrics = (card.get("metrics") or {}).get("candidate")
    if not isinstance(metrics, dict):
        return f"v{version}'s card holds no evaluation metrics"
    if metrics.get("tokens") != candidate.get("tokens"):
        return (
            f"v{version} was scored on {metrics.get('tokens')} tokens, this candidate on "
            f"{candidate.get('tokens')}, so their losses are not comparable"
        )
    return None


def regate(
    checks: list[dict[str, Any]], candidate: dict[str, Any], card: dict[str, Any], version: int
) -> dict[str, Any]:
    """The gate's checks again, with production v``version``'s card metrics as production.

    Returns the decision plus ``production_version``, ``against`` (where the production
    metrics came from) and ``decided_at``; the caller has checked :func:`comparability`.
    """
    production = card["metrics"]["candidate"]
    decision = decide(checks, candidate, production, version)
    return {
        **decision,
        "against": f"card of v{version} (same evaluation basis)",
        "decided_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def rejected_message(model: str, expected: int | None, decision: dict[str, Any]) -> str:
    """Why a re-gated candidate stops: production moved and it fails against the new one."""
    version = decision["production_version"]
    parts = []
    for check in failed_checks(decision):
        observed = (
            f"{check['observed']:.6g}"
            if check.get("observed") is not None
            else check.get("note") or "missing"
        )
        note = f"; {check['note']}" if check.get("note") else ""
        parts.append(f"{check['name']} (observed {observed}, expected {check.get('expected') or '-'}{note})")
    return (
        f"production of {model!r} moved from {version_label(expected)} to v{version} while this run was "
        f"gated; re-gated against v{version}, the candidate fails: " + "; ".join(parts)
    )


# ------------------------------------------------------------------------- storage I/O


def make_regate(
    storage: Storage,
    root: str,
    model: str,
    *,
    gate: dict[str, Any],
    candidate: dict[str, Any],
    basis: dict[str, Any],
    log: _Log,
) -> Callable[[Pointer | None], dict[str, Any]]:
    """The ``regate`` callable for :func:`trainops.registry.promotion.promote`.

    Each call gets the pointer as now read. It reads the new production version's card,
    re-runs the gate's ``check_definitions`` against it when the bases match, logs the table,
    appends the outcome to ``gate.json``'s ``regates``, and returns the decision or raises:
    :class:`~trainops.registry.errors.RegateRejected` when a check fails,
    :class:`~trainops.registry.errors.ProductionMovedError` (with the reason) when there is
    nothing comparable.
    """
    definitions = gate.get("check_definitions")
    state: dict[str, int | None] = {"expected": gate.get("production_version")}

    def regate_against(pointer: Pointer | None) -> dict[str, Any]:
        version = pointer["version"] if pointer else None
        expected = state["expected"]
        reason = None
        decision: dict[str, Any] = {}
        if not definitions:
            reason = "the gate result carries no check definitions to re-run"
        elif pointer is None:
            decision = {
                **decide(definitions, candidate, None, None),
                "against": "no production model",
                "decided_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
        else:
            card = _read_card(storage, card_uri(root, model, pointer["version"]))
            reason = comparability(basis, candidate, card, pointer["version"])
            if reason is None and card is not None:
                decision = regate(definitions, candidate, card, pointer["version"])
        if reason is not None:
            _record(
                storage,
                gate.get("gate_uri"),
                {
                    "production_version": version,
                    "moved_from": expected,
                    "approved": None,
                    "reason": reason,
                    "decided_at": datetime.now(UTC).isoformat(timespec="seconds"),
                },
            )
            raise ProductionMovedError(model, expected, version, pointer=pointer, reason=reason)
        log.info(
            "production of %s moved from %s to %s after this run was gated; re-gating against it\n%s",
            model,
            version_label(expected),
            version_label(version),
            format_table(decision),
        )
        record = {**decision, "moved_from": expected}
        _record(storage, gate.get("gate_uri"), record)
        if not decision["approved"]:
            raise RegateRejected(rejected_message(model, expected, decision), decision)
        state["expected"] = version
        return record

    return regate_against


def _read_card(storage: Storage, uri: str) -> dict[str, Any] | None:
    """A version's card, or None when it has none (or it is not a JSON object)."""
    try:
        card = storage.get_json(uri)
    except NotFound:
        return None
    return card if isinstance(card, dict) else None


def _record(storage: Storage, gate_uri: str | None, record: dict[str, Any]) -> None:
    """Append a re-gate to the run's ``gate.json``; only this run's promotion writes there."""
    if not gate_uri:
        return
    try:
        decision = storage.get_json(gate_uri)
    except NotFound:
        return
    if isinstance(decision, dict):
        decision["regates"] = [*decision.get("regates", []), record]
        storage.put_json(gate_uri, decision)
