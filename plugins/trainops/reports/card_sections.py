"""The sections of the model card page about what the version was made from and of: its
evaluation (overall and per slice), dataset, lineage, training and cost, and files; and the
helpers the page shares with them (figures, links). Pure functions over the card; no I/O.

:mod:`trainops.reports.card_page` puts them together; see it for what links where.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainops.gate.metrics import shown_metrics
from trainops.reports.html import dicts, escape, list_of, report_link, table, verdict
from trainops.reports.label_charts import svg_confusion_matrix, svg_label_bars
from trainops.reports.pages import JSON_SUFFIXES, TEXT_SUFFIXES

__all__ = [
    "COUNTS",
    "Linkable",
    "as_map",
    "dataset_section",
    "default_linkable",
    "evaluation_section",
    "figure",
    "files_section",
    "folder_link",
    "lineage_section",
    "metric_rows",
    "percent",
    "rows_table",
    "training_section",
    "uri_link",
]

Linkable = Callable[[str], bool]
# What an evaluation counted, listed after its metrics (trainops.gate.metrics).
COUNTS = (("tokens", "Tokens evaluated"), ("records", "Records evaluated"))


def metric_rows(candidate: Mapping, production: Mapping | None) -> list[tuple[str, str]]:
    """``(key, label)`` of every metric the scores hold, the task's own first, then the counts."""
    shown = [(m.name, m.label) for m in shown_metrics(candidate, production)]
    return shown + [(k, label) for k, label in COUNTS if candidate.get(k) is not None]


def default_linkable(uri: str) -> bool:
    """A storage URI of a file the report app renders."""
    return uri.startswith(("s3://", "file://")) and uri.endswith(JSON_SUFFIXES + TEXT_SUFFIXES)


