"""trainops_demo_best_checkpoint: the demo pipeline, promoting its run's best checkpoint.

The same data, model and training as `trainops_demo`, with mid-run evaluation: while `train`
runs, `evaluate_checkpoints` scores every checkpoint it commits (steps 30, 60, 90 and the last,
120), each in a job of its own that never slows the training gang, and picks the one with
the lowest eval loss. `evaluate`, `gate` and `promote` then take that checkpoint's export
instead of the last one, and the model card names its step and why it was picked.

Run it with `python -m trainops demo --best-checkpoint`, or trigger it in the Airflow UI.
Params: `seed`, `max_eval_loss` and `preempt`, as for `trainops_demo`.
"""

from __future__ import annotations

from airflow.sdk import task

from trainer.contract import join
from trainops.operators import StageDatasetOperator
from trainops.recipes.demo import (
    demo_chain,
    demo_dag,
    demo_params,
    demo_trainer_config,
    loss_checks,
    max_eval_loss_param,
)
from trainops.settings import resolve_storage_root
from trainops.staging.demo_data import write_demo_dataset

MODEL = "demo-lm-best"

with demo_dag(
    "trainops_demo_best_checkpoint", __doc__, demo_params(max_eval_loss=max_eval_loss_param(3.5, "eval loss"))
) as dag:

    @task
    def demo_data() -> str:
        """Write the deterministic demo dataset (Parquet) under the storage root; return its URI."""
        uri = join(resolve_storage_root(None), "raw", "demo-text")
        write_demo_dataset(uri, rows=4000, seed=0)
        return uri

    stage = StageDatasetOperator(task_id="stage", source_uri=demo_data(), dataset_name="demo-text")
    config = demo_trainer_config()
    config["eval"] = {"every_checkpoints": 1}  # score every checkpoint (and keep it until scored)
    demo_chain(
        stage,
        model=MODEL,
        trainer_config=config,
        checks=loss_checks("eval loss under max_eval_loss"),
        preempt_at=50,
        best_by="eval_loss",
    )

if __name__ == "__main__":
    dag.test()
