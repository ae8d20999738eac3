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
from collections.abc import Mapping
from typing import Any

from trainops.gate.metrics import better, shown_metrics
from trainops.reports.card_sections import (
    Linkable,
    as_map,
    dataset_section,
    default_linkable,
    evaluation_section,
    figure,
    files_section,
    lineage_section,
    percent,
    training_section,
    uri_link,
)
from trainops.reports.html import (
    dicts,
    escape,
    folded,
    json_value,
    page,
    pretty_json,
    redact,
    size_text,
    verdict,
)
from trainops.reports.pages import CHECK_COLUMNS, check_cells, damaged_page
from trainops.shapes import ShapeError, check_card, load

__all__ = ["CARD_CSS", "card_report", "default_linkable", "render_card_page"]

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
    "training", "preemptions_survived", "steps", "training_cost", "lineage", "checkpoint_pick",
))
# fmt: on


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
    metrics, gate = as_map(card.get("metrics")), as_map(card.get("gate"))
    candidate, production = as_map(metrics.get("candidate")), as_map(metrics.get("production"))
    version = metrics.get("production_version")
    tiles = []
    for metric in shown_metrics(candidate, production)[:2]:  # the task's own, first
        ours, theirs = candidate.get(metric.name), production.get(metric.name)
        if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
            sub = (
                f"production v{escape(version)}: {escape(figure(theirs))} ({escape(f'{ours - theirs:+.4g}')})"
            )
            css = {True: "good", False: "bad", None: ""}[better(metric, ours, theirs)]
        else:
            sub, css = "no production model to compare", ""
        tiles.append(_tile(metric.label, escape(figure(ours)), sub, css))
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
    training = as_map(card.get("training"))
    tiles.append(
        _tile(
            "Training steps",
            escape(figure(training.get("steps", card.get("steps")))),
            escape(
                f"{figure(training.get('attempts'))} attempt(s), "
                f"{figure(training.get('preemptions'))} preemption(s) survived"
            ),
        )
    )
    pick = card.get("checkpoint_pick")
    if isinstance(pick, Mapping):
        tiles.append(
            _tile(
                "Promoted checkpoint",
                escape(f"step {figure(pick.get('step'))} of {figure(pick.get('last_step'))}"),
                escape(str(pick.get("why") or "")),
            )
        )
    cost = card.get("training_cost")
    if isinstance(cost, Mapping):
        currency = cost.get("currency") or ""
        tiles.append(
            _tile(
                "Training cost (estimate)",
                escape(f"{figure(cost.get('cost'), 3)} {currency}".strip()),
                escape(f"goodput {percent(cost.get('goodput'))}"),
            )
        )
    else:
        tiles.append(_tile("Training cost", '<span class="muted">-</span>', "no cost was recorded"))
    dataset = as_map(card.get("dataset"))
    tiles.append(
        _tile(
            "Dataset",
            escape(f"{dataset.get('dataset_name') or '-'}"),
            escape(f"version {dataset.get('version') or '-'}, {figure(dataset.get('rows'))} rows"),
        )
    )
    return f'<div class="tiles">{"".join(tiles)}</div>'


def _verdict_line(card: Mapping) -> str:
    gate = as_map(card.get("gate"))
    against = gate.get("production_version")
    versus = f"against production v{escape(against)}" if against is not None else "with no production model"
    return (
        f'<p class="verdict">Gate {verdict(_approved(gate), "APPROVED", "REJECTED")} {versus}; '
        f"promoted at {escape(card.get('promoted_at') or '-')} by trainops "
        f"{escape(card.get('trainops_version') or '-')}.</p>"
    )


def _gate(card: Mapping, linkable: Linkable) -> str:
    gate = as_map(card.get("gate"))
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
            + "".join(f"<td>{cell}</td>" for cell in check_cells(c))
            + "</tr>"
            for c in sorted(checks, key=lambda c: c.get("passed") is not False)
        )
        head = "".join(f"<th>{h}</th>" for h in CHECK_COLUMNS)
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
        out.append(f"<p>Decision: {uri_link(gate.get('gate_uri'), linkable)}</p>")
    return "".join(out)


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
    raw = pretty_json(card)
    size = f"{size_text(len(raw.encode()))}, {raw.count(chr(10)) + 1:,} lines"
    out.append(folded("Raw card.json", f"<pre>{escape(raw)}</pre>", note=size))
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
        + evaluation_section(card, linkable)
        + f'<div class="cols">{dataset_section(card, linkable)}{lineage_section(card, linkable)}</div>'
        + f'<div class="cols">{training_section(card, linkable)}{files_section(card, linkable)}</div>'
        + "<h2>Config and record</h2>"
        + _folded(card)
    )


def _title(text: str) -> str:
    try:
        card = json.loads(text)
    except (ValueError, RecursionError):
        card = None
    if not isinstance(card, dict):
        return "Model card"
    return f"Model card: {redact(card.get('model')) or '?'} v{redact(card.get('version', '?'))}"


def render_card_page(uri: str, data: bytes, *, linkable: Linkable = default_linkable) -> str:
    """The page for a ``card.json`` (bytes ``data``) at ``uri``; one that is not JSON, or not a
    card (:func:`trainops.shapes.check_card`), gets a page that says which field is wrong, and
    what it holds."""
    text = data.decode("utf-8", errors="replace")
    title = _title(text)
    try:
        card = load(text, uri, check_card)
    except ShapeError as exc:
        return damaged_page(title, uri, exc, text)
    return page(title, uri, card_report(card, linkable=linkable))
