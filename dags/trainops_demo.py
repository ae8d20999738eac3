"""trainops_demo: the whole retraining pipeline on the embedded default (no cloud, no cluster).

Generate demo data -> stage and validate it -> train on 2 local "nodes" with one injected spot
preemption -> evaluate against production -> gate -> promote. `make demo` runs it with
`dag.test()`; the same operators run on S3 and Kubernetes by changing parameters, not code.

Params (the trigger form, or `-c '{...}'`): `seed` (the trainer's seed; the default, 1234, is
what `make demo` trains with, so a second run trains the same model and is not published
again; `{"seed": 2}` trains another model, promoted as the next version when it passes the
gate), `max_eval_loss` (the gate's threshold; 0.5 rejects every model), `corrupt_data`
(staging rejects the data before anything trains) and `preempt` (off: no injected preemption;
the same seed still trains the same model, bit for bit).
"""

from __future__ import annotations

from airflow.sdk import Param, task

from trainer.config import MAX_SEED
from trainer.contract import join
from trainops.operators import StageDatasetOperator
from trainops.recipes.demo import demo_chain, demo_dag, demo_trainer_config, loss_checks, preempt_param
from trainops.settings import resolve_storage_root
from trainops.staging.demo_data import write_demo_dataset

MODEL = "demo-lm"

with demo_dag(
    "trainops_demo",
    __doc__,
    {
        "seed": Param(
            1234,
            type="integer",
            minimum=0,
            maximum=MAX_SEED,  # the trainer's own bound
            title="Training seed",
            description="The trainer's seed: the model's initial weights and the order of the "
            "training samples. The default is what make demo trains with, so the same data "
            "trains the same model again, which is not published a second time. Set it to 2 "
            "to train another model, promoted as the next version when it passes the gate.",
        ),
        "corrupt_data": Param(
            False,
            type="boolean",
            title="Deliver bad data",
            description="Write demo data with null and duplicate ids and empty texts, to see "
            "staging reject it before any training is launched.",
        ),
        "max_eval_loss": Param(
            3.5,
            type="number",
            minimum=0,
            title="Gate: highest eval loss",
            description="The gate rejects a candidate whose eval loss is above this. Set it "
            "to 0.5 to watch a model be rejected and promotion skipped.",
        ),
        "preempt": preempt_param(),
    },
) as dag:

    @task
    def demo_data(params=None) -> str:
        """Write the deterministic demo dataset (Parquet) under the storage root; return its URI."""
        corrupt = bool(params["corrupt_data"])
        uri = join(resolve_storage_root(None), "raw", "demo-text-corrupt" if corrupt else "demo-text")
        write_demo_dataset(uri, rows=4000, seed=0, corrupt=corrupt)
        return uri

    stage = StageDatasetOperator(task_id="stage", source_uri=demo_data(), dataset_name="demo-text")

    demo_chain(
        stage,
        model=MODEL,
        trainer_config=demo_trainer_config(),
        checks=loss_checks("eval loss under max_eval_loss"),
        preempt_at=50,
    )

if __name__ == "__main__":
    dag.test()
