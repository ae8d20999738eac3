"""The stored report pages: validation, gate decision, model card, manifest and any other
JSON or text object, as pure functions from (uri, bytes) to HTML; no I/O.

Every value is escaped and redacted by the page primitives of :mod:`trainops.reports.html`.
The training run page (a run's ``job.json``) is :mod:`trainops.reports.run_page`. A record whose
kind has a shape (:func:`trainops.shapes.check_for`: a production pointer, a dataset manifest)
and is not that shape gets the check's message above its contents; :func:`damaged_page` is the
page of a run record or a card that is not its shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from trainer.contract import MANIFEST_FORMAT
from trainops.registry.promotion import CARD_FORMAT
from trainops.reports.html import (
    dicts,
    escape,
    json_value,
    kv_table,
    list_of,
    not_json_page,
    object_name,
    other_fields,
    page,
    raw_json,
    redact,
    report_link,
    scalar,
    table,
    verdict,
)
from trainops.shapes import ShapeError, check_for, load
from trainops.staging.expectations import DATASET_EXPECTATIONS

__all__ = [
    "JSON_SUFFIXES",
    "TEXT_SUFFIXES",
    "damaged_page",
    "error_page",
    "render_report",
    "report_kind",
    "shape_problem",
]

JSON_SUFFIXES = (".json",)
TEXT_SUFFIXES = (".md", ".txt", ".yaml", ".yml", ".jsonl", ".log")
_TITLES = {
    "model_card": "Model card",
    "job": "Training job record",
    "manifest": "Dataset manifest",
    "json": "Stored report",
}


# ----------------------------------------------------------------------------- reports


def report_kind(uri: str, report: object) -> str:
    """``validation`` | ``gate`` | ``model_card`` | ``job`` | ``manifest`` | ``json``."""
    if not isinstance(report, dict):
        return "json"
    name, keys = object_name(uri), set(report)
    if name == "validation.json" or {"evaluated_expectations", "failed"} <= keys:
        return "validation"
    if name == "gate.json" or {"approved", "checks"} <= keys:
        return "gate"
    if report.get("format") == CARD_FORMAT or name == "card.json":
        return "model_card"
    if name == "job.json":
        return "job"
    if report.get("format") == MANIFEST_FORMAT or name == "manifest.json":
        return "manifest"
    return "json"


def _dataset_of(uri: str) -> str | None:
    parts = uri.split("/")
    if len(parts) >= 4 and parts[-4] == "datasets":
        return f"{parts[-3]} version {parts[-2]}"
    return None


def _is_dataset_level(entry: dict) -> bool:
    name = entry.get("expectation")
    return isinstance(name, str) and name in DATASET_EXPECTATIONS


def _expectation_row(entry: dict, *, failed: bool) -> list[str]:
    """One expectation's cells; entries of the ``failed`` list carry no ``success`` key."""
    column = entry.get("column")
    column = ", ".join(map(str, column)) if isinstance(column, list) else column
    ok = entry.get("success", False if failed else None)
    ids, rows = list_of(entry.get("sample_ids")), list_of(entry.get("sample_rows"))
    if ids:
        samples = "ids " + ", ".join(f"<code>{escape(i)}</code>" for i in ids)
    elif rows:
        samples = "rows " + ", ".join(escape(r) for r in rows)
    else:
        samples = '<span class="muted">-</span>'
    details = {k: entry[k] for k in ("observed_value", "error", "sample_values") if entry.get(k) is not None}
    kwargs = entry["kwargs"] if isinstance(entry.get("kwargs"), dict) else {}
    kwargs = {k: v for k, v in kwargs.items() if k != "column"}
    if kwargs:
        details["kwargs"] = kwargs
    status = verdict(ok)
    if ok and isinstance(entry.get("quarantined"), int) and entry["quarantined"]:
        status += f", {escape(entry['quarantined'])} quarantined"
    return [
        escape(entry.get("expectation", "?")),
        scalar(column),
        status,
        scalar(entry.get("unexpected_count")),
        samples,
        json_value(details) if details else '<span class="muted">-</span>',
    ]


