"""The model card page: headline first, checks, dataset, lineage, cost, config folded away."""

from __future__ import annotations

import copy
import json
import re

from tests.trainops.reports.helpers import page_text, table_with
from trainops.reports.card_page import card_report, render_card_page

ATTACK = "<script>alert(1)</script>"
ROOT = "s3://bucket/root"
CARD_URI = f"{ROOT}/models/demo-lm/versions/3/card.json"
CARD = {
    "format": "trainops-card/1",
    "model": "demo-lm",
    "version": 3,
    "uri": f"{ROOT}/models/demo-lm/versions/3",
    "export_uri": f"{ROOT}/runs/retrain/r3/train/export",
    "promoted_at": "2026-12-01T20:00:00+00:00",
    "trainops_version": "0.1.0",
    "run_uri": f"{ROOT}/runs/retrain/r3/train",
    "config_uri": f"{ROOT}/runs/retrain/r3/train/config.yaml",
    "config_sha256": "ab12",
    "config": {"checkpoint": {"every_steps": 20}, "train": {"max_steps": 120, "lr": 0.0003}},
    "eval_basis": {"data_uri": f"{ROOT}/datasets/demo-text/9f3c", "split": "eval"},
    "dataset": {
        "dataset_name": "demo-text",
        "version": "9f3c",
        "uri": f"{ROOT}/datasets/demo-text/9f3c",
        "manifest_uri": f"{ROOT}/datasets/demo-text/9f3c/manifest.json",
        "rows": 4000,
        "train_tokens": 180000,
        "eval_tokens": 20000,
        "quarantined_rows": 3,
        "validation": {
            "uri": f"{ROOT}/datasets/demo-text/9f3c/validation.json",
            "success": True,
            "evaluated_expectations": 7,
            "successful_expectations": 7,
            "failed": [],
        },
    },
    "metrics": {
        "candidate": {"eval_loss": 1.23456, "perplexity": 3.437, "tokens": 19999},
        "production": {"eval_loss": 1.5, "perplexity": 4.48, "tokens": 19999},
        "production_version": 2,
        "metrics_uri": f"{ROOT}/runs/retrain/r3/train/eval/metrics.json",
    },
    "gate": {
        "approved": True,
        "production_version": 2,
        "gate_uri": f"{ROOT}/runs/retrain/r3/train/eval/gate.json",
        "checks": [
            {
                "name": "loss|bound",
                "metric": "eval_loss",
                "observed": 1.23456,
                "expected": "<= 3.5",
                "passed": True,
            },
            {
                "name": "no regression",
                "metric": "eval_loss",
                "observed": 1.23456,
                "expected": "<= 1.5",
                "passed": True,
            },
        ],
    },
    "training": {
        "steps": 120,
        "attempts": 2,
        "preemptions": 1,
        "steps_lost": 4,
        "final_loss": 1.1,
        "job_uri": f"{ROOT}/runs/retrain/r3/train/job.json",
    },
    "training_cost": {
        "estimate": True,
        "currency": "USD",
        "cost": 0.42,
        "on_demand_cost": 1.2,
        "goodput": 0.9,
    },
    "lineage": {"parent": {"name": "demo-lm", "version": 2, "uri": f"{ROOT}/models/demo-lm/versions/2"}},
    "files": [{"path": "config.json", "size": 612}, {"path": "model.safetensors", "size": 1048576}],
}


def _href(uri: str) -> str:
    from urllib.parse import urlencode

    return 'href="report?' + urlencode({"uri": uri}).replace("&", "&amp;") + '"'


def test_the_headline_comes_first_and_the_config_is_folded_away():
    html = render_card_page(CARD_URI, json.dumps(CARD).encode())
    text = page_text(html)
    assert text.startswith(f"Model card: demo-lm v3 {CARD_URI} Gate APPROVED against production v2")
    # the headline figures, in this order, before any section
    headline = text[: text.index("Gate checks")]
    for figure in (
        "Eval loss 1.235 production v2: 1.5 (-0.2654)",
        "Perplexity 3.437 production v2: 4.48 (-1.043)",
        "Gate APPROVED 2 of 2 checks passed",
        "Training steps 120 2 attempt(s), 1 preemption(s) survived",
        "Training cost (estimate) 0.42 USD goodput 90.0%",
        "Dataset demo-text version 9f3c, 4,000 rows",
    ):
        assert figure in headline
    sections = re.findall(r"<h2>([^<]+)</h2>", html)
    assert sections == [
        "Gate checks",
        "Evaluation",
        "Dataset",
        "Lineage",
        "Training and cost",
        "Files",
        "Config and record",
    ]
    # the config is inside a closed <details>, not a table of keys at the top
    folded = re.search(
        r"<details><summary>Full trainer config</summary><pre>(.*?)</pre></details>", html, re.S
    )
    assert folded and "every_steps" in folded.group(1)
    assert html.index("every_steps") > html.index("<h2>Config and record</h2>")
    assert "<details open" not in html
    assert table_with(html, "Metric")[1:] == [
        ["Eval loss", "1.235", "1.5"],
        ["Perplexity", "3.437", "4.48"],
        ["Tokens evaluated", "19,999", "19,999"],
    ]


