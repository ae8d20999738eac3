"""The ``README.md`` of a promoted version: a Hugging Face model card rendered from ``card.json``.

Pure: :func:`render` takes the card as promotion writes it and returns the Markdown, YAML front
matter first (``library_name: transformers``, ``pipeline_tag: text-generation``, tags), then
the lineage, the data version, the metrics (candidate and production), the gate decision and
its checks, training and its cost, how to load the version, and its files. A key an older card
lacks is said to be missing, never an error: the card stays the record, the README its reading.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from trainops.gate.metrics import shown_metrics

__all__ = ["README_NAME", "TAGS", "render"]

README_NAME = "README.md"
TAGS = ("trainops", "llama", "text-generation", "causal-lm")
_COUNTS = ("tokens", "records")  # listed after the metrics (trainops.gate.metrics)


def _text(value: Any) -> str:
    """A value for prose or a table cell: numbers short, None as a dash, no table breaks."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
    return f"`{value}`" if value else "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_text(cell) for cell in row) + " |" for row in rows]
    return lines


def _front_matter(card: Mapping[str, Any]) -> list[str]:
    # JSON strings are YAML scalars: a model name or URI never breaks the front matter.
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation", "tags:"]
    lines += [f"- {tag}" for tag in TAGS]
    dataset = card.get("dataset") or {}
    if dataset.get("dataset_name"):
        named = f"{dataset['dataset_name']}/{dataset.get('version')}"
        lines.append(f"trainops_dataset: {json.dumps(named)}")
    lines += [
        f"trainops_model: {json.dumps(str(card.get('model')))}",
        f"trainops_model_version: {json.dumps(card.get('version'))}",
    ]
    return [*lines, "---"]


def _lineage(card: Mapping[str, Any]) -> list[str]:
    parent = (card.get("lineage") or {}).get("parent")
    if isinstance(parent, Mapping) and parent:
        line = (
            f"Warm-started from **{_text(parent.get('name'))} v{_text(parent.get('version'))}** "
            f"({_code(parent.get('uri'))}): training began from that version's weights."
        )
    else:
        line = "Trained from scratch (random initial weights); no parent version."
    return ["## Lineage", "", line]


def _data(card: Mapping[str, Any]) -> list[str]:
    dataset = card.get("dataset") or {}
    validation = dataset.get("validation") or {}
    lines = [
        "## Training data",
        "",
        f"- Dataset: **{_text(dataset.get('dataset_name'))}**, version {_code(dataset.get('version'))} "
        f"at {_code(dataset.get('uri'))}",
        f"- Rows: {_text(dataset.get('rows'))}; train tokens {_text(dataset.get('train_tokens'))}, "
        f"eval tokens {_text(dataset.get('eval_tokens'))}; quarantined rows "
        f"{_text(dataset.get('quarantined_rows'))}",
    ]
    if validation:
        failed = ", ".join(validation.get("failed") or []) or "none"
        lines.append(
            f"- Validation (great-expectations): success {_text(validation.get('success'))}, "
            f"{_text(validation.get('successful_expectations'))} of "
            f"{_text(validation.get('evaluated_expectations'))} expectations met; failed: {failed}"
        )
    return lines


def _metrics(card: Mapping[str, Any]) -> list[str]:
    metrics = card.get("metrics") or {}
    candidate = metrics.get("candidate") or {}
    production = metrics.get("production")
    version = metrics.get("production_version")
    lines = ["## Evaluation", "", "Scored on the dataset's held-out eval split.", ""]
    names = [m.name for m in shown_metrics(candidate, production)]
    names += [k for k in _COUNTS if candidate.get(k) is not None]
    if production:
        header = ["metric", "this version", f"production v{_text(version)} at the time"]
        rows = [[m, candidate.get(m), production.get(m)] for m in names]
    else:
        header = ["metric", "this version"]
        rows = [[m, candidate.get(m)] for m in names]
        lines += ["There was no production version to compare with.", ""]
    return lines + _table(header, rows)


def _gate(card: Mapping[str, Any]) -> list[str]:
    gate = card.get("gate") or {}
    checks = gate.get("checks") or []
    against = gate.get("production_version")
    versus = (
        f"against production version {_text(against)}"
        if against is not None
        else "with no production version"
    )
    lines = ["## Gate decision", "", f"Approved: {_text(gate.get('approved'))}, {versus}.", ""]
    if checks:
        lines += _table(
            ["check", "kind", "metric", "observed", "expected", "result", "note"],
            [
                [
                    c.get("name"),
                    c.get("kind"),
                    c.get("metric"),
                    c.get("observed"),
                    c.get("expected"),
                    "pass" if c.get("passed") else "FAIL",
                    c.get("note") or "",
                ]
                for c in checks
            ],
        )
    else:
        lines.append("No checks were recorded.")
    regates = gate.get("regates") or []
    if regates:
        against = ", ".join(f"v{_text(r.get('production_version'))}" for r in regates)
        lines += ["", f"Re-gated after production moved, against {against}."]
    return lines