def _quarantine(uri: str, quarantine: object) -> str:
    if not isinstance(quarantine, dict):
        return json_value(quarantine)
    labels = {
        "rows": "Rows quarantined",
        "rows_read": "Rows read",
        "fraction": "Fraction",
        "max_fraction": "Largest fraction allowed",
        "sample_rows": "Rows in the sample",
    }
    rows = [[escape(label), scalar(quarantine[key])] for key, label in labels.items() if key in quarantine]
    sample = quarantine.get("sample")
    if isinstance(sample, str) and sample:
        target = sample if "://" in sample else f"{uri.rsplit('/', 1)[0]}/{sample}"
        rows.append(["Sample of quarantined rows", report_link(target)])
    reasons = quarantine.get("by_reason")
    out = "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"
    if isinstance(reasons, dict) and reasons:
        out += table(["Reason", "Rows"], [[escape(k), scalar(v)] for k, v in reasons.items()])
    rest = {k: v for k, v in quarantine.items() if k not in {*labels, "sample", "by_reason"}}
    return out + (kv_table(rest) if rest else "")


def _failure_words(entry: dict) -> str:
    """A failed expectation in words: ``<expectation> on <column>: <n> unexpected, e.g. <value>``."""
    column = entry.get("column")
    column = ", ".join(map(str, column)) if isinstance(column, list) else column
    words = escape(entry.get("expectation", "?")) + (f" on {escape(column)}" if column else "")
    count = entry.get("unexpected_count")
    if isinstance(count, int) and not isinstance(count, bool):
        words += f": {escape(count)} unexpected"
    values, ids = list_of(entry.get("sample_values")), list_of(entry.get("sample_ids"))
    if values:  # as JSON, so that an empty text or a null reads as one
        words += f", e.g. <code>{escape(json.dumps(values[0], ensure_ascii=False, default=str))}</code>"
    elif ids:
        words += f", e.g. id <code>{escape(ids[0])}</code>"
    return words


