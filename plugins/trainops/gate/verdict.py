"""The gate's verdict in words: the promote task's skip message and the notes a decision leaves.

Pure text over the gate's decision (the EvaluationGateOperator's XCom result), so the skip
message, the DAG run's note and the gate task's note say the same thing from one source.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainops.gate.checks import failed_checks

__all__ = ["NOTE_LIMIT", "approval_note", "check_line", "fit_note", "rejection_note", "rejection_reason"]

# Airflow's public API refuses a DAG run or task instance note longer than this.
NOTE_LIMIT = 1000


def _observed(check: Mapping[str, Any]) -> str:
    observed = check.get("observed")
    if isinstance(observed, int | float) and not isinstance(observed, bool):
        return f"{observed:.6g}"
    return str(check.get("note") or "missing")


def _line(check: Mapping[str, Any]) -> str:
    """A check as a person reads it: its name, the metric that decided it, observed against
    expected, and a paired interval when there was one."""
    metric, name = check.get("metric"), check.get("name") or "a check"
    words = re.findall(r"[A-Za-z0-9_]+", str(name))
    named = name if not metric or metric == "slices" or metric in words else f"{name}: {metric}"
    line = f"{named} (observed {_observed(check)}, expected {check.get('expected') or '-'}"
    interval = check.get("interval")
    if isinstance(interval, list) and len(interval) == 2 and check.get("confidence"):
        line += (
            f"; {check['confidence']:.0%} interval of the difference [{interval[0]:+.4g}, {interval[1]:+.4g}]"
        )
    return line + ")"


def check_line(check: Mapping[str, Any]) -> str:
    """One check as a person reads it: ``<name>: <metric> (observed <x>, expected <y>)``."""
    return _line(check)


def _failed_lines(gate: Mapping[str, Any]) -> list[str]:
    return [_line(check) for check in failed_checks(gate)]


def rejection_reason(gate: Mapping[str, Any]) -> str:
    """One line: which checks failed, observed against expected, and where the decision is;
    the message the promote task skips with."""
    parts = _failed_lines(gate)
    if not parts:
        return "the gate rejected it"
    where = f"; decision in {gate['gate_uri']}" if gate.get("gate_uri") else ""
    return "the gate rejected it: " + "; ".join(parts) + where


def rejection_note(gate: Mapping[str, Any]) -> str:
    """The note a rejected run carries (DAG run and gate task): the model, the production
    version it was compared with, each failed check, and the decision's URI; at most
    :data:`NOTE_LIMIT` characters."""
    failed = _failed_lines(gate)
    checks = gate.get("checks") or []
    head = (
        f"REJECTED: {gate.get('model_name') or 'the candidate'} failed {len(failed)} of {len(checks)} "
        f"gate checks ({_against(gate)}); promote skipped, production unchanged."
    )
    return _note(gate, head, failed)


def approval_note(gate: Mapping[str, Any]) -> str:
    """The note an approved run carries (DAG run and gate task): the model, what it was compared
    with, the metrics that decided (each check, observed against expected) and the decision's
    URI; at most :data:`NOTE_LIMIT` characters."""
    checks = [c for c in gate.get("checks") or [] if isinstance(c, Mapping) and c.get("name")]
    metrics = list(
        dict.fromkeys(str(c.get("metric")) for c in checks if c.get("metric") not in (None, "slices"))
    )
    if any(c.get("metric") == "slices" for c in checks):
        metrics.append("per-slice expectations")
    head = (
        f"APPROVED: {gate.get('model_name') or 'the candidate'} passed {len(checks)} of {len(checks)} "
        f"gate checks ({_against(gate)}), decided on {', '.join(metrics) or 'no metric'}."
    )
    return _note(gate, head, [_line(check) for check in checks])


def _against(gate: Mapping[str, Any]) -> str:
    production = gate.get("production_version")
    return f"against production v{production}" if production is not None else "no production yet"


def _note(gate: Mapping[str, Any], head: str, lines: list[str]) -> str:
    """A note: its head, a line per check, where the decision is; at most :data:`NOTE_LIMIT`."""
    parts = [head, *(f"- {line}" for line in lines)]
    if gate.get("gate_uri"):
        parts.append(f"Decision: {gate['gate_uri']}")
    return fit_note("\n".join(parts))


def fit_note(text: str, limit: int = NOTE_LIMIT) -> str:
    """``text``, cut to ``limit`` characters with a marker when longer."""
    if len(text) <= limit:
        return text
    marker = " [...]"
    return text[: limit - len(marker)] + marker
