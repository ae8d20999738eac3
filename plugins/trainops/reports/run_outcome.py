"""The top of a run's report: what happened to the run, in one line, and the few numbers that
matter (steps, duration, cost, goodput, attempts). Pure, no I/O.

The outcome is :func:`trainops.runs.outcome.outcome`'s, the one vocabulary the home page, the
terminal (``python -m trainops status``) and the notes use: ``promoted vN``, ``rejected: <check>
(observed <x>, expected <y>)``, ``identical to production vN``, ``failed at <task>: <reason>``,
``running: step s/t, about <eta> left``, ``approved, not promoted``, ``trained, not evaluated``.
This module gathers its facts from what the report app read (the ``job.json``, the gate's
decision and the promotion record beside it, the versions promoted from the run, the run's
progress) and shows it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trainops.cost.money import money
from trainops.reports.cost_page import COST_FORMAT, duration, percent
from trainops.reports.html import dicts, escape, table
from trainops.runs.outcome import Outcome, RunFacts, outcome
from trainops.runs.progress import Progress

__all__ = ["figures_table", "outcome_line", "run_outcome"]

# The colour of each kind of outcome (a CSS class of the page primitives).
_CSS = {"promoted": "pass", "approved": "pass", "rejected": "fail", "failed": "fail", "running": "live"}
# The fields of a gate check the outcome's words use (a stored decision may hold others, of any type).
_CHECK_FIELDS = ("name", "metric", "observed", "expected", "passed", "note")


def _gate(gate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The decision with only well-formed checks, each named, so that its words cannot fail."""
    if gate is None:
        return None
    checks = [
        {**{k: c[k] for k in _CHECK_FIELDS if k in c}, "name": str(c.get("name", "?"))}
        for c in dicts(gate.get("checks"))
    ]
    return {**gate, "checks": checks}


def _failure(job: Mapping[str, Any]) -> str | None:
    """Why the run failed: the operator's decision on its last attempt, else that attempt's reason."""
    attempts = dicts(job.get("attempts"))
    last = attempts[-1] if attempts else {}
    decision = last.get("decision")
    said = decision.get("reason") if isinstance(decision, dict) else None
    said = said or last.get("reason")
    return str(said) if said else None


def run_outcome(
    job: Mapping[str, Any],
    *,
    task: str = "train",
    gate: Mapping[str, Any] | None = None,
    promotion: Mapping[str, Any] | None = None,
    promoted: Sequence[tuple[str, int, str]] = (),
    found: Progress | None = None,
    max_steps: int | None = None,
) -> Outcome:
    """The run's outcome from its ``job.json`` (of the Airflow task ``task``), the gate's
    decision beside it (``eval/gate.json``) and the promotion record (``eval/promotion.json``;
    None: none yet), the versions promoted from it (``(model, version, card URI)``) and, while
    it runs, where it stands (:func:`trainops.runs.progress.progress`)."""
    checked = _gate(gate)
    model = checked.get("model_name") if checked else None
    versions = [v for m, v, _ in promoted if model is None or m == model]
    status = job.get("status")
    facts = RunFacts(
        run_uri=str(job.get("run_uri") or ""),
        dag_id="",
        run_id="",
        task=task,
        status=status if isinstance(status, str) else None,
        failure=_failure(job),
        step=found["step"] if found else None,
        max_steps=found["max_steps"] if found else max_steps,
        eta_s=found["eta_s"] if found else None,
        gate=checked,
        promotion=promotion,
        promoted_version=versions[0] if versions else None,
    )
    return outcome(facts)


def outcome_line(said: Outcome) -> str:
    """The page's first line: the outcome, its first word in capitals, in its colour."""
    first = re.match(r"[a-z]+", said.text)
    cut = first.end() if first else 0
    words = f"<strong>{escape(said.text[:cut].upper())}</strong>{escape(said.text[cut:])}"
    return f'<p class="outcome {_CSS.get(said.kind, "muted")}">{words}</p>'


def _num(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]


def _wall(cost: Mapping[str, Any]) -> float | None:
    """From the first launch to the last attempt's end (or now, for a running one), by the
    cost record's spans."""
    times = [
        t
        for a in dicts(cost.get("attempts"))
        for span in dicts(a.get("spans"))
        for t in (_num(span.get("start")), _num(span.get("end")))
        if t is not None
    ]
    return max(times) - min(times) if times else None


def figures_table(
    job: Mapping[str, Any],
    cost: object,
    *,
    last_step: int | None,
    max_steps: int | None,
) -> str:
    """The few numbers that matter, in one row: steps (of ``train.max_steps`` when known),
    duration, cost, goodput, attempts and preemptions."""
    known = cost if isinstance(cost, Mapping) and cost.get("format") == COST_FORMAT else {}
    steps = "-" if last_step is None else f"{last_step:,}" + (f" / {max_steps:,}" if max_steps else "")
    attempts = dicts(job.get("attempts"))
    preemptions = job.get("preemptions")
    cells = {
        "Steps": steps,
        "Duration": duration(_wall(known)) if known else "-",
        "Cost (estimate)": money(known.get("cost")) if known else "-",
        "Goodput": percent(known.get("goodput")) if known else "-",
        "Attempts": f"{len(attempts)}"
        + (f" ({preemptions} preempted)" if isinstance(preemptions, int) and preemptions else ""),
    }
    return table([escape(k) for k in cells], [[escape(v) for v in cells.values()]]).replace(
        "<table>", '<table class="figures">', 1
    )
