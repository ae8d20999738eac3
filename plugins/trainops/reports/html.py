"""The page primitives every report page is built from: escaping, redaction, values and
tables, links through the report app, and the page frame with its CSS. Pure, no I/O.

Report contents are data and may be hostile (a sample id can be ``<script>``), so every
value goes through :func:`escape`, and :func:`redact` replaces values under credential-like
keys, and passwords inside URLs, by ``***`` before anything is shown. Functions that take
HTML (``table``'s cells, ``page``'s body) say so; everything else takes plain values.

:func:`framed` adds what the app knows about a page beyond its object (:class:`FrameLink`
links to the trainops home, the Airflow run, the run report or model card; a reload while the
run is live), in one place for every page, whichever module rendered its body.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from trainops.cluster.credentials import MASK, credential_name, credential_under_name, mask_text

__all__ = [
    "CSS",
    "REDACTED",
    "FrameLink",
    "dicts",
    "escape",
    "folded",
    "framed",
    "json_value",
    "kv_table",
    "list_of",
    "not_json_page",
    "object_name",
    "other_fields",
    "page",
    "pretty_json",
    "raw_json",
    "redact",
    "report_link",
    "scalar",
    "size_text",
    "table",
    "verdict",
]

REDACTED = MASK

# Dicts nested deeper are shown as JSON text rather than as tables in tables.
_MAX_DEPTH = 5

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5rem;color:#1f2328;max-width:80rem}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
code,pre{font:12px/1.4 ui-monospace,monospace}
pre{background:#f6f8fa;padding:.8rem;overflow:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;margin:.3rem 0}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}.muted{color:#6e7781}.uri{color:#57606a;word-break:break-all}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}
svg.chart{display:block;max-width:100%;height:auto;margin:.3rem 0}
svg.chart text{font:11px system-ui,sans-serif;fill:#57606a}svg.chart text.running{fill:#fff;font-weight:600}
nav.frame{margin:0 0 1rem;padding:.4rem .6rem;background:#f6f8fa;border:1px solid #d0d7de}
nav.frame a{margin:0 .3rem}nav.frame .live{color:#bc4c00;margin-left:.3rem}
details.fold{margin:.6rem 0}details.fold>summary{cursor:pointer;font-weight:600}
details.fold>summary .muted{font-weight:400}
.outcome{font-size:1.15rem;margin:.2rem 0 .6rem}.live{color:#bc4c00}.outcome.live{font-weight:600}
table.figures td{font-size:1.1rem;font-weight:600;padding:.3rem .9rem}
"""


# ----------------------------------------------------------------------------- values


def escape(value: object) -> str:
    """``value`` as text, HTML-escaped (quotes too, so it is safe in attributes)."""
    return html.escape(str(value), quote=True)


