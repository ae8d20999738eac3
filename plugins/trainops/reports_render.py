"""Stored reports as HTML pages: pure functions from (uri, bytes) to text, no I/O.

Report contents are data and may be hostile (a sample id can be ``<script>``), so every
value goes through :func:`html.escape`, and values under credential-like keys, or
passwords inside URLs, are replaced by ``***`` before anything is shown.
"""

from __future__ import annotations

import html
import json
import math
import re
import statistics
from urllib.parse import urlencode

from trainer.contract import MANIFEST_FORMAT
from trainops.metrics import records as metric_records
from trainops.promotion import CARD_FORMAT
from trainops.staging.expectations import DATASET_EXPECTATIONS

__all__ = ["JSON_SUFFIXES", "TEXT_SUFFIXES", "error_page", "redact", "render_report",
           "render_run_report", "report_kind", "run_report", "svg_line_chart"]

JSON_SUFFIXES = (".json",)
TEXT_SUFFIXES = (".md", ".txt", ".yaml", ".yml", ".jsonl", ".log")
REDACTED = "***"

_SECRET_PARTS = ("password", "passwd", "secret", "credential", "private_key", "access_key",
                 "authorization", "api_key", "apikey")
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]+:)[^/@\s]+@")
_MAX_DEPTH = 5
_TITLES = {"model_card": "Model card", "job": "Training job record",
           "manifest": "Dataset manifest", "json": "Stored report"}

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
    return (any(part in name for part in _SECRET_PARTS) or name == "token"
            or name.endswith("_token"))


def redact(value: object) -> object:
    """A copy of ``value`` with credential-like keys and URL passwords replaced by ``***``."""
    if isinstance(value, dict):
        return {k: REDACTED if _is_secret_key(str(k)) and v not in (None, "") else redact(v)
                for k, v in value.items()}
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
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_value(v, depth)}</td></tr>"
                   for k, v in mapping.items())
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
    details = {k: entry[k] for k in ("observed_value", "error", "sample_values")
               if entry.get(k) is not None}
    kwargs = entry.get("kwargs") if isinstance(entry.get("kwargs"), dict) else {}
    kwargs = {k: v for k, v in kwargs.items() if k != "column"}
    if kwargs:
        details["kwargs"] = kwargs
    status = _status(ok)
    if ok and isinstance(entry.get("quarantined"), int) and entry["quarantined"]:
        status += f", {_e(entry['quarantined'])} quarantined"
    return [_e(entry.get("expectation", "?")), _scalar(column), status,
            _scalar(entry.get("unexpected_count")), samples,
            _value(details) if details else '<span class="muted">-</span>']


def _report_link(uri: str) -> str:
    """A link to another stored object through this app (relative, so proxies keep working)."""
    href = "report?" + urlencode({"uri": uri})
    return f'<a href="{_e(href)}"><code>{_e(uri)}</code></a>'


def _quarantine(uri: str, quarantine: object) -> str:
    if not isinstance(quarantine, dict):
        return _value(quarantine)
    labels = {"rows": "Rows quarantined", "rows_read": "Rows read", "fraction": "Fraction",
              "max_fraction": "Largest fraction allowed", "sample_rows": "Rows in the sample"}
    rows = [[_e(label), _scalar(quarantine[key])] for key, label in labels.items()
            if key in quarantine]
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
    summary = {"Dataset": _dataset_of(uri), "Rows checked": report.get("rows"),
               "Expectations evaluated": evaluated, "Passed": passed, "Failed": len(failed)}
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_scalar(v)}</td></tr>"
                   for k, v in summary.items() if v is not None)
    body = [f"<p>Validation {_status(report.get('success'), 'PASSED', 'FAILED')}</p>",
            f"<table>{rows}</table>"]
    header = ["Expectation", "Column", "Status", "Unexpected", "Sample offending rows",
              "Details"]
    for title, scope in (("Row expectations", False), ("Dataset-level expectations", True)):
        entries = [e for e in listed if _is_dataset_level(e) == scope]
        if entries:
            cells = [_expectation_row(e, failed=listed is failed) for e in entries]
            body.append(f"<h2>{title}</h2>{_table(header, cells)}")
    if not listed and isinstance(evaluated, int):
        body.append(f"<p>All {_scalar(evaluated)} expectations passed.</p>")
    elif listed is failed and isinstance(passed, int) and passed:
        body.append(f'<p class="muted">The report itemises failures only; the other '
                    f"{_e(passed)} expectations passed.</p>")
    if "quarantine" in report:
        body.append(f"<h2>Quarantine</h2>{_quarantine(uri, report['quarantine'])}")
    known = {"success", "rows", "evaluated_expectations", "successful_expectations", "failed",
             "results", "quarantine"}
    body.append(_rest(report, known))
    return "".join(body)