def _pick_lines(pick: object) -> list[str]:
    """The checkpoint mid-run evaluation picked, when one was (else nothing)."""
    if not isinstance(pick, Mapping):
        return []
    return [f"- Promoted checkpoint: step {_text(pick.get('step'))}: {_text(pick.get('why'))}"]


def _restarts(count: object) -> str:
    """``restarts in place N; `` where torchrun restarted workers in place; nothing for none, or
    for a card from before the count."""
    real = isinstance(count, int) and not isinstance(count, bool) and count > 0
    return f"restarts in place {_text(count)}; " if real else ""


def _training(card: Mapping[str, Any]) -> list[str]:
    training = card.get("training") or {}
    cost = card.get("training_cost")
    lines = [
        "## Training",
        "",
        f"- Run: {_code(card.get('run_uri'))}, config {_code(card.get('config_uri'))} "
        f"(sha256 {_code(card.get('config_sha256'))})",
        f"- Steps: {_text(training.get('steps'))}; attempts {_text(training.get('attempts'))}; "
        f"preemptions survived {_text(training.get('preemptions'))}; "
        f"{_restarts(training.get('restarts_in_place'))}steps lost "
        f"{_text(training.get('steps_lost'))}; final training loss {_text(training.get('final_loss'))}",
        *_pick_lines(card.get("checkpoint_pick")),
        "",
        "### Training cost",
        "",
    ]
    if not isinstance(cost, Mapping):
        return [*lines, "No cost was recorded for this run."]
    currency = cost.get("currency") or ""
    lines.append(
        "Estimates from the run's record (`job.json`), in " + (currency or "the price table's currency") + "."
    )
    lines.append("")
    lines += _table(
        ["figure", "value"],
        [
            ["cost", cost.get("cost")],
            ["on-demand equivalent", cost.get("on_demand_cost")],
            ["savings", cost.get("savings")],
            ["goodput", cost.get("goodput")],
            ["billed GPU-hours", cost.get("billed_gpu_hours")],
            ["productive GPU-hours", cost.get("productive_gpu_hours")],
            ["lost GPU-hours", cost.get("lost_gpu_hours")],
            ["preemptions", cost.get("preemptions")],
        ],
    )
    return lines


def _usage(card: Mapping[str, Any]) -> list[str]:
    uri = str(card.get("uri") or "")
    local = uri.removeprefix("file://") if uri.startswith("file://") else "path/to/a/copy/of/this/folder"
    lines = ["## How to load", ""]
    if not uri.startswith("file://"):
        lines += [f"Copy {_code(uri)} to a local folder first (for example `aws s3 sync`), then:", ""]
    lines += [
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline",
        "",
        f"path = {json.dumps(local)}",
        "tokenizer = AutoTokenizer.from_pretrained(path)",
        "model = AutoModelForCausalLM.from_pretrained(path)",
        'print(pipeline("text-generation", model=model, tokenizer=tokenizer)("hello", max_new_tokens=40))',
        "```",
        "",
        "The tokenizer encodes as staging did: a record's training tokens are",
        "`tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]`.",
        "vLLM and TGI read the same folder (Llama architecture, safetensors weights).",
    ]
    return lines


def _files(card: Mapping[str, Any]) -> list[str]:
    names = [str(f.get("path")) for f in card.get("files") or [] if isinstance(f, Mapping)]
    names = sorted({*names, "card.json", README_NAME})
    return ["## Files", "", *[f"- `{name}`" for name in names]]


def render(card: Mapping[str, Any]) -> str:
    """The model card Markdown for ``card`` (a ``card.json`` as promotion writes it)."""
    title = f"# {_text(card.get('model'))} v{_text(card.get('version'))}"
    intro = (
        f"Promoted by trainops {_text(card.get('trainops_version'))} at "
        f"{_text(card.get('promoted_at'))}; the lineage record is `card.json` beside this file."
    )
    sections = [_lineage(card), _data(card), _metrics(card), _gate(card), _training(card), _usage(card)]
    lines = [*_front_matter(card), "", title, "", intro]
    for section in [*sections, _files(card)]:
        lines += ["", *section]
    return "\n".join(lines) + "\n"
