"""``python -m trainops demo --task classification`` (the ``trainops_demo_classification`` DAG)
through Airflow's own ``dag.test()``: labelled posts staged for ``classification`` with the demo's
own tokenizer (the label set taken from the data), a small random BERT trained on 2 local
nodes through one injected preemption, evaluated by loss, accuracy and macro F1, gated and
promoted; the promoted folder loads with ``transformers`` alone as a BERT classifier with the
labels, gives the trainer's logits and labels new posts."""

from __future__ import annotations

import os

import pytest
import torch

from tests.trainops.reports.helpers import page_text
from trainer.contract import MetricsReader, RunLayout, production_pointer
from trainer.storage import open_storage
from trainops.cli.main import DEMO_TASKS, DEMOS, load_dag, xcom_results
from trainops.reports.card_page import render_card_page

pytestmark = pytest.mark.slow


def test_the_classification_demo_trains_a_bert_on_its_labels_and_promotes_a_folder_transformers_serves(
    tmp_path, airflow_db, monkeypatch
):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainer.export.folder import load_model
    from trainer.records import PADDING

    dag_id, model = DEMOS["classification"]
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], dag_id)  # parsed under this root
    dagrun = dag.test()
    results = xcom_results(dag_id, dagrun.run_id, DEMO_TASKS)
    assert str(dagrun.state).rsplit(".", 1)[-1].lower() == "success", results
    store = open_storage(root)

    manifest = store.get_json(f"{results['stage']['uri']}/manifest.json")
    assert manifest["task"] == {"kind": "classification", "labels": ["docs", "forum", "news"]}
    assert manifest["tokenizer"]["kind"] == "huggingface"
    train = results["train"]
    assert (train["preemptions"], train["steps_lost"], train["steps"]) == (1, 0, 80)
    layout = RunLayout(train["run_uri"])
    records = [store.get_json(layout.attempt(n)) for n in (1, 2)]
    assert [r["outcome"] for r in records] == ["preempted", "completed"]
    assert records[1]["resumed_from_step"] == records[0]["checkpoint_step"] == records[0]["last_step"]
    assert {r["step"] for r in MetricsReader(store, layout.run_uri).records()} == set(range(1, 81))
    evaluation = store.get_json(layout.eval_metrics)["candidate"]
    assert evaluation["eval_loss"] < 0.5 and results["gate"]["approved"] is True  # ln(3) = 1.1 untrained
    assert evaluation["accuracy"] > 0.9 and evaluation["f1_macro"] > 0.9
    assert sorted(evaluation["per_label"]) == ["docs", "forum", "news"]
    gated = {c["metric"]: c for c in results["gate"]["checks"]}  # on what the team measures
    assert set(gated) == {"accuracy", "f1_macro"} and gated["accuracy"]["expected"] == ">= 0.9"
    pointer = store.get_json(production_pointer(root, model))
    assert pointer["version"] == results["promote"]["version"] == 1
    card_uri = f"{pointer['uri']}/card.json"
    headline = page_text(render_card_page(card_uri, store.get(card_uri)))
    headline = headline[: headline.index("Gate checks")]
    assert f"Accuracy {evaluation['accuracy']:.4g} no production model" in headline
    assert "Macro F1 " in headline and "Eval loss" not in headline
    page = render_card_page(card_uri, store.get(card_uri))
    assert 'aria-label="Confusion matrix"' in page and "news predicted news: " in page
    by_length = evaluation["slices"]["length"]  # the demo's slice: accuracy by post length
    assert set(by_length) == {"short", "long"} and all(s["accuracy"] > 0.8 for s in by_length.values())
    assert "By slice" in page and f"{by_length['short']['accuracy']:.4g}" in page

    folder = pointer["uri"]
    path = folder.removeprefix("file://")
    theirs = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert type(theirs).__name__ == "BertForSequenceClassification"
    assert theirs.config.id2label == {0: "docs", 1: "forum", 2: "news"}
    ours, _ = load_model(open_storage(folder), folder)
    ours.eval()
    posts = {
        "news": "the council opened a new bridge in oslo on monday.",
        "docs": "edit config.yaml before you restart the server.",
    }
    batch = tokenizer(list(posts.values()), padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = theirs(**batch).logits
        tokens = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, PADDING)
        assert (ours(tokens) - logits).abs().max().item() <= 1e-5
    said = [theirs.config.id2label[int(i)] for i in logits.argmax(-1)]
    assert said == list(posts)
