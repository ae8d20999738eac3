"""retrain_scheduled: retrain the model every night on the latest raw data, unattended.

**Schedule**: 03:00 UTC every day (cron `0 3 * * *`), no catch-up of missed nights, one
active run at a time.

**Configuration**, read when a run starts, so a change applies to the next run without
touching code:

- Airflow Variable `trainops_retrain` (JSON object), any of `dataset_uri`, `model_preset`,
  `hf_model`, `task`, `nodes`, `gpus_per_node`, `capacity`, `max_preemptions`,
  `restarts_in_place`, `lr`, `max_steps`,
  `warm_start`, with the same meanings, limits and defaults as the `retrain_manual` form. Unset keys keep their defaults,
  which run on the embedded default: the demo dataset under the storage root (generated on
  first use), the tiny model, one CPU "node", 60 steps, and `warm_start` `auto`: training starts
  from the production version of `retrain-lm` when there is one, else from random weights (the
  `train` log says which; `none` always starts cold). An unknown key or a bad value fails
  the `plan` task, naming it. Example: `{"dataset_uri": "s3://raw/tickets/", "nodes": 4,
  "gpus_per_node": 8, "capacity": "spot-then-on-demand", "max_steps": 20000}`.
- Connections: `aws_default` (an `aws` connection: keys, `endpoint_url`, `region_name`) for
  `s3://` data and storage; `kubernetes_default` when `[trainops] cluster = kubernetes`.
- Where it runs: the storage root is `$TRAINOPS_STORAGE_ROOT` (default
  `file://$AIRFLOW_HOME/trainops-storage`); the cluster, image and namespace come from
  `[trainops] cluster`, `image`, `namespace` in Airflow's config (default: the local cluster).

**Tasks**: `plan` -> `source` -> `stage` -> `train` -> `evaluate` -> `gate` -> `promote`.
`train`'s `nodes`, `capacity`... are templated fields fed from `plan`'s XCom. A candidate the
gate rejects is not promoted; the run stays green and the promote task says why.

**Retries**: two, five minutes apart, for the short tasks (storage or API hiccups at night).
None for `train`: preemptions and infrastructure failures are relaunched inside the task
(`max_preemptions`, two infrastructure relaunches), and a program error would only fail again
after burning the same GPU hours.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from trainops.operators import StageDatasetOperator
from trainops.operators.fail_fast import fail_fast
from trainops.recipes import form, pipeline, sources

MODEL = "retrain-lm"
PLACE = pipeline.deployment()  # [trainops] cluster, image, namespace (local by default)
SETTINGS = [key for key in form.SETTINGS if key != "dry_run"]

with DAG(
    dag_id="retrain_scheduled",
    schedule="0 3 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["trainops", "retrain", "scheduled"],
    default_args={"owner": "trainops", "retries": 2, "retry_delay": timedelta(minutes=5)},
    doc_md=__doc__,
) as dag:

    @task(multiple_outputs=True)
    @fail_fast
    def plan() -> dict:
        """Read and check the trainops_retrain Variable; decide what to stage and launch."""
        return form.plan_run(form.variable_settings(allowed=SETTINGS))

    @task
    def source(dataset_uri: str) -> str:
        """The raw data; the demo dataset is written first if its default location is empty."""
        return sources.ensure_source(dataset_uri, log=logging.getLogger("airflow.task"))

    run_plan = plan()
    stage = StageDatasetOperator(
        task_id="stage",
        source_uri=source(run_plan["dataset_uri"]),
        dataset_name=run_plan["dataset_name"],
        task=run_plan["task"],  # the form's task, and the HF model's tokenizer (None: bytes)
        tokenizer=run_plan["tokenizer"],
        cluster=PLACE["cluster"],
        image=PLACE["image"],
        namespace=PLACE["namespace"],
    )

    args = run_plan  # its nodes, gpus_per_node, capacity ... feed train's templated fields
    pipeline.train_evaluate_gate_promote(stage, args, model=MODEL, place=PLACE)


if __name__ == "__main__":
    dag.test()
