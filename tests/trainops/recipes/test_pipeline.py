"""The chain every retraining DAG shares, and where its jobs run."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from trainops.gate.checks import validate_checks
from trainops.operators import StageDatasetOperator
from trainops.recipes.pipeline import (
    CLASSIFIER_GATE_CHECKS,
    GATE_CHECKS,
    deployment,
    gate_checks,
    train_evaluate_gate_promote,
)

ARGS = {
    "nodes": 2,
    "gpus_per_node": 0,
    "capacity": "spot-then-on-demand",
    "max_preemptions": 5,
    "restarts_in_place": 1,
    "trainer_config": {"train": {"max_steps": 10}},
    "gate_checks": GATE_CHECKS,
}


def test_the_shared_gate_is_a_valid_one():
    checks = validate_checks(GATE_CHECKS)
    assert [c["kind"] for c in checks] == ["threshold", "no_regression"]


def test_a_classifier_is_gated_on_accuracy_and_macro_f1_and_a_language_model_on_its_loss():
    assert gate_checks("causal_lm") == gate_checks("sft") == GATE_CHECKS
    classifier = validate_checks(gate_checks("classification"))
    assert classifier == validate_checks(CLASSIFIER_GATE_CHECKS)
    assert [(c["kind"], c["metric"]) for c in classifier] == [
        ("threshold", "accuracy"),
        ("no_regression", "f1_macro"),
        ("no_regression", "accuracy"),
    ]
    assert all(c["direction"] == "higher_is_better" for c in classifier[1:])


def test_jobs_run_where_the_trainops_config_says(monkeypatch):
    assert deployment() == {
        "cluster": "local",
        "image": "trainops-trainer:latest",
        "namespace": "default",
        "poll_interval": 1.0,
    }
    monkeypatch.setenv("AIRFLOW__TRAINOPS__CLUSTER", "kubernetes")
    monkeypatch.setenv("AIRFLOW__TRAINOPS__IMAGE", "registry.example.com/trainer:1.4")
    monkeypatch.setenv("AIRFLOW__TRAINOPS__NAMESPACE", "ml")
    assert deployment() == {
        "cluster": "kubernetes",
        "image": "registry.example.com/trainer:1.4",
        "namespace": "ml",
        "poll_interval": 5.0,  # the Kubernetes API is not polled every second
    }


def test_train_evaluate_gate_promote_wires_four_tasks_on_one_deployment():
    place = {"cluster": "local", "image": "img:1", "namespace": "ml", "poll_interval": 2.0}
    with DAG("pipeline_probe", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        stage = StageDatasetOperator(task_id="stage", source_uri="file:///raw", dataset_name="demo")
        tasks = train_evaluate_gate_promote(stage, ARGS, model="m", place=place, progress_every=10.0)
    assert set(tasks) == {"train", "evaluate", "gate", "promote"}
    assert set(dag.task_ids) == {"stage", "train", "evaluate", "gate", "promote"}
    train, evaluate, promote = tasks["train"], tasks["evaluate"], tasks["promote"]
    assert train.retries == 0  # preemptions have their own budget inside the task
    assert (train.nodes, train.capacity, train.max_preemptions, train.progress_every) == (
        2,
        "spot-then-on-demand",
        5,
        10.0,
    )
    assert train.restarts_in_place == 1
    for task in (train, evaluate):
        assert (task.cluster, task.image, task.namespace, task.poll_interval) == ("local", "img:1", "ml", 2.0)
    assert evaluate.model_name == "m" and promote.model_name == "m"
    assert train.upstream_task_ids == {"stage"}
    assert evaluate.upstream_task_ids == {"train"}
    assert tasks["gate"].upstream_task_ids == {"evaluate"}
    assert tasks["gate"].checks == validate_checks(GATE_CHECKS)  # in a DAG: the plan's XCom, for its task
    assert promote.upstream_task_ids == {"stage", "train", "evaluate", "gate"}


def test_with_best_by_the_best_checkpoint_is_scored_beside_train_and_becomes_the_candidate():
    place = {"cluster": "local", "image": "img:1", "namespace": "ml", "poll_interval": 2.0}
    with DAG("pipeline_best", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        stage = StageDatasetOperator(task_id="stage", source_uri="file:///raw", dataset_name="demo")
        tasks = train_evaluate_gate_promote(stage, ARGS, model="m", place=place, best_by="eval_loss")
    picker = tasks["evaluate_checkpoints"]
    assert picker.upstream_task_ids == {"stage"}  # beside train, not after it
    assert (picker.training_task_id, picker.best_by, picker.poke_interval) == ("train", "eval_loss", 2.0)
    assert tasks["evaluate"].upstream_task_ids == {"evaluate_checkpoints"}
    assert tasks["promote"].upstream_task_ids == {"stage", "evaluate_checkpoints", "evaluate", "gate"}
