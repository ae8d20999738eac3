"""``python -m trainops demo --best-checkpoint`` (the ``trainops_demo_best_checkpoint`` DAG)
through Airflow's own ``dag.test()``: while the demo trains (one injected preemption), every
checkpoint it commits is scored in a job of its own, each as the export that would be promoted;
the one with the lowest eval loss is evaluated against production, gated and promoted, and the
card names its step and why. ``dag.test()`` runs one task at a time, so here the scores come
after the training: the trainer keeps each checkpoint until its score is written, which is what
makes a slow evaluator, or one that starts late, lose none."""

from __future__ import annotations

import os

import pytest

from tests.trainops.reports.helpers import page_text
from trainer.contract import RunLayout, production_pointer
from trainer.storage import open_storage
from trainops.cli.main import DEMO_TASKS, DEMOS, load_dag, xcom_results
from trainops.reports.card_page import render_card_page

pytestmark = pytest.mark.slow


def test_the_best_checkpoint_of_the_demo_run_is_scored_picked_and_promoted(tmp_path, airflow_db, monkeypatch):
    dag_id, model = DEMOS["best_checkpoint"]
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], dag_id)
    dagrun = dag.test()
    results = xcom_results(dag_id, dagrun.run_id, (*DEMO_TASKS, "evaluate_checkpoints"))
    assert str(dagrun.state).rsplit(".", 1)[-1].lower() == "success", results
    store = open_storage(root)
    train, picked = results["train"], results["evaluate_checkpoints"]
    assert (train["preemptions"], train["steps"]) == (1, 120)
    layout = RunLayout(train["run_uri"])

    # Every regular checkpoint was scored (30, 60, 90, 120), though keep=2 would have pruned 30
    # and 60 before dag.test() ran the evaluator; the emergency save of the preemption was not.
    pick = store.get_json(layout.checkpoint_pick)
    scores = {c["step"]: c["value"] for c in pick["checkpoints"]}
    assert sorted(scores) == [30, 60, 90, 120]
    for step, value in scores.items():
        report = store.get_json(layout.checkpoint_score(step))
        assert report["candidate"]["eval_loss"] == value
        assert report["candidate"]["model_uri"] == layout.checkpoint_export(step)
    best = min(scores, key=lambda s: (scores[s], -s))
    assert pick["step"] == best and pick["metric"] == "eval_loss" and pick["last_step"] == 120
    # Only the pick's export is left; the scored checkpoints are pruned once scored.
    exports = {s for s in scores if store.head(f"{layout.checkpoint_export(s)}/export.json") is not None}
    assert exports == {best}
    kept = {s for s in scores if store.head(layout.committed_marker(s)) is not None}
    assert kept <= {90, 120}

    # The candidate everyone downstream saw is the picked checkpoint's export.
    assert picked["export_uri"] == layout.checkpoint_export(best) != train["export_uri"]
    assert results["evaluate"]["candidate"]["model_uri"] == layout.checkpoint_export(best)
    assert results["evaluate"]["candidate"]["eval_loss"] == scores[best]
    assert store.get_json(f"{picked['export_uri']}/export.json")["step"] == best
    pointer = store.get_json(production_pointer(root, model))
    assert pointer["version"] == results["promote"]["version"] == 1
    card_uri = f"{pointer['uri']}/card.json"
    card = store.get_json(card_uri)
    assert card["checkpoint_pick"]["step"] == best
    page = page_text(render_card_page(card_uri, store.get(card_uri)))
    assert f"Promoted checkpoint step {best} of 120 step {best} has the best eval_loss" in page
    print("picked", pick["why"])
