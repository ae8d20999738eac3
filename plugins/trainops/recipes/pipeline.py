"""The chain every retraining DAG shares: train -> evaluate -> gate -> promote, and where it runs.

Imported when DAG files are parsed, like the operators it wires; neither imports a heavy
library at module level (pyproject's banned-module-level-imports).
"""

from __future__ import annotations

from typing import Any

from airflow.configuration import conf
from airflow.sdk import BaseOperator

from trainer.contract import TASK_CLASSIFICATION
from trainops.operators import (
    EvaluateCheckpointsOperator,
    EvaluateModelOperator,
    EvaluationGateOperator,
    FSDPTrainingOperator,
    PromoteModelOperator,
)

# Relative: a candidate may be up to 2% worse than production. Allows ties (the same data and
# seed retrain the same model) and another seed's chance difference.
NO_REGRESSION_TOLERANCE = 0.02


def no_regression_check(metric: str, name: str) -> dict:
    """The example DAGs' no-regression check of ``metric`` against production (2 %)."""
    return {"name": name, "kind": "no_regression", "metric": metric, "tolerance": NO_REGRESSION_TOLERANCE}


# The gate the example DAGs apply to a language model (causal_lm, sft): an absolute bound well
# below an untrained model's loss (ln 257 = 5.55 with the byte tokenizer), and no regression
# against production.
GATE_CHECKS = [
    {"name": "eval loss under 3.5", "kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 3.5},
    no_regression_check("eval_loss", "no regression vs production"),
]


# A classifier's: what its team measures. Accuracy at least 0.5 (a sanity bound: a classifier
# below it is wrong on most records), macro-F1 (every label weighs the same, so a label the
# model stops finding shows) and accuracy no worse than production's by more than 2 %.
CLASSIFIER_GATE_CHECKS = [
    {"name": "accuracy at least 0.5", "kind": "threshold", "metric": "accuracy", "op": ">=", "value": 0.5},
    no_regression_check("f1_macro", "macro F1 no regression vs production"),
    no_regression_check("accuracy", "accuracy no regression vs production"),
]


def gate_checks(task: str) -> list[dict]:
    """The example DAGs' gate for a run of ``task`` (``task.kind``): a classifier's on accuracy
    and macro-F1, a language model's on its eval loss."""
    return CLASSIFIER_GATE_CHECKS if task == TASK_CLASSIFICATION else GATE_CHECKS


def deployment() -> dict:
    """Where jobs run, read when a DAG is parsed from ``[trainops]`` in Airflow's config
    (``AIRFLOW__TRAINOPS__CLUSTER`` ...): ``cluster`` (``local``), ``image``, ``namespace``,
    and the job poll interval that suits the cluster (1 s for local processes, 5 s for the
    Kubernetes API). A deployment choice, not a per-run one: every task of a run must agree
    on it."""
    cluster = conf.get("trainops", "cluster", fallback="local")
    return {
        "cluster": cluster,
        "image": conf.get("trainops", "image", fallback="trainops-trainer:latest"),
        "namespace": conf.get("trainops", "namespace", fallback="default"),
        "poll_interval": 1.0 if cluster == "local" else 5.0,
    }


def best_checkpoint(stage, train, best_by: str | None, **where: Any) -> tuple[Any, dict[str, BaseOperator]]:
    """``(candidate, tasks)``: the result evaluate and promote take, and the tasks made for it.

    Without ``best_by``: the training's own result (its last checkpoint's export), no task. With
    it: an ``EvaluateCheckpointsOperator`` (``evaluate_checkpoints``) beside ``train``, downstream
    of ``stage`` so that it scores checkpoints while ``train`` runs, whose result names the best
    checkpoint by ``best_by`` (the trainer config must set ``eval.every_checkpoints``)."""
    if best_by is None:
        return train.output, {}
    picker = EvaluateCheckpointsOperator(
        task_id="evaluate_checkpoints", training_task_id=train.task_id, best_by=best_by, **where
    )
    stage >> picker
    return picker.output, {"evaluate_checkpoints": picker}


def train_evaluate_gate_promote(
    stage, args, *, model: str, place: dict, best_by: str | None = None, **train_options
) -> dict:
    """What every retraining DAG shares, created in the DAG being defined: train on
    ``stage``'s dataset with the run-time settings ``args`` (an XCom dict with ``nodes``,
    ``gpus_per_node``, ``capacity``, ``max_preemptions``, ``restarts_in_place``,
    ``trainer_config``, ``gate_checks``:
    :func:`gate_checks` of the run's task), evaluate the candidate against production, gate it
    and promote it. ``place`` is
    :func:`deployment`'s answer. ``best_by``: evaluate, gate and promote the run's best
    checkpoint by that metric (:func:`best_checkpoint`; ``args["trainer_config"]`` must set
    ``eval.every_checkpoints``). Returns the tasks by task id."""
    where = {key: place[key] for key in ("cluster", "image", "namespace", "poll_interval")}
    # No Airflow retries for training: preemptions and infrastructure failures have their own
    # budgets inside the task, and a program error would fail the same way again.
    train = FSDPTrainingOperator(
        task_id="train",
        dataset=stage.output,
        nodes=args["nodes"],
        gpus_per_node=args["gpus_per_node"],
        capacity=args["capacity"],
        max_preemptions=args["max_preemptions"],
        restarts_in_place=args["restarts_in_place"],
        trainer_config=args["trainer_config"],
        model_name=model,  # init.from production/auto: this model's production version
        retries=0,
        **where,
        **train_options,
    )
    candidate, tasks = best_checkpoint(stage, train, best_by, **where)
    evaluate = EvaluateModelOperator(task_id="evaluate", training=candidate, model_name=model, **where)
    gate = EvaluationGateOperator(task_id="gate", evaluation=evaluate.output, checks=args["gate_checks"])
    promote = PromoteModelOperator(
        task_id="promote",
        model_name=model,
        gate=gate.output,
        training=candidate,
        dataset=stage.output,
        evaluation=evaluate.output,
    )
    return {"train": train, **tasks, "evaluate": evaluate, "gate": gate, "promote": promote}
