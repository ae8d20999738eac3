"""``python -m trainops demo --task classification`` (the ``trainops_demo_classification`` DAG)
through Airflow's own ``dag.test()``: labelled posts staged for ``classification`` with the demo's
own tokenizer (the label set taken from the data), a small random BERT trained on 2 local
nodes through one injected preemption, evaluated by loss, accuracy and macro F1, gated and
promoted; the promoted folder loads with ``transformers`` alone as a BERT classifier with the
labels, gives the trainer's logits and labels new posts. Then a team's own evaluation of the same
run: its scorer from ``examples/team_metrics.py`` and a paired gate against the promoted v1."""

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
    tmp_path, airflow_db, monkeypatch, capfd
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

    _the_teams_own_metric_gates_the_same_run(tmp_path, monkeypatch, root, train, model, capfd)


# A team's evaluation of the demo's run, through dag.test(): its own scorer from examples/
# (on the job's PYTHONPATH, as a team puts it in its trainer image) and a paired gate.
TEAM_DAG = """
import json, os
import pendulum
from airflow.sdk import DAG
from trainops.operators import EvaluateModelOperator, EvaluationGateOperator

spec = json.loads(os.environ.get("TEAM_METRICS", "{}"))
with DAG("team_metrics", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
    where = {"storage_root": spec.get("root"), "aws_conn_id": None}
    evaluate = EvaluateModelOperator(
        task_id="evaluate", training=spec.get("training"), model_name=spec.get("model", "m"),
        metrics=spec.get("metrics", ["team_metrics:worst_label_recall"]),
        job_options={"env": {"PYTHONPATH": spec.get("path", "")}}, deferrable=False, **where,
    )
    EvaluationGateOperator(
        task_id="gate", evaluation=evaluate.output, **where,
        checks=[
            {"kind": "threshold", "metric": "worst_label_recall", "direction": "higher_is_better",
             "op": ">=", "value": 0.8},
            {"kind": "no_regression", "metric": "accuracy", "tolerance": 0.02, "confidence": 0.95},
        ],
    )
"""


def _the_teams_own_metric_gates_the_same_run(tmp_path, monkeypatch, root, train, model, capfd):
    import json
    from pathlib import Path

    from airflow import settings

    dags = tmp_path / "team_dags"
    dags.mkdir()
    (dags / "team_metrics.py").write_text(TEAM_DAG)
    monkeypatch.setattr(settings, "DAGS_FOLDER", str(dags))
    repo = Path(__file__).resolve().parents[2]
    spec = {"root": root, "training": train, "model": model, "path": str(repo / "examples")}
    monkeypatch.setenv("TEAM_METRICS", json.dumps(spec))
    run = load_dag(str(dags), "team_metrics").test()
    results = xcom_results("team_metrics", run.run_id, ("evaluate", "gate"))
    assert str(run.state).rsplit(".", 1)[-1].lower() == "success", results
    candidate, production = results["evaluate"]["candidate"], results["evaluate"]["production"]
    # the team's scorer ran in the evaluation job, on both models: the lowest label recall
    assert candidate["worst_label_recall"] == min(v["recall"] for v in candidate["per_label"].values())
    assert candidate["user_metrics"] == {"worst_label_recall": "team_metrics:worst_label_recall"}
    assert results["evaluate"]["production_version"] == 1 and "worst_label_recall" in production
    checks = {c["metric"]: c for c in results["gate"]["checks"]}
    assert results["gate"]["approved"] is True and checks["worst_label_recall"]["expected"] == ">= 0.8"
    # production v1 is this very export: the paired interval of the difference is exactly 0
    assert (
        checks["accuracy"]["interval"] == [0.0, 0.0]
        and "paired bootstrap over " in checks["accuracy"]["note"]
    )

    # a scorer that raises fails the evaluation, and the task's failure names it
    capfd.readouterr()
    raising = "tests.trainer.evaluate.test_user:raising"
    monkeypatch.setenv("TEAM_METRICS", json.dumps({**spec, "path": str(repo), "metrics": [raising]}))
    run = load_dag(str(dags), "team_metrics").test()
    assert str(run.state).rsplit(".", 1)[-1].lower() == "failed"
    assert f"user metric {raising} raised KeyError: 'label'" in "".join(capfd.readouterr())