def _gate(report: dict) -> str:
    version = report.get("production_version")
    summary = {"Model": report.get("model_name"), "Run": report.get("run_uri"),
               "Compared against": f"production v{version}" if version is not None
               else "no production model",
               "Decided at": report.get("decided_at"), "Metrics": report.get("metrics_uri")}
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_scalar(v)}</td></tr>"
                   for k, v in summary.items() if v is not None)
    checks = _dicts(report.get("checks"))
    table = _table(["Check", "Metric", "Observed", "Expected", "Result", "Note"], [
        [_e(c.get("name", "?")), _scalar(c.get("metric")), _scalar(c.get("observed")),
         _scalar(c.get("expected")), _status(c.get("passed")), _scalar(c.get("note") or "")]
        for c in checks])
    known = {"approved", "checks", "production_version", "model_name", "run_uri",
             "decided_at", "metrics_uri"}
    return (f"<p>Gate {_status(report.get('approved'), 'APPROVED', 'REJECTED')}</p>"
            f"<table>{rows}</table><h2>Checks</h2>{table}{_rest(report, known)}")


def _title(kind: str, uri: str, report: object) -> str:
    if kind == "validation":
        return "Dataset validation report"
    if kind == "gate":
        return "Evaluation gate decision"
    if kind == "model_card" and isinstance(report, dict) and report.get("model"):
        return f"Model card: {report['model']} v{report.get('version', '?')}"
    return f"{_TITLES.get(kind, 'Stored report')}: {_name(uri)}"


def _not_json_page(uri: str, text: str, exc: Exception) -> str:
    body = (f'<p class="fail">This object is not valid JSON ({_e(exc)}); its text follows.'
            f"</p><pre>{_e(redact(text))}</pre>")
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


# ----------------------------------------------------------------------------- charts

