"""The demos' shared chain (``trainops_demo``, ``trainops_demo_sft``): train on 2 local CPU
"nodes" with one injected spot preemption, evaluate, gate, promote.

Imported when DAG files are parsed, like the operators it wires (no heavy import at module level).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param

from trainer.config import MAX_SEED
from trainops.operators import (
    EvaluateModelOperator,
    EvaluationGateOperator,
    FSDPTrainingOperator,
    PromoteModelOperator,
)


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


def hf_demo_params(max_eval_loss: float, loss: str) -> dict[str, Param]:
    """The Hugging Face demos' form: the trainer's ``seed``, the gate's ``max_eval_loss``
    (default ``max_eval_loss``; ``loss`` says which loss it bounds) and ``preempt``."""
    return {
        "seed": Param(
            1234,
            type="integer",
            minimum=0,
            maximum=MAX_SEED,
            title="Training seed",
            description="The trainer's seed: the model's initial weights and the order of the samples.",
        ),
        "max_eval_loss": Param(
            max_eval_loss,
            type="number",
            minimum=0,
            title="Gate: highest eval loss",
            description=f"The gate rejects a candidate whose {loss} is above this.",
        ),
        "preempt": preempt_param(),
    }


def demo_chain(
    stage, *, model: str, trainer_config: dict[str, Any], loss_check: str, preempt_at: int
) -> dict:
    """The four tasks after ``stage``, created in the DAG being defined: train with
    ``trainer_config`` (2 nodes x 1 CPU process, gloo; node 1 preempted at step ``preempt_at``
    when the DAG's ``preempt`` param is on: the DAG renders templates as native objects),
    evaluate against ``model``'s production version, gate (``loss_check``: eval loss under the
    DAG's ``max_eval_loss`` param; and no regression beyond 2 %), promote. Returns them by task id."""
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
    evaluate = EvaluateModelOperator(
        task_id="evaluate", training=train.output, model_name=model, poll_interval=1.0
    )
    gate = EvaluationGateOperator(
        task_id="gate",
        evaluation=evaluate.output,
        checks=[
            {
                "name": loss_check,
                "kind": "threshold",
                "metric": "eval_loss",
                "op": "<=",
                "value": "{{ params.max_eval_loss }}",
            },
            # Relative: a candidate may be up to 2% worse than production. Allows ties (the
            # same data and seed retrain the same model) and another seed's chance difference.
            {
                "name": "no regression vs production",
                "kind": "no_regression",
                "metric": "eval_loss",
                "tolerance": 0.02,
            },
        ],
    )
    promote = PromoteModelOperator(
        task_id="promote",
        model_name=model,
        gate=gate.output,
        training=train.output,
        dataset=stage.output,
        evaluation=evaluate.output,
    )
    return {"train": train, "evaluate": evaluate, "gate": gate, "promote": promote}
