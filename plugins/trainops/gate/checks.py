"""The evaluation gate: plain checks over plain metrics, no I/O.

A check is a dict, so a gate definition can live in DAG code, a YAML file or a
DAG param. Kinds (every one with examples in docs/promotion.md):

- ``threshold``: ``{"kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 4.0}``
- ``no_regression``: ``{"kind": "no_regression", "metric": "f1_macro", "tolerance": 0.01}``;
  passes when the candidate is no worse than the production model by more than ``tolerance``
  (a fraction), and when there is no production model yet. "Worse" follows the metric's
  direction (:mod:`trainops.gate.metrics`); a ``direction`` given must agree with it. With
  ``"confidence": 0.95`` it rejects only a regression whose paired bootstrap interval over
  the same eval records lies wholly beyond the tolerance (:mod:`trainops.gate.paired`).
- A team's own metric (``EvaluateModelOperator(metrics=...)``) works in ``threshold`` and
  ``no_regression`` when the check says which way is better:
  ``{"kind": "threshold", "metric": "worst_label_recall", "direction": "higher_is_better",
  "op": ">=", "value": 0.8}``. A name that is neither built in nor so declared is refused,
  listing the known ones.
- ``slices`` and ``slice_no_regression``: great-expectations expectations over the
  per-slice metrics table (:mod:`trainops.gate.slices`).

:func:`validate_checks` runs at DAG parse, :func:`decide` at run time. A numeric field
(``value``, ``tolerance``, a slice expectation's ``min_value``/``max_value``) may be a
Jinja template such as ``"{{ params.max_eval_loss }}"`` when the operator renders the
checks: parse-time validation (``templates="allow"``) keeps it, and the rendered checks
are validated again (``templates="rendered"``), which reads the rendered text as a number
(:mod:`trainops.gate.fields`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from trainops.gate.errors import GateConfigError, GateInputError
from trainops.gate.fields import TEMPLATE_MODES, fmt, is_number, number_rule, show
from trainops.gate.metrics import (
    BUILTIN,
    DIRECTIONS,
    LOWER,
    METRIC_NAMES,
    check_direction,
    missing_metric_hint,
)
from trainops.gate.paired import PAIRED_METRICS, PairedInputError, label_count, paired_interval, regressed
from trainops.gate.records import Check, CheckResult, Decision, Outcome
from trainops.gate.slices import SLICE_KINDS, default_name, run_slice_checks, validate_slice_check

__all__ = [
    "DEFAULT_CHECKS",
    "DIRECTIONS",
    "KINDS",
    "METRICS",
    "OPS",
    "SLICE_KINDS",
    "GateConfigError",
    "GateInputError",
    "check_evaluation",
    "decide",
    "failed_checks",
    "format_table",
    "validate_checks",
]

KINDS = ("threshold", "no_regression", *SLICE_KINDS)
METRICS = METRIC_NAMES
OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}

_FIELDS = {
    "threshold": {"name", "kind", "metric", "op", "value", "direction"},
    "no_regression": {"name", "kind", "metric", "tolerance", "direction", "confidence"},
}

# A sanity bound rather than a quality bar: ln(50257) ~ 10.8 is a uniform guess over a
# GPT-2 vocabulary, so a model above 10 learned nothing. Real DAGs pass their own checks.
DEFAULT_MAX_EVAL_LOSS = 10.0

DEFAULT_CHECKS: list[Check] = [
    {"kind": "threshold", "metric": "eval_loss", "op": "<=", "value": DEFAULT_MAX_EVAL_LOSS},
    {"kind": "no_regression", "metric": "eval_loss", "tolerance": 0.0, "direction": LOWER},
]


def _default_name(check: Check) -> str:
    if check["kind"] == "threshold":
        return f"{check['metric']} {check['op']} {show(check['value'])}"
    if check["kind"] in SLICE_KINDS:
        return default_name(check)
    return f"{check['metric']} no regression (tolerance {show(check['tolerance'])})"


def _validate_one(index: int, check: object, templates: str | None = None) -> Check:
    where = f"check #{index}"
    if not isinstance(check, dict):
        raise GateConfigError(f"{where} must be a dict such as {DEFAULT_CHECKS[0]!r}, got {check!r}")
    if isinstance(check.get("name"), str) and check["name"]:
        where = f"check #{index} ({check['name']!r})"
    kind = check.get("kind")
    if kind not in KINDS:
        raise GateConfigError(f"{where} has unknown kind {kind!r}; use one of {list(KINDS)}")
    number = number_rule(templates)
    if kind in SLICE_KINDS:
        return _named(where, check, validate_slice_check(where, check, number))
    unknown = sorted(set(check) - _FIELDS[kind])
    if unknown:
        raise GateConfigError(
            f"{where} has unknown field {unknown[0]!r} for kind {kind!r}; "
            f"allowed fields are {sorted(_FIELDS[kind])}"
        )
    metric = check.get("metric")
    direction = check_direction(where, metric, check.get("direction"))
    out: Check = {"kind": kind, "metric": metric}
    if kind == "threshold":
        op = check.get("op")
        if op not in OPS:
            raise GateConfigError(f"{where} has unknown op {op!r}; use one of {list(OPS)}")
        out.update(op=op, value=number(where, "value", check.get("value")))
        if metric not in BUILTIN:  # a team's own: the check is where its direction is known
            out["direction"] = direction
        return _named(where, check, out)
    tolerance = number(where, "tolerance", check.get("tolerance", 0.0))
    if isinstance(tolerance, float) and tolerance < 0:
        raise GateConfigError(
            f"{where} needs field 'tolerance' to be a number >= 0 (a fraction: 0.01 is 1%), got {tolerance!r}"
        )
    out.update(tolerance=tolerance, direction=direction)
    if check.get("confidence") is not None:
        out["confidence"] = _confidence(where, str(metric), check["confidence"], number)
    return _named(where, check, out)


def _confidence(where: str, metric: str, confidence: object, number: Callable[..., Any]) -> Any:
    """A ``no_regression`` check's bootstrap confidence: a fraction in (0.5, 1), on a metric
    with per-record figures."""
    if metric not in PAIRED_METRICS:
        raise GateConfigError(
            f"{where} asks for confidence on {metric}, which has no per-record figures to resample; "
            f"confidence works for {', '.join(PAIRED_METRICS)}"
        )
    value = number(where, "confidence", confidence)
    if isinstance(value, float) and not 0.5 < value < 1:
        raise GateConfigError(f"{where} needs field 'confidence' in (0.5, 1), e.g. 0.95, got {confidence!r}")
    return value


def _named(where: str, check: Check, out: Check) -> Check:
    name = check.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise GateConfigError(f"{where} has field 'name' {name!r}; give a non-empty string or omit it")
    out["name"] = name.strip() if name else _default_name(out)
    return out


def validate_checks(checks: object, *, templates: str | None = None) -> list[Check]:
    """Normalise check definitions (default names, tolerance, direction).

    Raises GateConfigError naming the check and field at fault. ``templates``: None (numbers
    only), ``"allow"`` (keep Jinja templates in numeric fields, at DAG parse) or
    ``"rendered"`` (read rendered numeric text as numbers, when the task runs).
    """
    if templates not in TEMPLATE_MODES:
        raise ValueError(f"templates must be one of {TEMPLATE_MODES}, got {templates!r}")
    if not isinstance(checks, (list, tuple)):
        raise GateConfigError(f"checks must be a list of dicts, got {type(checks).__name__} {checks!r}")
    if not checks:
        raise GateConfigError(
            "checks is empty, which would approve any model; "
            "give at least one check or omit checks to use the defaults"
        )
    out = [_validate_one(i, check, templates) for i, check in enumerate(checks)]
    seen: set[str] = set()
    for check in out:
        if check["name"] in seen:
            raise GateConfigError(f"two checks are named {check['name']!r}; give each a unique name")
        seen.add(check["name"])
    return out


def check_evaluation(evaluation: object, checks: list[Check]) -> dict[str, Any]:
    """Check the evaluation result carries what ``checks`` need; raise GateInputError if not."""
    if not isinstance(evaluation, dict):
        raise GateInputError(
            f"evaluation must be the dict returned by EvaluateModelOperator, got "
            f"{type(evaluation).__name__} {str(evaluation)[:200]!r}"
        )
    for key in ("run_uri", "model_name"):
        if not isinstance(evaluation.get(key), str) or not evaluation[key]:
            raise GateInputError(
                f"evaluation field {key!r} must be a non-empty string, got {evaluation.get(key)!r}"
            )
    version = evaluation.get("production_version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise GateInputError(
            f"evaluation field 'production_version' must be an integer or None, got {version!r}"
        )
    candidate, production = evaluation.get("candidate"), evaluation.get("production")
    if not isinstance(candidate, dict):
        raise GateInputError(f"evaluation field 'candidate' must be a dict of metrics, got {candidate!r}")
    if production is not None and not isinstance(production, dict):
        raise GateInputError(
            f"evaluation field 'production' must be a dict of metrics or None, got {production!r}"
        )
    if production is None and version is not None:
        raise GateInputError(
            f"evaluation names production_version {version} but has no production metrics; "
            "re-run EvaluateModelOperator so the production model is evaluated too"
        )
    if production is not None and version is None:
        raise GateInputError(
            "evaluation has production metrics but production_version is None; "
            "pass EvaluateModelOperator's result unchanged"
        )
    for check in checks:
        if check["kind"] in SLICE_KINDS:
            _check_slices(candidate, production, check)
            continue
        sides: list[tuple[str, dict[str, Any]]] = [("candidate", candidate)]
        if check["kind"] == "no_regression" and production is not None:
            sides.append(("production", production))
        for side, metrics in sides:
            if not is_number(metrics.get(check["metric"])):
                raise GateInputError(
                    f"evaluation {side} metric {check['metric']!r} must be a number for check "
                    f"{check['name']!r}, got {metrics.get(check['metric'])!r} "
                    f"({missing_metric_hint(check['metric'], metrics)})"
                )
    return evaluation


def _check_slices(candidate: dict[str, Any], production: dict[str, Any] | None, check: Check) -> None:
    sides = [("candidate", candidate)] + ([("production", production)] if production else [])
    for side, metrics in sides:
        slices = metrics.get("slices", {} if side == "production" else None)
        if not isinstance(slices, dict) or not all(
            isinstance(values, dict) and all(isinstance(v, dict) for v in values.values())
            for values in slices.values()
        ):
            raise GateInputError(
                f"evaluation {side} field 'slices' must map slice column -> value -> metrics "
                f"for check {check['name']!r}, got {str(slices)[:200]!r}; pass "
                "EvaluateModelOperator's result unchanged"
            )


def _observed(metrics: Mapping[str, Any], metric: str) -> tuple[float | None, str]:
    """The metric as a finite float, or None and why (JSON has no NaN or infinity)."""
    value = metrics.get(metric)
    if not is_number(value):
        return None, f"{metric} missing"
    if not math.isfinite(value):
        return None, f"{metric} is {value}"
    return float(value), ""


def _threshold(check: Check, candidate: Mapping[str, Any]) -> Outcome:
    observed, why = _observed(candidate, check["metric"])
    passed = observed is not None and OPS[check["op"]](observed, check["value"])
    return {
        "observed": observed,
        "expected": f"{check['op']} {fmt(check['value'])}",
        "passed": passed,
        "note": f"candidate {why}" if why else "",
    }


def _no_regression(
    check: Check,
    candidate: Mapping[str, Any],
    production: Mapping[str, Any] | None,
    production_version: int | None,
    paired: Mapping[str, Any] | None = None,
) -> Outcome:
    metric, tolerance = check["metric"], check["tolerance"]
    observed, why = _observed(candidate, metric)
    if production is None:
        return {"observed": observed, "expected": None, "passed": True, "note": "no production model yet"}
    label = f"production v{production_version}" if production_version is not None else "production"
    base, base_why = _observed(production, metric)
    if base is None:
        # A broken production model must not block every candidate after it.
        return {
            "observed": observed,
            "expected": None,
            "passed": True,
            "note": f"{label} {base_why}; nothing to regress from",
        }
    # The tolerance is a fraction of production's size: for a team's metric that can be zero or
    # negative too (a log-likelihood), ``base * (1 - tolerance)`` would move the wrong way.
    if check["direction"] == LOWER:
        op, bound = "<=", base + abs(base) * tolerance
    else:
        op, bound = ">=", base - abs(base) * tolerance
    passed = observed is not None and OPS[op](observed, bound)
    note = f"{label} {metric} {fmt(base)}, tolerance {tolerance:.4g}"
    if why:
        note = f"candidate {why}; {note}"
    outcome: Outcome = {
        "observed": observed,
        "expected": f"{op} {fmt(bound)}",
        "passed": passed,
        "note": note,
    }
    if check.get("confidence") is not None and observed is not None:
        _with_interval(outcome, check, candidate, paired, abs(bound - base))
    return outcome


def _with_interval(
    outcome: Outcome,
    check: Check,
    candidate: Mapping[str, Any],
    paired: Mapping[str, Any] | None,
    allowed: float,
) -> None:
    """Decide a ``no_regression`` check with ``confidence`` by the paired bootstrap interval of
    candidate minus production: rejected only when all of it lies beyond ``allowed``."""
    confidence = float(check["confidence"])
    paired = paired or {}
    ours, theirs, problem = paired.get("candidate"), paired.get("baseline"), paired.get("problem")
    try:
        if isinstance(problem, str):
            raise PairedInputError(problem)
        if not isinstance(ours, Mapping) or not isinstance(theirs, Mapping):
            raise PairedInputError(
                "the evaluation kept no per-record figures of both models (its records_uri); "
                "re-run EvaluateModelOperator with this trainops"
            )
        interval = paired_interval(check["metric"], ours, theirs, confidence, label_count(candidate))
    except PairedInputError as exc:
        outcome["note"] += f"; compared the totals, without the {confidence:.0%} interval: {exc}"
        return
    passed = not regressed(interval, check["direction"] == LOWER, allowed)
    raw = "beyond the tolerance" if not outcome["passed"] else "within the tolerance"
    outcome["passed"] = passed
    outcome["expected"] = f"{outcome['expected']} unless the {confidence:.0%} interval reaches it"
    outcome["interval"] = [interval.low, interval.high]
    outcome["confidence"] = confidence
    outcome["note"] += (
        f"; paired bootstrap over {interval.records} records: candidate - production "
        f"{interval.difference:+.4g}, {confidence:.0%} interval [{interval.low:+.4g}, {interval.high:+.4g}]"
        f", allowed {'+' if check['direction'] == LOWER else '-'}{allowed:.4g} ({raw} as totals)"
    )


def decide(
    checks: list[Check],
    candidate: Mapping[str, Any],
    production: Mapping[str, Any] | None,
    production_version: int | None = None,
    paired: Mapping[str, Any] | None = None,
) -> Decision:
    """Run every check (validated or raw) on the candidate's metrics; approve if all pass.

    ``observed`` is the candidate's value (None when it is missing or not finite, which
    fails the check); ``expected`` is the condition it had to meet, as text. Slice checks
    also list their failing ``slices`` and need pandas and great-expectations. ``paired``:
    the evaluation's per-record figures (its ``records_uri`` document), for ``no_regression``
    checks with ``confidence``; without them such a check compares the totals and says so.
    """
    checks = validate_checks(checks)
    slice_checks = [c for c in checks if c["kind"] in SLICE_KINDS]
    slice_outcomes = iter(run_slice_checks(slice_checks, candidate, production, production_version))
    results: list[CheckResult] = []
    for check in checks:
        if check["kind"] == "threshold":
            outcome = _threshold(check, candidate)
        elif check["kind"] == "no_regression":
            outcome = _no_regression(check, candidate, production, production_version, paired)
        else:
            outcome = next(slice_outcomes)
        results.append(
            {
                "name": check["name"],
                "kind": check["kind"],
                "metric": check.get("metric") or "slices",
                **outcome,
            }
        )
    return {
        "approved": all(r["passed"] for r in results),
        "checks": results,
        "production_version": production_version,
    }


def failed_checks(decision: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checks of a decision (or of a gate result read back) that did not pass."""
    return [r for r in decision.get("checks", []) if not r.get("passed")]


def format_table(decision: Mapping[str, Any]) -> str:
    """A fixed-width table of the decision, for the task log."""
    header = ("check", "metric", "observed", "expected", "result", "note")
    rows = [header] + [
        (
            r["name"],
            r["metric"],
            fmt(r["observed"]),
            r["expected"] or "-",
            "pass" if r["passed"] else "FAIL",
            r.get("note") or "",
        )
        for r in decision["checks"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    passed = sum(1 for r in decision["checks"] if r["passed"])
    version = decision.get("production_version")
    against = f"production v{version}" if version is not None else "no production model"
    verdict = "APPROVED" if decision["approved"] else "REJECTED"
    title = f"gate {verdict}: {passed}/{len(decision['checks'])} checks passed, against {against}"
    return "\n".join([title, *lines])