def _validation_line(report: dict, failed: list[dict]) -> str:
    """PASSED, or FAILED and the failed expectations (the first three, then how many more)."""
    ok = report.get("success")
    if ok is False or failed:
        named = "; ".join(_failure_words(e) for e in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        return f'<p class="outcome">Validation <span class="fail">FAILED</span>{": " + named + more if named else ""}</p>'
    return f'<p class="outcome">Validation {verdict(ok, "PASSED", "FAILED")}</p>'


def _validation(uri: str, report: dict) -> str:
    failed = dicts(report.get("failed"))
    listed = dicts(report.get("results")) or failed
    evaluated = report.get("evaluated_expectations")
    passed = report.get("successful_expectations")
    summary = {
        "Dataset": _dataset_of(uri),
        "Rows checked": report.get("rows"),
        "Expectations evaluated": evaluated,
        "Passed": passed,
        "Failed": len(failed),
    }
    rows = "".join(
        f"<tr><th>{escape(k)}</th><td>{scalar(v)}</td></tr>" for k, v in summary.items() if v is not None
    )
    body = [_validation_line(report, failed), f"<table>{rows}</table>"]
    header = ["Expectation", "Column", "Status", "Unexpected", "Sample offending rows", "Details"]
    for title, scope in (("Row expectations", False), ("Dataset-level expectations", True)):
        entries = [e for e in listed if _is_dataset_level(e) == scope]
        if entries:
            cells = [_expectation_row(e, failed=listed is failed) for e in entries]
            body.append(f"<h2>{title}</h2>{table(header, cells)}")
    if not listed and isinstance(evaluated, int):
        body.append(f"<p>All {scalar(evaluated)} expectations passed.</p>")
    elif listed is failed and isinstance(passed, int) and passed:
        body.append(
            f'<p class="muted">The report itemises failures only; the other '
            f"{escape(passed)} expectations passed.</p>"
        )
    if "quarantine" in report:
        body.append(f"<h2>Quarantine</h2>{_quarantine(uri, report['quarantine'])}")
    known = {
        "success",
        "rows",
        "evaluated_expectations",
        "successful_expectations",
        "failed",
        "results",
        "quarantine",
    }
    body.append(other_fields(report, known))
    return "".join(body)


# The gate checks' table: the gate decision's page and the model card's draw the same columns.
CHECK_COLUMNS = ("Check", "Metric", "Observed", "Expected", "Result", "Note")


def check_cells(check: Mapping[str, Any]) -> list[str]:
    """One gate check's cells, escaped, in :data:`CHECK_COLUMNS`' order."""
    return [
        escape(check.get("name", "?")),
        scalar(check.get("metric")),
        scalar(check.get("observed")),
        scalar(check.get("expected")),
        verdict(check.get("passed")),
        scalar(check.get("note") or ""),
    ]


def _gate_line(report: dict) -> str:
    """The verdict, and for a rejection each failed check, observed against expected."""
    checks = dicts(report.get("checks"))
    failed = [c for c in checks if c.get("passed") is False]
    approved = report.get("approved")
    if approved is False or failed:
        words = "; ".join(
            f"{escape(c.get('name', '?'))} (observed {scalar(c.get('observed'))}, "
            f"expected {scalar(c.get('expected'))})"
            for c in failed
        )
        return (
            f'<p class="outcome">Gate <span class="fail">REJECTED</span>{": " + words if words else ""}</p>'
        )
    if approved is True:
        return (
            f'<p class="outcome">Gate <span class="pass">APPROVED</span>: all {len(checks)} checks passed</p>'
        )
    return f'<p class="outcome">Gate {verdict(None)}</p>'


def _gate(report: dict) -> str:
    version = report.get("production_version")
    summary = {
        "Model": report.get("model_name"),
        "Run": report.get("run_uri"),
        "Compared against": f"production v{version}" if version is not None else "no production model",
        "Decided at": report.get("decided_at"),
        "Metrics": report.get("metrics_uri"),
    }
    rows = "".join(
        f"<tr><th>{escape(k)}</th><td>{scalar(v)}</td></tr>" for k, v in summary.items() if v is not None
    )
    checks = dicts(report.get("checks"))
    checks_table = table(list(CHECK_COLUMNS), [check_cells(c) for c in checks])
    known = {"approved", "checks", "production_version", "model_name", "run_uri", "decided_at", "metrics_uri"}
    return (
        f"{_gate_line(report)}<h2>Checks</h2>{checks_table}"
        f"<h2>Decision</h2><table>{rows}</table>{other_fields(report, known)}"
    )


def _title(kind: str, uri: str, report: object) -> str:
    if kind == "validation":
        return "Dataset validation report"
    if kind == "gate":
        return "Evaluation gate decision"
    if kind == "model_card" and isinstance(report, dict) and report.get("model"):
        return f"Model card: {report['model']} v{report.get('version', '?')}"
    return f"{_TITLES.get(kind, 'Stored report')}: {object_name(uri)}"


def shape_problem(error: ShapeError) -> str:
    """A record's :class:`trainops.shapes.ShapeError` as the paragraph a page shows (escaped,
    redacted: the message quotes the wrong value)."""
    return f'<p class="fail damaged">{escape(redact(str(error)))}</p>'


def damaged_page(title: str, uri: str, error: ShapeError, text: str) -> str:
    """The page of a record that is not its kind's shape (``error`` says how), with what it
    holds below: its JSON, or its text when it is not JSON."""
    try:
        shown = raw_json(redact(json.loads(text)), object_name(uri), opened=True)
    except (ValueError, RecursionError):
        shown = f"<h2>Its text</h2><pre>{escape(redact(text))}</pre>"
    return page(title, uri, shape_problem(error) + shown)


def render_report(uri: str, data: bytes) -> str:
    """The whole HTML page for the stored object ``uri`` whose bytes are ``data``."""
    text = data.decode("utf-8", errors="replace")
    if not uri.endswith(JSON_SUFFIXES):
        return page(object_name(uri), uri, f"<pre>{escape(redact(text))}</pre>")
    check, problem = check_for(uri), None
    if check is not None:
        try:
            load(text, uri, check)
        except ShapeError as exc:
            problem = exc
    try:
        report = redact(json.loads(text))
    except (ValueError, RecursionError) as exc:
        if problem is not None:
            return damaged_page(object_name(uri), uri, problem, text)
        return not_json_page(uri, text, exc)
    kind = report_kind(uri, report)
    if kind == "validation" and isinstance(report, dict):
        body = _validation(uri, report)
    elif kind == "gate" and isinstance(report, dict):
        body = _gate(report)
    else:
        body = json_value(report)
    warning = shape_problem(problem) if problem is not None else ""
    return page(_title(kind, uri, report), uri, warning + body + raw_json(report, object_name(uri)))


def error_page(status: int, message: str) -> str:
    """A page for a refused or failed request; ``message`` is shown escaped."""
    return page(f"Report unavailable ({status})", "", f'<p class="fail">{escape(message)}</p>')
