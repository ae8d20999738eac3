"""retrain_manual: retrain the model now, with the settings you choose in the trigger form.

**Trigger** it from the UI (the Trigger button opens a form with one field per setting) or
through the REST API (`POST /api/v2/dags/retrain_manual/dagRuns` with
`{"logical_date": null, "conf": {"max_steps": 200}}`; docs/dags.md has a curl example).
Every field has a default that runs on the embedded default: the demo dataset under the
storage root (generated on first use), the tiny model, one CPU "node" on the local cluster,
60 steps, warm-started from the production model when there is one (**Warm start**: `auto`;
`none` trains from random weights, or give a version URI). Airflow checks the form against each field's schema when the run is triggered and
rejects a bad value naming the field; the `plan` task also refuses keys it does not know.

**Tasks**: `plan` checks the settings and decides the training arguments; with **Dry run**
on, `dry_run` writes what would be launched (resolved trainer config, the JobSpec of attempt 1
and the Kubernetes manifests it becomes) and what it would cost (steps x expected step time x
price, spot and on-demand: docs/cost.md, "Before launch") into its log and XCom, and everything else is
skipped. Otherwise: `source` (writes the demo data if the default location is empty) ->
`stage` (validate and tokenize; a content-addressed dataset version) ->
`train` (FSDP under torchrun, deferred while it runs, relaunched after preemptions) ->
`evaluate` (candidate and production on the same split) -> `gate` -> `promote`
(skipped, not failed, when the gate rejects the model).

`nodes`, `gpus_per_node`, `capacity`, `max_preemptions` and `restarts_in_place` reach `train`
as templated fields from `plan`'s XCom; the operator checks them once rendered, before launching.

**Retries**: one for the short tasks (a storage hiccup). None for `train`: preemptions and
infrastructure failures have their own budgets inside the task (`max_preemptions`, two
infrastructure relaunches), and a program error would fail the same way again after burning
the same GPU hours.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pendulum
import yaml
from airflow.sdk import DAG, Variable, task

from trainops.cost.estimate import estimate_lines
from trainops.cost.prices import PRICES_VARIABLE
from trainops.operators import StageDatasetOperator
from trainops.operators.fail_fast import fail_fast
from trainops.recipes import form, pipeline, sources
from trainops.recipes.dry_run import dry_run_report

MODEL = "retrain-lm"
PLACE = pipeline.deployment()  # [trainops] cluster, image, namespace (local by default)

with DAG(
    dag_id="retrain_manual",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one training gang at a time; later triggers queue
    tags=["trainops", "retrain", "manual"],
    default_args={"owner": "trainops", "retries": 1, "retry_delay": timedelta(seconds=30)},
    doc_md=__doc__,
    params=form.manual_params(),
) as dag:

    @task(multiple_outputs=True)
    @fail_fast
    def plan(params=None, dag_run=None) -> dict:
        """Check the run's settings (unknown keys too) and decide what to launch."""
        settings = {key: params[key] for key in form.SETTINGS}
        settings = form.check_settings({**settings, **(dag_run.conf or {})}, source="retrain_manual conf")
        return form.plan_run(settings)

    @task.branch
    def launch_or_dry_run(dry_run: bool) -> str:
        return "dry_run" if dry_run else "source"

    @task
    def dry_run(run_plan: dict, dag=None, dag_run=None) -> dict:
        """Render what the train task would launch and estimate its cost; launch nothing."""
        report = dry_run_report(
            run_plan,
            dag.get_task("train"),
            dag_id=dag_run.dag_id,
            run_id=dag_run.run_id,
            prices_variable=Variable.get(PRICES_VARIABLE, default=None),
        )
        print(f"DRY RUN on cluster {report['cluster']!r}: nothing is staged or launched.")
        print("\n".join(estimate_lines(report["estimate"])))
        print("resolved trainer config:\n" + yaml.safe_dump(report["trainer_config"], sort_keys=False))
        print("JobSpec of attempt 1:\n" + json.dumps(report["job_spec"], indent=2))
        print("Kubernetes manifests:\n" + yaml.safe_dump_all(report["manifests"], sort_keys=False))
        return report

    @task
    def source(dataset_uri: str) -> str:
        """The raw data; the demo dataset is written first if its default location is empty."""
        return sources.ensure_source(dataset_uri, log=logging.getLogger("airflow.task"))

    run_plan = plan()
    branch = launch_or_dry_run(run_plan["dry_run"])
    branch >> dry_run(run_plan)

    raw = source(run_plan["dataset_uri"])
    branch >> raw

    stage = StageDatasetOperator(
        task_id="stage",
        source_uri=raw,
        dataset_name=run_plan["dataset_name"],
        task=run_plan["task"],  # the form's task, and the HF model's tokenizer (None: bytes)
        tokenizer=run_plan["tokenizer"],
        cluster=PLACE["cluster"],
        image=PLACE["image"],
        namespace=PLACE["namespace"],
    )

    args = run_plan  # its nodes, gpus_per_node, capacity ... feed train's templated fields
    pipeline.train_evaluate_gate_promote(stage, args, model=MODEL, place=PLACE, progress_every=10.0)


if __name__ == "__main__":
    dag.test()
