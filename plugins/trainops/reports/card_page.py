"""The model card page: a promoted version's ``card.json`` as a page a person reads top down.

First the verdict and the headline figures (eval loss and perplexity against production, the
gate, training, cost, dataset), then the gate's checks (failed ones first and in red), the
evaluation per metric, the dataset and its validation, the lineage (parent version, run,
config, export, evaluation), training and its cost, and the files. The full trainer config,
any fields the page does not know and the raw card are folded away in ``<details>``.

Every URI that names a report the app can show becomes a link to it: a folder links to its
report file (a dataset to its ``manifest.json``, a version to its ``card.json``, a run to its
``job.json``, an export to its ``config.json``). Whether a URI can be shown is the caller's
``linkable`` (the app passes its storage-root check); by default any ``s3://`` or ``file://``
URI of a file the app renders. Pure, no I/O; every value is escaped and redacted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from trainops.reports.html import (
    dicts,
    escape,
    json_value,
    not_json_page,
    page,
    pretty_json,
    redact,
    report_link,
    scalar,
    table,
    verdict,
)
from trainops.reports.pages import JSON_SUFFIXES, TEXT_SUFFIXES, render_report

__all__ = ["CARD_CSS", "card_report", "default_linkable", "render_card_page"]

Linkable = Callable[[str], bool]

CARD_CSS = (
    ".tiles{display:flex;flex-wrap:wrap;gap:.6rem;margin:.8rem 0}"
    ".tile{flex:1 1 9rem;border:1px solid #d0d7de;border-radius:6px;padding:.5rem .8rem}"
    ".tile .label{font-size:12px;color:#57606a}"
    ".tile .value{font-size:1.35rem;font-weight:600;white-space:nowrap}"
    ".tile .sub{font-size:12px;color:#57606a}"
    ".tile.bad{border-color:#cf222e}.tile.good{border-color:#1a7f37}"
    ".verdict{font-size:1.05rem;margin:.4rem 0}"
    ".cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(26rem,1fr));gap:0 2rem}"
    "details{margin:.5rem 0}summary{cursor:pointer;font-weight:600}"
    "tr.failed td{background:#ffebe9}"
)
# The keys the page shows in its sections; any other is listed under "Other fields".
# fmt: off
_KNOWN = frozenset((
    "format", "model", "version", "uri", "export_uri", "files", "trainops_version", "promoted_at",
    "dataset", "run_uri", "config_uri", "config_sha256", "config", "eval_basis", "metrics", "gate",
    "training", "preemptions_survived", "steps", "training_cost", "lineage",
))
# fmt: on
_METRICS = (("eval_loss", "Eval loss"), ("perplexity", "Perplexity"), ("tokens", "Tokens evaluated"))


def default_linkable(uri: str) -> bool:
    """A storage URI of a file the report app renders."""
    return uri.startswith(("s3://", "file://")) and uri.endswith(JSON_SUFFIXES + TEXT_SUFFIXES)


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _num(value: object, digits: int = 4) -> str:
    """A figure for a tile or a cell: integers with separators, floats to ``digits`` significant."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _uri(uri: object, linkable: Linkable, label: str | None = None) -> str:
    """A link through the report app when ``linkable``, else the URI as code."""
    if not isinstance(uri, str) or not uri:
        return '<span class="muted">-</span>'
    return report_link(uri, label) if linkable(uri) else f"<code>{escape(uri)}</code>"


def _folder(uri: object, file: str, linkable: Linkable) -> str:
    """A folder URI, linked to the report file ``file`` inside it when that can be shown."""
    if not isinstance(uri, str) or not uri:
        return '<span class="muted">-</span>'
    inside = uri.rstrip("/") + "/" + file
    return f"<code>{escape(uri)}</code>" + (f" ({report_link(inside, file)})" if linkable(inside) else "")