def redact(value: object) -> object:
    """A copy of ``value`` with credentials replaced by ``***``: the values under credential-like
    keys, URL passwords and well-known secret formats in any text, as
    :mod:`trainops.cluster.credentials` (the one source, which job manifests refuse by) says."""
    if isinstance(value, dict):
        return {k: _redacted(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def _redacted(key: str, value: object) -> object:
    if isinstance(value, str):
        return REDACTED if credential_under_name(key, value) else mask_text(value)
    if credential_name(key) and value not in (None, ""):
        return REDACTED
    return redact(value)


def verdict(ok: object, yes: str = "PASS", no: str = "FAIL") -> str:
    """``yes`` in green when ``ok``, ``no`` in red when not, "unknown" when None."""
    if ok is None:
        return '<span class="muted">unknown</span>'
    return f'<span class="pass">{yes}</span>' if ok else f'<span class="fail">{no}</span>'


def scalar(value: object) -> str:
    """A JSON scalar: null and booleans as JSON writes them, floats with 6 significant digits."""
    if value is None:
        return '<span class="muted">null</span>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return escape(f"{value:.6g}")
    return escape(value)


def pretty_json(value: object) -> str:
    """``value`` as indented JSON text (not escaped)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def json_value(value: object, depth: int = 0) -> str:
    """Any JSON value as HTML: dicts as key/value tables, lists of dicts as tables."""
    if isinstance(value, dict):
        if not value:
            return '<span class="muted">{}</span>'
        if depth >= _MAX_DEPTH:
            return f"<pre>{escape(pretty_json(value))}</pre>"
        return kv_table(value, depth + 1)
    if isinstance(value, list):
        if not value:
            return '<span class="muted">[]</span>'
        if all(not isinstance(v, (dict, list)) for v in value):
            return ", ".join(scalar(v) for v in value)
        if all(isinstance(v, dict) for v in value) and depth < _MAX_DEPTH:
            columns = list(dict.fromkeys(k for v in value for k in v))
            rows = [[json_value(v.get(c), depth + 1) for c in columns] for v in value]
            return table([escape(c) for c in columns], rows)
        items = "".join(f"<li>{json_value(v, depth + 1)}</li>" for v in value)
        return f"<ol>{items}</ol>"
    return scalar(value)


def dicts(value: object) -> list[dict[Any, Any]]:
    """The dicts in ``value`` when it is a list; [] for anything else."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def list_of(value: object) -> list[Any]:
    """``value`` when it is a list; [] for anything else."""
    return value if isinstance(value, list) else []


def object_name(uri: str) -> str:
    """The last segment of a storage URI (``validation.json``)."""
    return uri.rstrip("/").rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------- tables


def kv_table(mapping: dict[Any, Any], depth: int = 0) -> str:
    """A two-column table: each key, escaped, beside its value as :func:`json_value` shows it."""
    rows = "".join(
        f"<tr><th>{escape(k)}</th><td>{json_value(v, depth)}</td></tr>" for k, v in mapping.items()
    )
    return f"<table>{rows}</table>"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A table from already-escaped header and cell HTML."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def other_fields(report: dict[Any, Any], shown: set[str]) -> str:
    """The report's fields a page did not show otherwise, folded under "Other fields"."""
    rest = {k: v for k, v in report.items() if k not in shown}
    note = ", ".join(str(k) for k in rest)
    return (
        folded("Other fields", kv_table(rest), note=note if len(note) <= 120 else note[:117] + "...")
        if rest
        else ""
    )


def size_text(n_bytes: int) -> str:
    """A size as a person reads it: ``812 bytes``, ``11.3 KB``, ``2.4 MB`` (1 KB = 1,000 bytes)."""
    if n_bytes < 1000:
        return f"{n_bytes} bytes"
    if n_bytes < 1_000_000:
        return f"{n_bytes / 1000:.1f} KB"
    return f"{n_bytes / 1_000_000:.1f} MB"


def folded(summary: str, body: str, *, note: str = "", opened: bool = False) -> str:
    """``body`` (HTML) folded in a ``<details>``, closed unless ``opened``, whose summary line
    is ``summary`` (plain text) and, muted after it, ``note`` (plain text: what is inside, how
    large)."""
    extra = f' <span class="muted">({escape(note)})</span>' if note else ""
    state = " open" if opened else ""
    return f'<details class="fold"{state}><summary>{escape(summary)}{extra}</summary>{body}</details>'


def raw_json(report: object, name: str = "", *, opened: bool = False) -> str:
    """The "Raw JSON" that ends every JSON page, folded (``opened``: shown, for a page whose
    record is damaged, where the JSON is what there is to read): its summary says what it is
    (``name``, the object's file name) and how large."""
    text = pretty_json(report)
    lines = text.count("\n") + 1
    note = f"{name + ': ' if name else ''}{size_text(len(text.encode()))}, {lines:,} lines"
    return folded("Raw JSON", f"<pre>{escape(text)}</pre>", note=note, opened=opened)


def report_link(uri: str, label: str | None = None) -> str:
    """A link to another stored object through this app (relative, so proxies keep working),
    showing the URI, or ``label`` (plain text) when given."""
    href = "report?" + urlencode({"uri": uri})
    text = f"<code>{escape(uri)}</code>" if label is None else escape(label)
    return f'<a href="{escape(href)}">{text}</a>'


# ----------------------------------------------------------------------------- pages


def page(title: str, uri: str, body: str) -> str:
    """The whole HTML document: ``title``, the object's ``uri`` (if any) and ``body`` (HTML)."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} - trainops</title><style>{CSS}</style></head><body>"
        f"<header><h1>{escape(title)}</h1>"
        + (f'<p class="uri"><code>{escape(uri)}</code></p>' if uri else "")
        + f"</header>{body}</body></html>"
    )


def not_json_page(uri: str, text: str, exc: Exception) -> str:
    """The page for a ``.json`` object that does not parse: the error, then its text."""
    body = (
        f'<p class="fail">This object is not valid JSON ({escape(exc)}); its text follows.'
        f"</p><pre>{escape(redact(text))}</pre>"
    )
    return page(object_name(uri), uri, body)


@dataclass(frozen=True)
class FrameLink:
    """A link in the bar above a page. ``href`` is a URL as is (a relative one stays inside the
    report app); ``airflow`` marks a page of Airflow's own UI (class ``airflow``). Links open
    where the page is: Airflow shows the report app in a sandboxed iframe that may not navigate
    the window or open a tab, so a ``target`` would make the link dead there."""

    label: str
    href: str
    airflow: bool = False


def framed(document: str, links: Sequence[FrameLink], *, refresh_s: int | None = None) -> str:
    """``document`` (a page from :func:`page`) with a bar of ``links`` above its header, and,
    when ``refresh_s`` is given, a reload every ``refresh_s`` seconds (a ``<meta>`` refresh: the
    pages run no script) that the bar announces."""
    items = []
    for link in links:
        css = ' class="airflow"' if link.airflow else ""
        items.append(f'<a{css} href="{escape(link.href)}">{escape(link.label)}</a>')
    head = ""
    if refresh_s is not None:
        head = f'<meta http-equiv="refresh" content="{int(refresh_s)}">'
        items.append(f'<span class="live">live: this page reloads every {int(refresh_s)} s</span>')
    bar = f'<nav class="frame">{" · ".join(items)}</nav>' if items else ""
    # page() writes "</head>" and "<body>" once; escaped contents cannot hold either.
    return document.replace("</head>", head + "</head>", 1).replace("<body>", "<body>" + bar, 1)