def test_a_classifiers_card_headlines_accuracy_and_macro_f1_judged_in_their_direction():
    card = copy.deepcopy(CARD)
    card["metrics"]["candidate"] = {"eval_loss": 0.31, "accuracy": 0.95, "f1_macro": 0.81, "records": 200}
    card["metrics"]["production"] = {"eval_loss": 0.3, "accuracy": 0.9, "f1_macro": 0.84, "records": 200}
    html = render_card_page(CARD_URI, json.dumps(card).encode())
    headline = page_text(html)[: page_text(html).index("Gate checks")]
    assert "Accuracy 0.95 production v2: 0.9 (+0.05)" in headline
    assert "Macro F1 0.81 production v2: 0.84 (-0.03)" in headline and "Eval loss" not in headline
    tiles = re.findall(r'<div class="tile ?(\w*)"><div class="label">([^<]+)</div>', html)
    assert ("good", "Accuracy") in tiles and ("bad", "Macro F1") in tiles  # higher is better
    assert table_with(html, "Metric")[1:] == [
        ["Accuracy", "0.95", "0.9"],
        ["Macro F1", "0.81", "0.84"],
        ["Eval loss", "0.31", "0.3"],
        ["Records evaluated", "200", "200"],
    ]


def test_a_classifiers_card_pictures_its_confusion_matrix_and_labels_and_its_accuracy_by_slice():
    card = copy.deepcopy(CARD)
    card["metrics"]["production"] = None
    card["metrics"]["candidate"] = {
        "eval_loss": 0.31,
        "accuracy": 0.9,
        "f1_macro": 0.89,
        "records": 20,
        "tokens": 20,
        "per_label": {
            "docs": {"precision": 0.9, "recall": 0.9, "f1": 0.9, "support": 10},
            "news": {"precision": 0.9, "recall": 0.9, "f1": 0.9, "support": 10},
        },
        "confusion": {"labels": ["docs", "news"], "counts": [[9, 1], [1, 9]]},
        "slices": {"source": {"wiki": {"eval_loss": 0.2, "tokens": 12, "accuracy": 0.75}}},
    }
    html = render_card_page(CARD_URI, json.dumps(card).encode())
    section = html[html.index("<h2>Evaluation</h2>") : html.index("<h2>Dataset</h2>")]
    assert section.index("<h3>By label</h3>") < section.index("<h3>By slice</h3>")
    assert 'aria-label="Confusion matrix"' in section and "docs predicted news: 1" in section
    assert 'aria-label="Precision, recall and F1 by label"' in section
    assert table_with(html, "Column")[0] == ["Column", "Value", "Accuracy", "Eval loss", "Records"]
    assert table_with(html, "Column")[1] == ["source", "wiki", "0.75", "0.2", "12"]


def test_every_uri_is_a_report_link_and_folders_link_to_their_report_file():
    html = card_report(CARD)
    for uri in (
        f"{ROOT}/datasets/demo-text/9f3c/manifest.json",
        f"{ROOT}/datasets/demo-text/9f3c/validation.json",
        f"{ROOT}/models/demo-lm/versions/2/card.json",  # the parent version
        f"{ROOT}/runs/retrain/r3/train/job.json",  # the run report
        f"{ROOT}/runs/retrain/r3/train/config.yaml",
        f"{ROOT}/runs/retrain/r3/train/export/config.json",  # the export
        f"{ROOT}/runs/retrain/r3/train/eval/metrics.json",
        f"{ROOT}/runs/retrain/r3/train/eval/gate.json",
        f"{ROOT}/models/demo-lm/versions/3/config.json",  # a file of this version
    ):
        assert _href(uri) in html, uri
    # weights are not a report: named, not linked
    assert "versions/3/model.safetensors" not in html.split("Raw card.json")[0]
    assert table_with(html, "File")[1:] == [["config.json", "612"], ["model.safetensors", "1,048,576"]]


def test_uris_the_app_may_not_serve_are_shown_not_linked():
    html = card_report(CARD, linkable=lambda uri: "/datasets/" in uri)
    assert _href(f"{ROOT}/datasets/demo-text/9f3c/manifest.json") in html
    assert _href(f"{ROOT}/runs/retrain/r3/train/job.json") not in html
    assert f"<code>{ROOT}/runs/retrain/r3/train/config.yaml</code>" in html