def _rows(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _tile(label: str, value: str, sub: str = "", css: str = "") -> str:
    return (
        f'<div class="tile{" " + css if css else ""}"><div class="label">{escape(label)}</div>'
        f'<div class="value">{value}</div><div class="sub">{sub}</div></div>'
    )


def _failed_checks(gate: Mapping) -> list[Mapping]:
    return [c for c in dicts(gate.get("checks")) if c.get("passed") is False]


def _approved(gate: Mapping) -> bool | None:
    """The gate's verdict: rejected when it says so or a check failed; None when unrecorded."""
    approved = gate.get("approved")
    if approved is False or _failed_checks(gate):
        return False
    return True if approved is True else None


def _headline(card: Mapping) -> str:
    metrics, gate = _map(card.get("metrics")), _map(card.get("gate"))
    candidate, production = _map(metrics.get("candidate")), _map(metrics.get("production"))
    version = metrics.get("production_version")
    tiles = []
    for key, label in _METRICS[:2]:
        ours, theirs = candidate.get(key), production.get(key)
        if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
            sub = f"production v{escape(version)}: {escape(_num(theirs))} ({escape(f'{ours - theirs:+.4g}')})"
            css = "good" if ours <= theirs else "bad"
        else:
            sub, css = "no production model to compare", ""
        tiles.append(_tile(label, escape(_num(ours)), sub, css))
    checks, failed = dicts(gate.get("checks")), _failed_checks(gate)
    ok = _approved(gate)
    tiles.append(
        _tile(
            "Gate",
            verdict(ok, "APPROVED", "REJECTED"),
            escape(f"{len(checks) - len(failed)} of {len(checks)} checks passed"),
            "" if ok is None else "good" if ok else "bad",
        )
    )
    training = _map(card.get("training"))
    tiles.append(
        _tile(
            "Training steps",
            escape(_num(training.get("steps", card.get("steps")))),
            escape(
                f"{_num(training.get('attempts'))} attempt(s), "
                f"{_num(training.get('preemptions'))} preemption(s) survived"
            ),
        )
    )
    cost = card.get("training_cost")
    if isinstance(cost, Mapping):
        currency = cost.get("currency") or ""
        tiles.append(
            _tile(
                "Training cost (estimate)",
                escape(f"{_num(cost.get('cost'), 3)} {currency}".strip()),
                escape(f"goodput {_percent(cost.get('goodput'))}"),
            )
        )
    else:
        tiles.append(_tile("Training cost", '<span class="muted">-</span>', "no cost was recorded"))
    dataset = _map(card.get("dataset"))
    tiles.append(
        _tile(
            "Dataset",
            escape(f"{dataset.get('dataset_name') or '-'}"),
            escape(f"version {dataset.get('version') or '-'}, {_num(dataset.get('rows'))} rows"),
        )
    )
    return f'<div class="tiles">{"".join(tiles)}</div>'


def _percent(value: object) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _verdict_line(card: Mapping) -> str:
    gate = _map(card.get("gate"))
    against = gate.get("production_version")
    versus = f"against production v{escape(against)}" if against is not None else "with no production model"
    return (
        f'<p class="verdict">Gate {verdict(_approved(gate), "APPROVED", "REJECTED")} {versus}; '
        f"promoted at {escape(card.get('promoted_at') or '-')} by trainops "
        f"{escape(card.get('trainops_version') or '-')}.</p>"
    )


def _gate(card: Mapping, linkable: Linkable) -> str:
    gate = _map(card.get("gate"))
    checks, failed = dicts(gate.get("checks")), _failed_checks(gate)
    out = ["<h2>Gate checks</h2>"]
    if failed:
        names = ", ".join(str(c.get("name", "?")) for c in failed)
        out.append(f'<p class="fail">{len(failed)} check(s) failed: {escape(names)}.</p>')
    if not checks:
        out.append('<p class="muted">No checks were recorded.</p>')
    else:
        rows = "".join(
            ('<tr class="failed">' if c.get("passed") is False else "<tr>")
            + "".join(
                f"<td>{cell}</td>"
                for cell in (
                    escape(c.get("name", "?")),
                    scalar(c.get("metric")),
                    scalar(c.get("observed")),
                    scalar(c.get("expected")),
                    verdict(c.get("passed")),
                    scalar(c.get("note") or ""),
                )
            )
            + "</tr>"
            for c in sorted(checks, key=lambda c: c.get("passed") is not False)
        )
        head = "".join(f"<th>{h}</th>" for h in ("Check", "Metric", "Observed", "Expected", "Result", "Note"))
        out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    for regate in dicts(gate.get("regates")):
        out.append(
            f"<p>Re-gated against production v{escape(regate.get('production_version'))} "
            f"(production moved from v{escape(regate.get('moved_from'))}): "
            f"{verdict(regate.get('approved'), 'APPROVED', 'REJECTED')}"
            + (f" ({escape(regate['reason'])})" if regate.get("reason") else "")
            + "</p>"
        )
    if gate.get("gate_uri"):
        out.append(f"<p>Decision: {_uri(gate.get('gate_uri'), linkable)}</p>")
    return "".join(out)


def _evaluation(card: Mapping, linkable: Linkable) -> str:
    metrics = _map(card.get("metrics"))
    candidate, production = _map(metrics.get("candidate")), metrics.get("production")
    header = ["Metric", "This version"]
    if isinstance(production, Mapping):
        header.append(f"Production v{escape(metrics.get('production_version'))} at the time")
    rows = []
    for key, label in _METRICS:
        row = [escape(label), escape(_num(candidate.get(key)))]
        if isinstance(production, Mapping):
            row.append(escape(_num(production.get(key))))
        rows.append(row)
    note = "" if isinstance(production, Mapping) else '<p class="muted">There was no production model.</p>'
    where = (
        f"<p>Scores: {_uri(metrics.get('metrics_uri'), linkable)}</p>" if metrics.get("metrics_uri") else ""
    )
    return f"<h2>Evaluation</h2>{note}{table(header, rows)}{where}"


def _dataset(card: Mapping, linkable: Linkable) -> str:
    dataset = _map(card.get("dataset"))
    validation = _map(dataset.get("validation"))
    rows = [
        (
            "Name and version",
            escape(f"{dataset.get('dataset_name') or '-'} / {dataset.get('version') or '-'}"),
        ),
        ("Stored at", _folder(dataset.get("uri"), "manifest.json", linkable)),
        ("Rows", escape(_num(dataset.get("rows")))),
        ("Train tokens", escape(_num(dataset.get("train_tokens")))),
        ("Eval tokens", escape(_num(dataset.get("eval_tokens")))),
        ("Quarantined rows", escape(_num(dataset.get("quarantined_rows")))),
    ]
    if dataset.get("manifest_uri"):
        rows.append(("Manifest", _uri(dataset.get("manifest_uri"), linkable)))
    if validation.get("missing"):
        rows.append(
            ("Validation", f'<span class="fail">missing</span>: {_uri(validation.get("uri"), linkable)}')
        )
    elif validation:
        failed = ", ".join(map(str, validation.get("failed") or [])) or "none"
        rows.append(
            (
                "Validation",
                f"{verdict(validation.get('success'), 'PASSED', 'FAILED')}, "
                f"{escape(_num(validation.get('successful_expectations')))} of "
                f"{escape(_num(validation.get('evaluated_expectations')))} expectations met; "
                f"failed: {escape(failed)}",
            )
        )
        rows.append(("Validation report", _uri(validation.get("uri"), linkable)))
    return f"<div><h2>Dataset</h2>{_rows(rows)}</div>"


def _lineage(card: Mapping, linkable: Linkable) -> str:
    parent = _map(card.get("lineage")).get("parent")
    if isinstance(parent, Mapping) and parent:
        named = f"{parent.get('name') or '?'} v{parent.get('version') or '?'}"
        started = f"warm-started from {escape(named)}: {_folder(parent.get('uri'), 'card.json', linkable)}"
    elif "lineage" in card:
        started = "trained from scratch (random initial weights)"
    else:
        started = '<span class="muted">not recorded (a card older than lineage)</span>'
    training = _map(card.get("training"))
    rows = [
        ("Parent", started),
        ("Training run", _folder(card.get("run_uri"), "job.json", linkable)),
        ("Config", _uri(card.get("config_uri"), linkable)),
        ("Config sha256", f"<code>{escape(card.get('config_sha256') or '-')}</code>"),
        ("Exported weights", _folder(card.get("export_uri"), "config.json", linkable)),
        ("This version", _folder(card.get("uri"), "README.md", linkable)),
    ]
    job = training.get("job_uri")
    if job and job != f"{str(card.get('run_uri') or '').rstrip('/')}/job.json":  # else linked above
        rows.insert(2, ("Run report", _uri(job, linkable)))
    return f"<div><h2>Lineage</h2>{_rows(rows)}</div>"


def _training(card: Mapping, linkable: Linkable) -> str:
    training = _map(card.get("training"))
    labels = (
        ("steps", "Steps"),
        ("attempts", "Attempts"),
        ("preemptions", "Preemptions survived"),
        ("steps_lost", "Steps lost"),
        ("final_loss", "Final training loss"),
    )
    rows = [(label, escape(_num(training.get(key)))) for key, label in labels]
    cost = card.get("training_cost")
    if isinstance(cost, Mapping):
        currency = escape(cost.get("currency") or "")
        figures = (
            ("cost", "Cost"),
            ("on_demand_cost", "On-demand equivalent"),
            ("savings", "Savings"),
            ("billed_gpu_hours", "Billed GPU-hours"),
            ("productive_gpu_hours", "Productive GPU-hours"),
            ("lost_gpu_hours", "Lost GPU-hours"),
        )
        for key, label in figures:
            unit = f" {currency}" if key in ("cost", "on_demand_cost", "savings") and currency else ""
            rows.append((label, escape(_num(cost.get(key), 3)) + unit))
        rows.append(("Goodput", escape(_percent(cost.get("goodput")))))
        cost_note = '<p class="muted">Cost figures are estimates from the run\'s job.json.</p>'
    else:
        rows.append(("Cost", '<span class="muted">no cost was recorded for this run</span>'))
        cost_note = ""
    return f"<div><h2>Training and cost</h2>{_rows(rows)}{cost_note}</div>"


def _files(card: Mapping, linkable: Linkable) -> str:
    files = dicts(card.get("files"))
    if not files:
        return ""
    base = str(card.get("uri") or "").rstrip("/")
    rows = []
    for f in files:
        path = str(f.get("path", "?"))
        cell = _uri(f"{base}/{path}", linkable, path) if base else f"<code>{escape(path)}</code>"
        if cell.startswith("<code>"):
            cell = f"<code>{escape(path)}</code>"  # not a report: the name is enough
        rows.append([cell, escape(_num(f.get("size")))])
    return f"<div><h2>Files</h2>{table(['File', 'Bytes'], rows)}</div>"


def _folded(card: Mapping) -> str:
    out = []
    config = card.get("config")
    if config is not None:
        out.append(
            "<details><summary>Full trainer config</summary>"
            f"<pre>{escape(pretty_json(config))}</pre></details>"
        )
    basis = card.get("eval_basis")
    if basis is not None:
        out.append(f"<details><summary>Evaluation basis</summary>{json_value(basis)}</details>")
    rest = {k: v for k, v in card.items() if k not in _KNOWN}
    if rest:
        out.append(f"<details><summary>Other fields</summary>{json_value(rest)}</details>")
    out.append(f"<details><summary>Raw card.json</summary><pre>{escape(pretty_json(card))}</pre></details>")
    return "".join(out)


def card_report(card: Mapping[str, Any], *, linkable: Linkable = default_linkable) -> str:
    """The model card's HTML (no page around it) for ``card`` as promotion writes it; a key an
    older card lacks is shown as missing, never an error.

    :param linkable: whether a URI may be a link through the report app.
    """
    redacted = redact(dict(card))
    card = redacted if isinstance(redacted, dict) else {}
    return (
        f"<style>{CARD_CSS}</style>"
        + _verdict_line(card)
        + _headline(card)
        + _gate(card, linkable)
        + _evaluation(card, linkable)
        + f'<div class="cols">{_dataset(card, linkable)}{_lineage(card, linkable)}</div>'
        + f'<div class="cols">{_training(card, linkable)}{_files(card, linkable)}</div>'
        + "<h2>Config and record</h2>"
        + _folded(card)
    )


def render_card_page(uri: str, data: bytes, *, linkable: Linkable = default_linkable) -> str:
    """The page for a ``card.json`` (bytes ``data``) at ``uri``; one that is not a JSON object
    gets :func:`trainops.reports.pages.render_report`'s page."""
    text = data.decode("utf-8", errors="replace")
    try:
        card = redact(json.loads(text))
    except (ValueError, RecursionError) as exc:
        return not_json_page(uri, text, exc)
    if not isinstance(card, dict):
        return render_report(uri, data)
    title = f"Model card: {card.get('model') or '?'} v{card.get('version', '?')}"
    return page(title, uri, card_report(card, linkable=linkable))