def as_map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def figure(value: object, digits: int = 4) -> str:
    """A figure for a tile or a cell: integers with separators, floats to ``digits`` significant."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def uri_link(uri: object, linkable: Linkable, label: str | None = None) -> str:
    """A link through the report app when ``linkable``, else the URI as code."""
    if not isinstance(uri, str) or not uri:
        return '<span class="muted">-</span>'
    return report_link(uri, label) if linkable(uri) else f"<code>{escape(uri)}</code>"


def folder_link(uri: object, file: str, linkable: Linkable) -> str:
    """A folder URI, linked to the report file ``file`` inside it when that can be shown."""
    if not isinstance(uri, str) or not uri:
        return '<span class="muted">-</span>'
    inside = uri.rstrip("/") + "/" + file
    return f"<code>{escape(uri)}</code>" + (f" ({report_link(inside, file)})" if linkable(inside) else "")


def rows_table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def percent(value: object) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _slices(candidate: Mapping, production: Mapping | None) -> str:
    """Each metric the slices hold (``{column: {value: summary}}``: a classifier's accuracy,
    the eval loss, a team's own), the task's own first, beside production's; a slice production
    was not scored on shows a dash. Perplexity is left out: it is the loss again."""
    ours = as_map(candidate.get("slices"))
    theirs = as_map(production.get("slices")) if isinstance(production, Mapping) else {}
    held = {
        key
        for values in ours.values()
        for s in as_map(values).values()
        for key, value in as_map(s).items()
        if value is not None
    }
    figures = [
        (m.name, m.label)
        for m in shown_metrics(candidate, production)
        if (m.name in held or m.name == "eval_loss") and m.name != "perplexity"  # the loss, always
    ]
    rows = []
    for column, values in ours.items():
        for value, summary in as_map(values).items():
            other = as_map(as_map(theirs.get(column)).get(value))
            row = [escape(column), escape(value)]
            for key, _ in figures:
                row.append(escape(figure(as_map(summary).get(key))))
                if isinstance(production, Mapping):
                    row.append(escape(figure(other.get(key))))
            rows.append([*row, escape(figure(as_map(summary).get("tokens")))])
    if not rows:
        return ""
    header = ["Column", "Value"]
    for _, label in figures:
        header += [label, f"Production {label.lower()}"] if isinstance(production, Mapping) else [label]
    counted = "Records" if candidate.get("records") is not None else "Tokens"
    return f"<h3>By slice</h3>{table([*header, counted], rows)}"


def _labels(candidate: Mapping) -> str:
    """A classifier's confusion matrix and each label's precision, recall and F1, as pictures."""
    confusion = as_map(candidate.get("confusion"))
    labels, counts = confusion.get("labels"), confusion.get("counts")
    matrix = ""
    if isinstance(labels, list) and isinstance(counts, list) and all(isinstance(r, list) for r in counts):
        matrix = svg_confusion_matrix([str(label) for label in labels], counts)
    bars = svg_label_bars({str(k): as_map(v) for k, v in as_map(candidate.get("per_label")).items()})
    if not matrix and not bars:
        return ""
    return '<h3>By label</h3><div class="cols"><div>' + matrix + "</div><div>" + bars + "</div></div>"


def evaluation_section(card: Mapping, linkable: Linkable) -> str:
    """The evaluation: each metric beside production's at the time, then per slice."""
    metrics = as_map(card.get("metrics"))
    candidate, production = as_map(metrics.get("candidate")), metrics.get("production")
    header = ["Metric", "This version"]
    if isinstance(production, Mapping):
        header.append(f"Production v{escape(metrics.get('production_version'))} at the time")
    rows = []
    for key, label in metric_rows(candidate, production if isinstance(production, Mapping) else None):
        row = [escape(label), escape(figure(candidate.get(key)))]
        if isinstance(production, Mapping):
            row.append(escape(figure(production.get(key))))
        rows.append(row)
    note = "" if isinstance(production, Mapping) else '<p class="muted">There was no production model.</p>'
    where = (
        f"<p>Scores: {uri_link(metrics.get('metrics_uri'), linkable)}</p>"
        if metrics.get("metrics_uri")
        else ""
    )
    slices = _slices(candidate, production if isinstance(production, Mapping) else None)
    return f"<h2>Evaluation</h2>{note}{table(header, rows)}{_labels(candidate)}{slices}{where}"


def dataset_section(card: Mapping, linkable: Linkable) -> str:
    dataset = as_map(card.get("dataset"))
    validation = as_map(dataset.get("validation"))
    rows = [
        (
            "Name and version",
            escape(f"{dataset.get('dataset_name') or '-'} / {dataset.get('version') or '-'}"),
        ),
        ("Stored at", folder_link(dataset.get("uri"), "manifest.json", linkable)),
        ("Rows", escape(figure(dataset.get("rows")))),
        ("Train tokens", escape(figure(dataset.get("train_tokens")))),
        ("Eval tokens", escape(figure(dataset.get("eval_tokens")))),
        ("Quarantined rows", escape(figure(dataset.get("quarantined_rows")))),
    ]
    if dataset.get("manifest_uri"):
        rows.append(("Manifest", uri_link(dataset.get("manifest_uri"), linkable)))
    if validation.get("missing"):
        rows.append(
            ("Validation", f'<span class="fail">missing</span>: {uri_link(validation.get("uri"), linkable)}')
        )
    elif validation:
        failed = ", ".join(map(str, list_of(validation.get("failed")))) or "none"
        rows.append(
            (
                "Validation",
                f"{verdict(validation.get('success'), 'PASSED', 'FAILED')}, "
                f"{escape(figure(validation.get('successful_expectations')))} of "
                f"{escape(figure(validation.get('evaluated_expectations')))} expectations met; "
                f"failed: {escape(failed)}",
            )
        )
        rows.append(("Validation report", uri_link(validation.get("uri"), linkable)))
    return f"<div><h2>Dataset</h2>{rows_table(rows)}</div>"


def lineage_section(card: Mapping, linkable: Linkable) -> str:
    parent = as_map(card.get("lineage")).get("parent")
    if isinstance(parent, Mapping) and parent:
        named = f"{parent.get('name') or '?'} v{parent.get('version') or '?'}"
        started = (
            f"warm-started from {escape(named)}: {folder_link(parent.get('uri'), 'card.json', linkable)}"
        )
    elif "lineage" in card:
        started = "trained from scratch (random initial weights)"
    else:
        started = '<span class="muted">not recorded (a card older than lineage)</span>'
    training = as_map(card.get("training"))
    rows = [
        ("Parent", started),
        ("Training run", folder_link(card.get("run_uri"), "job.json", linkable)),
        ("Config", uri_link(card.get("config_uri"), linkable)),
        ("Config sha256", f"<code>{escape(card.get('config_sha256') or '-')}</code>"),
        ("Exported weights", folder_link(card.get("export_uri"), "config.json", linkable)),
        ("This version", folder_link(card.get("uri"), "README.md", linkable)),
    ]
    job = training.get("job_uri")
    if job and job != f"{str(card.get('run_uri') or '').rstrip('/')}/job.json":  # else linked above
        rows.insert(2, ("Run report", uri_link(job, linkable)))
    return f"<div><h2>Lineage</h2>{rows_table(rows)}</div>"


def skipped_text(windows: object) -> str:
    """The steps bad-loss rollbacks skipped, ``11-15, 31-32``: ``none`` for none, ``-`` for a
    card from before the key (or a damaged one)."""
    if not isinstance(windows, list):
        return "-"
    spans = [w for w in windows if isinstance(w, list) and len(w) == 2 and all(isinstance(x, int) for x in w)]
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans) or "none"


def training_section(card: Mapping, linkable: Linkable) -> str:
    training = as_map(card.get("training"))
    labels = (
        ("steps", "Steps"),
        ("attempts", "Attempts"),
        ("preemptions", "Preemptions survived"),
        ("restarts_in_place", "Restarts in place"),
        ("steps_lost", "Steps lost"),
        ("final_loss", "Final training loss"),
    )
    rows = [(label, escape(figure(training.get(key)))) for key, label in labels]
    rows.insert(5, ("Steps skipped (bad loss)", escape(skipped_text(training.get("steps_skipped")))))
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
            rows.append((label, escape(figure(cost.get(key), 3)) + unit))
        rows.append(("Goodput", escape(percent(cost.get("goodput")))))
        cost_note = '<p class="muted">Cost figures are estimates from the run\'s job.json.</p>'
    else:
        rows.append(("Cost", '<span class="muted">no cost was recorded for this run</span>'))
        cost_note = ""
    return f"<div><h2>Training and cost</h2>{rows_table(rows)}{cost_note}</div>"


def files_section(card: Mapping, linkable: Linkable) -> str:
    files = dicts(card.get("files"))
    if not files:
        return ""
    base = str(card.get("uri") or "").rstrip("/")
    rows = []
    for f in files:
        path = str(f.get("path", "?"))
        cell = uri_link(f"{base}/{path}", linkable, path) if base else f"<code>{escape(path)}</code>"
        if cell.startswith("<code>"):
            cell = f"<code>{escape(path)}</code>"  # not a report: the name is enough
        rows.append([cell, escape(figure(f.get("size")))])
    return f"<div><h2>Files</h2>{table(['File', 'Bytes'], rows)}</div>"
