"""The demos' shared chain (``trainops_demo``, ``trainops_demo_best_checkpoint``,
``trainops_demo_sft``, ``trainops_demo_classification``): train on 2 local CPU "nodes" with one injected spot
preemption, evaluate, gate (on loss, or on a classifier's accuracy and macro-F1), promote.

Imported when DAG files are parsed, like the operators it wires (no heavy import at module level).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, BaseOperator, Param

from trainer.config import MAX_SEED
from trainops.operators import (
    EvaluateModelOperator,
    EvaluationGateOperator,
    FSDPTrainingOperator,
    PromoteModelOperator,
)
from trainops.recipes.pipeline import best_checkpoint, no_regression_check


def preempt_param() -> Param:
    """The demos' ``preempt`` switch: the injected spot preemption of node 1 (on by default)."""
    return Param(
        True,
        type="boolean",
        title="Inject a spot preemption",
        description="Stop node 1 mid-run as a spot reclaim would, to watch the run save an "
        "emergency checkpoint, relaunch and resume from it. Off: an uninterrupted run, which "
        "with the same seed trains the same model bit for bit.",
    )


def demo_dag(dag_id: str, doc: str | None, params: dict[str, Param]) -> DAG:
    """A demo DAG: triggered by hand, one run at a time, no retries, ``doc`` as its docs, and
    templates rendered to Python objects, so ``"{{ params.seed }}"`` reaches the trainer config
    as the Param's int (the trainer's schema refuses the text "1234" for an integer key)."""
    return DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        tags=["trainops", "demo"],
        default_args={"owner": "trainops", "retries": 0},
        doc_md=doc,
        render_template_as_native_obj=True,
        params=params,
    )


def demo_params(**gate: Param) -> dict[str, Param]:
    """The demos' form: the trainer's ``seed``, the gate's own params (``gate``:
    :func:`max_eval_loss_param` or :func:`min_accuracy_param`) and ``preempt``."""
    return {
        "seed": Param(
            1234,
            type="integer",
            minimum=0,
            maximum=MAX_SEED,
            title="Training seed",
            description="The trainer's seed: the model's initial weights and the order of the samples.",
        ),
        **gate,
        "preempt": preempt_param(),
    }


def max_eval_loss_param(default: float, loss: str) -> Param:
    """The gate's ``max_eval_loss`` (``loss`` says which loss it bounds), for :func:`loss_checks`."""
    return Param(
        default,
        type="number",
        minimum=0,
        title="Gate: highest eval loss",
        description=f"The gate rejects a candidate whose {loss} is above this.",
    )


def min_accuracy_param(default: float) -> Param:
    """The gate's ``min_accuracy``, for :func:`classifier_checks`."""
    return Param(
        default,
        type="number",
        minimum=0,
        maximum=1,
        title="Gate: lowest accuracy",
        description="The gate rejects a classifier whose accuracy on the eval records is below this.",
    )


def demo_trainer_config() -> dict[str, Any]:
    """The causal_lm demo's trainer config: the tiny preset, 120 steps, a checkpoint every 30."""
    return {
        "seed": "{{ params.seed }}",  # an int: the DAGs render templates as native objects
        "precision": "bf16",
        "model": {"preset": "tiny"},
        "train": {
            "max_steps": 120,
            "micro_batch_size": 8,
            "grad_accum_steps": 1,
            "seq_len": 64,
            "lr": 3e-3,
            "warmup_steps": 10,
        },
        "checkpoint": {"every_steps": 30, "keep": 2},
        "metrics": {"flush_every": 1},
    }


def loss_checks(name: str) -> list[dict[str, Any]]:
    """A language model's gate: eval loss under the DAG's ``max_eval_loss`` param (the check
    called ``name``), and no regression of it beyond 2 %."""
    return [
        {
            "name": name,
            "kind": "threshold",
            "metric": "eval_loss",
            "op": "<=",
            "value": "{{ params.max_eval_loss }}",
        },
        no_regression_check("eval_loss", "no regression vs production"),
    ]


def classifier_checks() -> list[dict[str, Any]]:
    """A classifier's gate, on what its team measures: accuracy at least the DAG's
    ``min_accuracy`` param, and macro-F1 (every label weighs the same, so a label the model
    stops finding shows) no worse than production's by more than 2 %."""
    return [
        {
            "name": "accuracy at least min_accuracy",
            "kind": "threshold",
            "metric": "accuracy",
            "op": ">=",
            "value": "{{ params.min_accuracy }}",
        },
        no_regression_check("f1_macro", "macro F1 no regression vs production"),
    ]


def demo_chain(
    stage,
    *,
    model: str,
    trainer_config: dict[str, Any],
    checks: list[dict[str, Any]],
    preempt_at: int,
    best_by: str | None = None,
) -> dict:
    """The four tasks after ``stage``, created in the DAG being defined: train with
    ``trainer_config`` (2 nodes x 1 CPU process, gloo; node 1 preempted at step ``preempt_at``
    when the DAG's ``preempt`` param is on: the DAG renders templates as native objects),
    evaluate against ``model``'s production version, gate with ``checks`` (:func:`loss_checks`,
    :func:`classifier_checks`), promote. Returns them by task id.

    :param best_by: score the run's checkpoints while it trains (``evaluate_checkpoints``, beside
        ``train``; ``trainer_config`` sets ``eval.every_checkpoints``) and evaluate, gate and
        promote the best one by this metric instead of the last one."""
    train = FSDPTrainingOperator(
        task_id="train",
        dataset=stage.output,
        nodes=2,
        gpus_per_node=0,  # 2 "nodes" x 1 CPU process, gloo
        trainer_config=trainer_config,
        # Rendered as a native object: this mapping, or None when the DAG's preempt param is off.
        inject_preemption="{{ {'node': 1, 'at_step': "
        + str(int(preempt_at))
        + "} if params.preempt else None }}",
        max_preemptions=2,
        termination_grace_seconds=30,
        poll_interval=1.0,
        progress_every=5.0,
    )
    candidate, picked = best_checkpoint(stage, train, best_by, poll_interval=1.0)
    tasks = dict[str, BaseOperator](train=train, **picked)
    evaluate = EvaluateModelOperator(
        task_id="evaluate", training=candidate, model_name=model, poll_interval=1.0
    )
    gate = EvaluationGateOperator(
        task_id="gate",
        evaluation=evaluate.output,
        checks=checks,
    )
    promote = PromoteModelOperator(
        task_id="promote",
        model_name=model,
        gate=gate.output,
        training=candidate,
        dataset=stage.output,
        evaluation=evaluate.output,
    )
    return {**tasks, "evaluate": evaluate, "gate": gate, "promote": promote}
