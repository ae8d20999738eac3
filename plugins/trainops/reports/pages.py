"""Stored reports as HTML pages: pure functions from (uri, bytes) to text, no I/O.

Report contents are data and may be hostile (a sample id can be ``<script>``), so every
value goes through :func:`html.escape`, and values under credential-like keys, or
passwords inside URLs, are replaced by ``***`` before anything is shown.
"""

from __future__ import annotations

import html
import json
import re
from urllib.parse import urlencode

from trainer.contract import MANIFEST_FORMAT
from trainops.registry.promotion import CARD_FORMAT
from trainops.staging.expectations import DATASET_EXPECTATIONS

__all__ = ["JSON_SUFFIXES", "TEXT_SUFFIXES", "error_page", "redact", "render_report", "report_kind"]

JSON_SUFFIXES = (".json",)
TEXT_SUFFIXES = (".md", ".txt", ".yaml", ".yml", ".jsonl", ".log")
REDACTED = "***"

_SECRET_PARTS = (
    "password",
    "passwd",
    "secret",
    "credential",
    "private_key",
    "access_key",
    "authorization",
    "api_key",
    "apikey",
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]+:)[^/@\s]+@")
_MAX_DEPTH = 5
_TITLES = {
    "model_card": "Model card",
    "job": "Training job record",
    "manifest": "Dataset manifest",
    "json": "Stored report",
}

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5rem;color:#1f2328;max-width:80rem}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
code,pre{font:12px/1.4 ui-monospace,monospace}
pre{background:#f6f8fa;padding:.8rem;overflow:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;margin:.3rem 0}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}.muted{color:#6e7781}.uri{color:#57606a;word-break:break-all}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}
svg.chart{display:block;max-width:100%;height:auto;margin:.3rem 0}
svg.chart text{font:11px system-ui,sans-serif;fill:#57606a}
"""


# ----------------------------------------------------------------------------- helpers


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _is_secret_key(key: str) -> bool:
    name = key.lower()
    return any(part in name for part in _SECRET_PARTS) or name == "token" or name.endswith("_token")


def redact(value: object) -> object:
    """A copy of ``value`` with credential-like keys and URL passwords replaced by ``***``."""
    if isinstance(value, dict):
        return {
            k: REDACTED if _is_secret_key(str(k)) and v not in (None, "") else redact(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _URL_PASSWORD.sub(rf"\g<head>{REDACTED}@", value)
    return value


def _status(ok: object, yes: str = "PASS", no: str = "FAIL") -> str:
    if ok is None:
        return '<span class="muted">unknown</span>'
    return f'<span class="pass">{yes}</span>' if ok else f'<span class="fail">{no}</span>'


def _scalar(value: object) -> str:
    if value is None:
        return '<span class="muted">null</span>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _e(f"{value:.6g}")
    return _e(value)


def _json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _value(value: object, depth: int = 0) -> str:
    """Any JSON value as HTML: dicts as key/value tables, lists of dicts as tables."""
    if isinstance(value, dict):
        if not value:
            return '<span class="muted">{}</span>'
        if depth >= _MAX_DEPTH:
            return f"<pre>{_e(_json(value))}</pre>"
        return _kv_table(value, depth + 1)
    if isinstance(value, list):
        if not value:
            return '<span class="muted">[]</span>'
        if all(not isinstance(v, (dict, list)) for v in value):
            return ", ".join(_scalar(v) for v in value)
        if all(isinstance(v, dict) for v in value) and depth < _MAX_DEPTH:
            columns = list(dict.fromkeys(k for v in value for k in v))
            rows = [[_value(v.get(c), depth + 1) for c in columns] for v in value]
            return _table([_e(c) for c in columns], rows)
        items = "".join(f"<li>{_value(v, depth + 1)}</li>" for v in value)
        return f"<ol>{items}</ol>"
    return _scalar(value)


def _kv_table(mapping: dict, depth: int = 0) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_value(v, depth)}</td></tr>" for k, v in mapping.items())
    return f"<table>{rows}</table>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A table from already-escaped header and cell HTML."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _rest(report: dict, shown: set[str]) -> str:
    rest = {k: v for k, v in report.items() if k not in shown}
    return f"<h2>Other fields</h2>{_kv_table(rest)}" if rest else ""


def _page(title: str, uri: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} - trainops</title><style>{_CSS}</style></head><body>"
        f"<header><h1>{_e(title)}</h1>"
        + (f'<p class="uri"><code>{_e(uri)}</code></p>' if uri else "")
        + f"</header>{body}</body></html>"
    )


def _raw(report: object) -> str:
    return f"<h2>Raw JSON</h2><pre>{_e(_json(report))}</pre>"


def _dicts(value: object) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------- reports


def report_kind(uri: str, report: object) -> str:
    """``validation`` | ``gate`` | ``model_card`` | ``job`` | ``manifest`` | ``json``."""
    if not isinstance(report, dict):
        return "json"
    name, keys = _name(uri), set(report)
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
    ids, rows = _list(entry.get("sample_ids")), _list(entry.get("sample_rows"))
    if ids:
        samples = "ids " + ", ".join(f"<code>{_e(i)}</code>" for i in ids)
    elif rows:
        samples = "rows " + ", ".join(_e(r) for r in rows)
    else:
        samples = '<span class="muted">-</span>'
    details = {k: entry[k] for k in ("observed_value", "error", "sample_values") if entry.get(k) is not None}
    kwargs = entry.get("kwargs") if isinstance(entry.get("kwargs"), dict) else {}
    kwargs = {k: v for k, v in kwargs.items() if k != "column"}
    if kwargs:
        details["kwargs"] = kwargs
    status = _status(ok)
    if ok and isinstance(entry.get("quarantined"), int) and entry["quarantined"]:
        status += f", {_e(entry['quarantined'])} quarantined"
    return [
        _e(entry.get("expectation", "?")),
        _scalar(column),
        status,
        _scalar(entry.get("unexpected_count")),
        samples,
        _value(details) if details else '<span class="muted">-</span>',
    ]


def _report_link(uri: str) -> str:
    """A link to another stored object through this app (relative, so proxies keep working)."""
    href = "report?" + urlencode({"uri": uri})
    return f'<a href="{_e(href)}"><code>{_e(uri)}</code></a>'


def _quarantine(uri: str, quarantine: object) -> str:
    if not isinstance(quarantine, dict):
        return _value(quarantine)
    labels = {
        "rows": "Rows quarantined",
        "rows_read": "Rows read",
        "fraction": "Fraction",
        "max_fraction": "Largest fraction allowed",
        "sample_rows": "Rows in the sample",
    }
    rows = [[_e(label), _scalar(quarantine[key])] for key, label in labels.items() if key in quarantine]
    sample = quarantine.get("sample")
    if isinstance(sample, str) and sample:
        target = sample if "://" in sample else f"{uri.rsplit('/', 1)[0]}/{sample}"
        rows.append(["Sample of quarantined rows", _report_link(target)])
    reasons = quarantine.get("by_reason")
    out = "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"
    if isinstance(reasons, dict) and reasons:
        out += _table(["Reason", "Rows"], [[_e(k), _scalar(v)] for k, v in reasons.items()])
    rest = {k: v for k, v in quarantine.items() if k not in {*labels, "sample", "by_reason"}}
    return out + (_kv_table(rest) if rest else "")


def _validation(uri: str, report: dict) -> str:
    failed = _dicts(report.get("failed"))
    listed = _dicts(report.get("results")) or failed
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
        f"<tr><th>{_e(k)}</th><td>{_scalar(v)}</td></tr>" for k, v in summary.items() if v is not None
    )
    body = [
        f"<p>Validation {_status(report.get('success'), 'PASSED', 'FAILED')}</p>",
        f"<table>{rows}</table>",
    ]
    header = ["Expectation", "Column", "Status", "Unexpected", "Sample offending rows", "Details"]
    for title, scope in (("Row expectations", False), ("Dataset-level expectations", True)):
        entries = [e for e in listed if _is_dataset_level(e) == scope]
        if entries:
            cells = [_expectation_row(e, failed=listed is failed) for e in entries]
            body.append(f"<h2>{title}</h2>{_table(header, cells)}")
    if not listed and isinstance(evaluated, int):
        body.append(f"<p>All {_scalar(evaluated)} expectations passed.</p>")
    elif listed is failed and isinstance(passed, int) and passed:
        body.append(
            f'<p class="muted">The report itemises failures only; the other '
            f"{_e(passed)} expectations passed.</p>"
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
    body.append(_rest(report, known))
    return "".join(body)


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
        f"<tr><th>{_e(k)}</th><td>{_scalar(v)}</td></tr>" for k, v in summary.items() if v is not None
    )
    checks = _dicts(report.get("checks"))
    table = _table(
        ["Check", "Metric", "Observed", "Expected", "Result", "Note"],
        [
            [
                _e(c.get("name", "?")),
                _scalar(c.get("metric")),
                _scalar(c.get("observed")),
                _scalar(c.get("expected")),
                _status(c.get("passed")),
                _scalar(c.get("note") or ""),
            ]
            for c in checks
        ],
    )
    known = {"approved", "checks", "production_version", "model_name", "run_uri", "decided_at", "metrics_uri"}
    return (
        f"<p>Gate {_status(report.get('approved'), 'APPROVED', 'REJECTED')}</p>"
        f"<table>{rows}</table><h2>Checks</h2>{table}{_rest(report, known)}"
    )


def _title(kind: str, uri: str, report: object) -> str:
    if kind == "validation":
        return "Dataset validation report"
    if kind == "gate":
        return "Evaluation gate decision"
    if kind == "model_card" and isinstance(report, dict) and report.get("model"):
        return f"Model card: {report['model']} v{report.get('version', '?')}"
    return f"{_TITLES.get(kind, 'Stored report')}: {_name(uri)}"


def _not_json_page(uri: str, text: str, exc: Exception) -> str:
    body = (
        f'<p class="fail">This object is not valid JSON ({_e(exc)}); its text follows.'
        f"</p><pre>{_e(redact(text))}</pre>"
    )
    return _page(_name(uri), uri, body)


def render_report(uri: str, data: bytes) -> str:
    """The whole HTML page for the stored object ``uri`` whose bytes are ``data``."""
    text = data.decode("utf-8", errors="replace")
    if not uri.endswith(JSON_SUFFIXES):
        return _page(_name(uri), uri, f"<pre>{_e(redact(text))}</pre>")
    try:
        report = redact(json.loads(text))
    except (ValueError, RecursionError) as exc:
        return _not_json_page(uri, text, exc)
    kind = report_kind(uri, report)
    if kind == "validation":
        body = _validation(uri, report)
    elif kind == "gate":
        body = _gate(report)
    else:
        body = _value(report)
    return _page(_title(kind, uri, report), uri, body + _raw(report))


def error_page(status: int, message: str) -> str:
    """A page for a refused or failed request; ``message`` is shown escaped."""
    return _page(f"Report unavailable ({status})", "", f'<p class="fail">{_e(message)}</p>')
