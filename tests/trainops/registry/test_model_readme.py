"""The README.md model card of a promoted version, rendered from card.json."""

import yaml

from trainops.registry.model_readme import README_NAME, render

CARD = {
    "model": "demo-lm",
    "version": 3,
    "uri": "s3://bucket/models/demo-lm/versions/3",
    "promoted_at": "2026-12-01T20:00:00+00:00",
    "trainops_version": "0.1.0",
    "run_uri": "s3://bucket/runs/retrain/r3/train",
    "config_uri": "s3://bucket/runs/retrain/r3/train/config.yaml",
    "config_sha256": "ab12",
    "dataset": {
        "dataset_name": "demo-text",
        "version": "9f3c",
        "uri": "s3://bucket/datasets/demo-text/9f3c",
        "rows": 4000,
        "train_tokens": 180000,
        "eval_tokens": 20000,
        "quarantined_rows": 0,
        "validation": {
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
    },
    "gate": {
        "approved": True,
        "production_version": 2,
        "checks": [
            {
                "name": "loss|bound",
                "kind": "threshold",
                "metric": "eval_loss",
                "observed": 1.23456,
                "expected": "<= 3.5",
                "passed": True,
                "note": "",
            }
        ],
    },
    "training": {"steps": 120, "attempts": 2, "preemptions": 1, "steps_lost": 0, "final_loss": 1.1},
    "training_cost": {
        "estimate": True,
        "currency": "USD",
        "cost": 0.42,
        "on_demand_cost": 1.2,
        "goodput": 0.9,
    },
    "lineage": {"parent": {"name": "demo-lm", "version": 2, "uri": "s3://bucket/models/demo-lm/versions/2"}},
    "files": [{"path": "config.json"}, {"path": "model.safetensors"}, {"path": "tokenizer.json"}],
}


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_the_front_matter_is_a_hugging_face_model_card_header():
    meta = front_matter(render(CARD))
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert "trainops" in meta["tags"] and meta["trainops_dataset"] == "demo-text/9f3c"
    assert meta["trainops_model_version"] == 3
    # a name that YAML would misread stays a string
    assert front_matter(render({**CARD, "model": "no: [yes]"}))["trainops_model"] == "no: [yes]"


def test_the_card_shows_data_metrics_gate_cost_lineage_and_how_to_load():
    text = render(CARD)
    assert "# demo-lm v3" in text
    assert "version `9f3c` at `s3://bucket/datasets/demo-text/9f3c`" in text
    assert "| eval_loss | 1.2346 | 1.5000 |" in text and "production v2 at the time" in text
    assert "| loss\\|bound | threshold | eval_loss | 1.2346 | <= 3.5 | pass |" in text
    assert "Approved: yes, against production version 2." in text
    assert "| cost | 0.4200 |" in text and "in USD" in text
    assert "Warm-started from **demo-lm v2** (`s3://bucket/models/demo-lm/versions/2`)" in text
    assert "AutoModelForCausalLM.from_pretrained(path)" in text and "Copy `s3://bucket/" in text
    for name in ("config.json", "model.safetensors", "tokenizer.json", "card.json", README_NAME):
        assert f"- `{name}`" in text


def test_restarts_in_place_are_counted_only_where_there_were_some():
    assert "preemptions survived 1; steps lost 0;" in render(CARD)  # none, or a card from before the count
    restarted = {**CARD, "training": {**CARD["training"], "restarts_in_place": 2}}
    assert "preemptions survived 1; restarts in place 2; steps lost 0;" in render(restarted)


def test_a_first_version_from_scratch_without_cost_says_so():
    card = {**CARD, "metrics": {"candidate": CARD["metrics"]["candidate"]}, "training_cost": None}
    del card["lineage"]
    text = render({**card, "uri": "file:///srv/models/demo-lm/versions/1"})
    assert "Trained from scratch (random initial weights); no parent version." in text
    assert "There was no production version to compare with." in text
    assert "No cost was recorded for this run." in text
    assert 'path = "/srv/models/demo-lm/versions/1"' in text
    first = render({**card, "gate": {**CARD["gate"], "production_version": None}})
    assert "Approved: yes, with no production version." in first


def test_an_old_card_missing_sections_still_renders():
    text = render({"model": "m", "version": 1})
    assert "# m v1" in text and "No checks were recorded." in text and "Trained from scratch" in text


def test_a_classifiers_readme_lists_its_task_metrics_first():
    metrics = {
        "candidate": {"eval_loss": 0.3, "accuracy": 0.95, "f1_macro": 0.9, "records": 200, "tokens": 0},
        "production": None,
    }
    text = render({**CARD, "metrics": metrics})
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.split("|")[1].strip()]
    names = [row.split("|")[1].strip() for row in rows]
    start = names.index("accuracy")
    assert names[start : start + 5] == ["accuracy", "f1_macro", "eval_loss", "tokens", "records"]