def test_a_rejected_card_shows_its_failed_checks_first():
    card = copy.deepcopy(CARD)
    card["gate"]["approved"] = False
    card["gate"]["checks"][1].update(observed=1.7, passed=False, note="worse than production")
    card["gate"]["regates"] = [
        {"production_version": 4, "moved_from": 2, "approved": False, "checks": []},
    ]
    html = render_card_page(CARD_URI, json.dumps(card).encode())
    text = page_text(html)
    assert "Gate REJECTED against production v2" in text
    assert "Gate REJECTED 1 of 2 checks passed" in text
    assert "1 check(s) failed: no regression." in text
    checks = table_with(html, "Check")
    assert checks[1] == ["no regression", "eval_loss", "1.7", "<= 1.5", "FAIL", "worse than production"]
    assert checks[2][0] == "loss|bound"
    assert '<tr class="failed">' in html
    assert "Re-gated against production v4 (production moved from v2): REJECTED" in text
    # a failed check alone makes it a rejection, whatever "approved" says
    card["gate"]["approved"] = True
    assert "Gate REJECTED" in page_text(card_report(card))


def test_an_older_or_sparse_card_degrades_to_dashes_not_errors():
    html = render_card_page(CARD_URI, json.dumps({"model": "old", "version": 1}).encode())
    text = page_text(html)
    assert text.startswith(f"Model card: old v1 {CARD_URI} Gate unknown with no production model")
    assert "No checks were recorded." in text
    assert "no cost was recorded" in text
    assert "not recorded (a card older than lineage)" in text
    scratch = page_text(card_report({**CARD, "lineage": {"parent": None}, "training_cost": None}))
    assert "trained from scratch (random initial weights)" in scratch
    assert "Training cost - no cost was recorded" in scratch
    # wrong types everywhere
    weird = {"model": 5, "dataset": [], "metrics": "x", "gate": {"checks": "x"}, "files": {}, "lineage": 3}
    assert "Model card: 5 v?" in page_text(render_card_page(CARD_URI, json.dumps(weird).encode()))
    assert "not valid JSON" in page_text(render_card_page(CARD_URI, b"{oops"))
    listed = page_text(render_card_page(CARD_URI, b"[1, 2]"))
    assert f"{CARD_URI} should hold a JSON object (a model version's card), got a list of 2 item(s)" in listed


def test_user_strings_are_escaped_and_secrets_redacted():
    card = copy.deepcopy(CARD)
    card["model"] = ATTACK
    card["dataset"]["dataset_name"] = ATTACK
    card["gate"]["checks"][0]["name"] = ATTACK
    card["config"]["storage"] = {"aws_secret_access_key": "SECRET-1"}
    card["lineage"]["parent"]["uri"] = f'{ROOT}/models/x"><script>/versions/2'
    card["run_uri"] = "s3://user:hunter2@bucket/root/runs/r"
    card["export_uri"] = "javascript:alert(1)//x.json"
    html = render_card_page(CARD_URI, json.dumps(card).encode())
    assert "<script>" not in html and "SECRET-1" not in html and "hunter2" not in html
    assert 'href="javascript' not in html and "<code>javascript:alert(1)//x.json</code>" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_teams_own_metric_and_a_paired_interval_are_on_the_card():
    card = copy.deepcopy(CARD)
    own = {"worst_label_recall": "team_metrics:worst_label_recall"}
    card["metrics"]["candidate"] = {
        "accuracy": 0.9,
        "worst_label_recall": 0.7,
        "records": 200,
        "user_metrics": own,
        "slices": {
            "length": {"short": {"accuracy": 0.8, "eval_loss": 0.4, "tokens": 90, "worst_label_recall": 0.6}}
        },
    }
    card["metrics"]["production"] = {
        "accuracy": 0.92,
        "worst_label_recall": 0.75,
        "records": 200,
        "user_metrics": own,
    }
    note = (
        "production v2 accuracy 0.92, tolerance 0.02; paired bootstrap over 200 records: candidate - "
        "production -0.02, 95% interval [-0.05, +0.01], allowed -0.0184 (beyond the tolerance as totals)"
    )
    card["gate"]["checks"] = [
        {
            "name": "accuracy no regression",
            "metric": "accuracy",
            "observed": 0.9,
            "expected": ">= 0.9016 unless the 95% interval reaches it",
            "passed": True,
            "note": note,
            "interval": [-0.05, 0.01],
            "confidence": 0.95,
        }
    ]
    html = render_card_page(CARD_URI, json.dumps(card).encode())
    assert table_with(html, "Metric")[1:] == [
        ["Accuracy", "0.9", "0.92"],
        ["worst_label_recall", "0.7", "0.75"],
        ["Records evaluated", "200", "200"],
    ]
    assert table_with(html, "Column")[0][:4] == ["Column", "Value", "Accuracy", "Production accuracy"]
    assert table_with(html, "Column")[0][-3:] == [
        "worst_label_recall",
        "Production worst_label_recall",
        "Records",
    ]
    assert "95% interval [-0.05, +0.01]" in page_text(html)