CHART_COLOURS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#1b7c83", "#6e7781")
_DASHES = ("", "6 3", "2 3", "9 3 2 3")
MAX_CHART_POINTS = 1000  # per series; longer series are thinned evenly (first and last kept)
_LEGEND_ENTRY_W, _LEGEND_ROW_H = 190, 18


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tick(value: float) -> str:
    """An axis label: integers as such, other numbers with 4 significant digits."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _domain(values: list[float]) -> tuple[float, float]:
    """``(min, max)`` of ``values``, widened around a single value so it can be scaled
    (by at least 1 around a whole number, such as a step)."""
    lo, hi = min(values), max(values)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        if float(lo).is_integer():
            pad = max(1.0, float(round(pad)))
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _thin(points: list, limit: int = MAX_CHART_POINTS) -> list:
    """At most ``limit`` evenly spaced points, keeping the first and the last."""
    if len(points) <= limit:
        return points
    stride = math.ceil((len(points) - 1) / (limit - 1))
    kept = points[::stride]
    return kept if kept[-1] is points[-1] else kept + [points[-1]]


def _svg_text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{_e(text)}</text>')


def _svg_frame(box: tuple[float, float, float, float]) -> str:
    left, top, width, height = box
    return (f'<line x1="{left}" y1="{top}" x2="{left + width}" y2="{top}" stroke="#d0d7de" '
            f'stroke-dasharray="3 3"/><path d="M{left} {top}V{top + height}H{left + width}" '
            'fill="none" stroke="#57606a"/>')


def _svg_axes(box: tuple[float, float, float, float], x_dom: tuple, y_dom: tuple,
              x_label: str, y_label: str) -> str:
    """The frame, the min/max labels of both axes and the axis titles."""
    left, top, width, height = box
    bottom, right = top + height, left + width
    return "".join([
        _svg_frame(box),
        _svg_text(left - 6, top + 4, _tick(y_dom[1]), "end", ' class="tick y-max"'),
        _svg_text(left - 6, bottom, _tick(y_dom[0]), "end", ' class="tick y-min"'),
        _svg_text(left, bottom + 14, _tick(x_dom[0]), "start", ' class="tick x-min"'),
        _svg_text(right, bottom + 14, _tick(x_dom[1]), "end", ' class="tick x-max"'),
        _svg_text(left + width / 2, bottom + 28, x_label, "middle"),
        _svg_text(14, top + height / 2, y_label, "middle",
                  f' transform="rotate(-90 14 {top + height / 2:.1f})"'),
    ])


def _svg_legend(labels: list[str], left: float, top: float, width: float) -> str:
    per_row = max(1, int(width // _LEGEND_ENTRY_W))
    out = []
    for i, label in enumerate(labels):
        x = left + (i % per_row) * _LEGEND_ENTRY_W
        y = top + (i // per_row) * _LEGEND_ROW_H
        out.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 22}" y2="{y - 4}" '
                   f'stroke="{CHART_COLOURS[i % len(CHART_COLOURS)]}" stroke-width="2"'
                   f'{_dash(i)}/>' + _svg_text(x + 28, y, label, extra=' class="legend"'))
    return "".join(out)


def _dash(i: int) -> str:
    dash = _DASHES[i % len(_DASHES)]
    return f' stroke-dasharray="{dash}"' if dash else ""


def svg_line_chart(series: list[tuple[str, list[tuple[float, float]]]], *, width: int = 720,
                   height: int = 260, x_label: str = "step", y_label: str = "loss",
                   title: str = "") -> str:
    """An inline SVG line chart: one polyline per ``(label, [(x, y), ...])`` series.

    Each series has its own colour and dash pattern and a dot at its first point (where an
    attempt starts, or resumes); a legend follows the plot. The axes span the data, labelled
    with its minimum and maximum. Points with a non-finite coordinate are left out; with no
    point at all the chart says "no data". No script, no external references.
    """
    series = [(str(label), [(float(x), float(y)) for x, y in points if _finite(x) and _finite(y)])
              for label, points in series]
    left, right, top, bottom = 64, 16, 12, 40
    box = (left, top, width - left - right, height - top - bottom)
    rows = math.ceil(len(series) / max(1, int(box[2] // _LEGEND_ENTRY_W))) if series else 0
    total = height + rows * _LEGEND_ROW_H
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{total}" viewBox="0 0 {width} {total}" role="img" '
           f'aria-label="{_e(title or y_label + " by " + x_label)}">']
    if title:
        out.append(f"<title>{_e(title)}</title>")
    xs = [x for _, points in series for x, _ in points]
    ys = [y for _, points in series for _, y in points]
    if not xs:
        out.append(_svg_frame(box))
        out.append(_svg_text(left + box[2] / 2, top + box[3] / 2, "no data", "middle"))
        return "".join(out) + "</svg>"
    x_dom, y_dom = _domain(xs), _domain(ys)
    out.append(_svg_axes(box, x_dom, y_dom, x_label, y_label))

    def at(x: float, y: float) -> tuple[float, float]:
        return (left + (x - x_dom[0]) / (x_dom[1] - x_dom[0]) * box[2],
                top + box[3] - (y - y_dom[0]) / (y_dom[1] - y_dom[0]) * box[3])

    for i, (label, points) in enumerate(series):
        if not points:
            continue
        colour = CHART_COLOURS[i % len(CHART_COLOURS)]
        scaled = [at(x, y) for x, y in _thin(sorted(points))]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in scaled)
        out.append(f'<polyline data-series="{_e(label)}" points="{coords}" fill="none" '
                   f'stroke="{colour}" stroke-width="1.5" stroke-linejoin="round"{_dash(i)}/>')
        out.append(f'<circle cx="{scaled[0][0]:.1f}" cy="{scaled[0][1]:.1f}" r="3" '
                   f'fill="{colour}"/>')
    out.append(_svg_legend([label for label, _ in series], left, height + 4, box[2]))
    return "".join(out) + "</svg>"


# ----------------------------------------------------------------------------- run report

_OUTCOME_CLASS = {"succeeded": "pass", "error": "fail", "infra": "fail", "failed": "fail"}


def _by_attempt(records: list[dict]) -> dict[object, list[dict]]:
    """Metrics records grouped by attempt, in attempt order (numbered attempts first)."""
    groups: dict[object, list[dict]] = {}
    for rec in records:
        attempt = rec.get("attempt")
        groups.setdefault(attempt if isinstance(attempt, (int, str)) else None, []).append(rec)
    order = sorted(groups, key=lambda a: (0, a, "") if isinstance(a, int) else (1, 0, str(a)))
    return {a: groups[a] for a in order}


def _attempt_name(attempt: object) -> str:
    return f"attempt {attempt}" if attempt is not None else "attempt ?"


def _last(recs: list[dict]) -> dict:
    """The record of the highest step (the later one in the file for a repeated step)."""
    return max(reversed(recs), key=lambda r: r["step"])


def _loss_points(recs: list[dict]) -> list[tuple[int, float]]:
    """``(step, loss)`` with a finite loss; a repeated step keeps its later record."""
    points = {r["step"]: float(r["loss"]) for r in recs if _finite(r.get("loss"))}
    return sorted(points.items())


def _outcome(value: object) -> str:
    css = _OUTCOME_CLASS.get(str(value))
    return f'<span class="{css}">{_e(value)}</span>' if css else _scalar(value)


def _run_summary(uri: str, job: dict, final: dict | None, metrics_read: bool) -> str:
    attempts = _dicts(job.get("attempts"))
    lost = [a.get("steps_lost") for a in attempts if _finite(a.get("steps_lost"))]
    rows = [("Status", _outcome(job.get("status", "unknown"))),
            ("Attempts", _scalar(len(attempts))),
            ("Preemptions", _scalar(job.get("preemptions"))),
            ("Infrastructure failures", _scalar(job.get("infra_failures"))),
            ("Steps lost to interruptions", _scalar(sum(lost)) if lost else None),
            ("Last logged step", _scalar(final["step"]) if final else None),
            ("Loss at that step", _scalar(final.get("loss")) if final else None),
            ("Cluster", _scalar(job.get("cluster")) if "cluster" in job else None),
            ("Capacity (latest)", _scalar(job.get("capacity")) if "capacity" in job else None)]
    for label, key in (("Config", "config_uri"), ("Run prefix", "run_uri")):
        value = job.get(key)
        if isinstance(value, str) and value:
            rows.append((label, _report_link(value) if value.endswith(TEXT_SUFFIXES)
                         else f"<code>{_e(value)}</code>"))
    if uri.endswith("/job.json") and metrics_read:
        rows.append(("Metrics", _report_link(uri[: -len("job.json")] + "metrics.jsonl")))
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>"
                               for k, v in rows if v is not None) + "</table>"


def _loss_section(groups: dict, metrics_text: str | None, metrics_problem: str | None,
                  outcomes: dict) -> str:
    head = "<h2>Loss</h2>"
    if metrics_text is None:
        why = metrics_problem or "metrics.jsonl was not found next to job.json"
        return f'{head}<p class="muted">No loss curve: {_e(why)}.</p>'
    series = [(_attempt_name(a) + (f" ({outcomes[a]})" if a in outcomes else ""),
               _loss_points(recs)) for a, recs in groups.items()]
    bad = [(a, r["step"]) for a, recs in groups.items() for r in recs
           if "loss" in r and not _finite(r["loss"])]
    note = ""
    if bad:
        note = (f'<p class="fail">The loss was not a finite number (NaN or infinite) at '
                f"{len(bad)} logged step(s), first at step {_e(bad[0][1])} of "
                f"{_e(_attempt_name(bad[0][0]))}; those steps are not drawn.</p>")
    if not any(points for _, points in series):
        return f'{head}{note}<p class="muted">No loss values have been logged yet.</p>'
    many = any(len(points) > MAX_CHART_POINTS for _, points in series)
    caption = ("<p class=\"muted\">Loss by step, one line per attempt; a dot marks where an "
               "attempt starts (a resume starts at the last committed checkpoint)."
               + (f" Long attempts are drawn with {MAX_CHART_POINTS} evenly spaced points."
                  if many else "") + "</p>")
    return head + note + svg_line_chart(series, title="Training loss by step") + caption


def _throughput(groups: dict) -> str:
    has_mfu = any(_finite(r.get("mfu")) for recs in groups.values() for r in recs)
    header = ["Attempt", "Logged steps", "Steps", "Median tokens/s", "Last tokens/s",
              "Last loss"] + (["Median MFU"] if has_mfu else [])
    rows = []
    for attempt, recs in groups.items():
        last = _last(recs)
        speeds = [r["tokens_per_s"] for r in recs if _finite(r.get("tokens_per_s"))]
        mfus = [r["mfu"] for r in recs if _finite(r.get("mfu"))]
        row = [_e(_attempt_name(attempt)), _scalar(len(recs)),
               _e(f"{min(r['step'] for r in recs)} to {last['step']}"),
               _rate(statistics.median(speeds)) if speeds else "-",
               _rate(last.get("tokens_per_s")), _scalar(last.get("loss"))]
        if has_mfu:
            row.append(_e(f"{100 * statistics.median(mfus):.1f}%") if mfus else "-")
        rows.append(row)
    if not rows:
        return ""
    return f"<h2>Throughput</h2>{_table([_e(h) for h in header], rows)}"


def _rate(value: object) -> str:
    return _e(f"{value:,.0f}") if _finite(value) else _scalar(value)


def _cell(value: object) -> str:
    return '<span class="muted">-</span>' if value is None else _scalar(value)


def _node_types(value: object) -> str:
    nodes = _dicts(value)
    if not nodes:
        return '<span class="muted">-</span>' if not value else _value(value)
    parts = []
    for node in nodes:
        kind = node.get("instance_type") or "?"
        capacity = f" ({node['capacity_type']})" if node.get("capacity_type") else ""
        parts.append(f"node {node.get('index', '?')}: {kind}{capacity}")
    return "<br>".join(_e(p) for p in parts)


def _attempts_table(job: dict) -> str:
    attempts = _dicts(job.get("attempts"))
    if not attempts:
        return '<h2>Attempts</h2><p class="muted">No attempt has been launched yet.</p>'
    running = job.get("status") == "running"
    rows = []
    for i, a in enumerate(attempts):
        ended = a.get("ended_at")
        if ended is None and running and i == len(attempts) - 1:
            ended_cell = '<span class="muted">running</span>'
        else:
            ended_cell = _cell(ended)
        decision = a.get("decision")
        decision = decision.get("reason") if isinstance(decision, dict) else decision
        outcome = a.get("classification")
        rows.append([_cell(a.get("attempt", i + 1)), _cell(a.get("capacity")),
                     _cell(a.get("launched_at")), ended_cell,
                     _cell(outcome) if outcome is None else _outcome(outcome),
                     _cell(a.get("reason")), _cell(a.get("steps_lost")),
                     _node_types(a.get("node_types")), _cell(decision)])
    header = ["Attempt", "Capacity", "Launched", "Ended", "Classification", "Reason",
              "Steps lost", "Node types", "Decision"]
    return f"<h2>Attempts</h2>{_table(header, rows)}"


def run_report(job: dict, metrics_text: str | None, *, uri: str = "",
               metrics_problem: str | None = None) -> str:
    """A training run's report (HTML, no page around it) from its ``job.json`` and metrics.

    :param job: the run's ``job.json``, parsed.
    :param metrics_text: its ``metrics.jsonl``, or None when it could not be read (the page
        then says so, with ``metrics_problem`` as the reason, and draws no curve).
    :param uri: the job.json's storage URI, for links to the config and the metrics.
    """
    job = redact(job)
    groups = _by_attempt(metric_records(metrics_text or ""))
    final = _last([r for recs in groups.values() for r in recs]) if groups else None
    outcomes = {a.get("attempt"): a["classification"] for a in _dicts(job.get("attempts"))
                if isinstance(a.get("classification"), str)}
    return (_run_summary(uri, job, final, metrics_text is not None)
            + _loss_section(groups, metrics_text, metrics_problem, outcomes)
            + _throughput(groups) + _attempts_table(job))


def _run_title(uri: str) -> str:
    parts = uri.split("/")
    if len(parts) >= 6 and parts[-5] == "runs":
        return f"Training run: {parts[-4]} / {parts[-3]} / {parts[-2]}"
    return f"Training run: {_name(uri)}"


def render_run_report(uri: str, data: bytes, metrics_text: str | None, *,
                      metrics_problem: str | None = None) -> str:
    """The page for a run's ``job.json`` (bytes ``data``) with its ``metrics.jsonl`` text.

    The report (status, loss curve, throughput, attempts) comes first and the raw JSON last;
    a ``job.json`` that is not a JSON object gets :func:`render_report`'s page.
    """
    text = data.decode("utf-8", errors="replace")
    try:
        job = redact(json.loads(text))
    except (ValueError, RecursionError) as exc:
        return _not_json_page(uri, text, exc)
    if not isinstance(job, dict):
        return render_report(uri, data)
    body = run_report(job, metrics_text, uri=uri, metrics_problem=metrics_problem)
    return _page(_run_title(uri), uri, body + _raw(job))


def error_page(status: int, message: str) -> str:
    """A page for a refused or failed request; ``message`` is shown escaped."""
    return _page(f"Report unavailable ({status})", "", f'<p class="fail">{_e(message)}</p>')
