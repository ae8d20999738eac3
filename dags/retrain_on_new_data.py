"""retrain_on_new_data: retrain as soon as the data team publishes a new snapshot.

**Schedule**: the Asset `datateam-raw-demo-text`, which `data_team_publish` updates. Each
event's extra names the snapshot (`uri`, `rows`, `dataset_name`); the `source` task reads it
from the run's triggering asset events and the snapshot is staged, trained on, evaluated,
gated and promoted. Each event announces a complete snapshot, so when several arrived before
a run started, the newest is staged and the others are logged as superseded. One active run
at a time; events that arrive meanwhile start the next run.

A manual trigger has no asset event: set the `dataset_uri` param to the raw data to stage.

**Configuration**: the training settings come from the Airflow Variable `trainops_retrain`
(JSON; the same keys and defaults as `retrain_scheduled`, except `dataset_uri`, which the event
decides). Connections `aws_default` / `kubernetes_default` and the `[trainops]` config work as
in `retrain_scheduled`; see docs/dags.md.

**Retries**: two, five minutes apart, for the short tasks. None for `train`: preemptions and
infrastructure failures are relaunched inside the task (`max_preemptions`), and a program
error would only fail again after burning the same GPU hours.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from trainops.operators import StageDatasetOperator
from trainops.operators.fail_fast import fail_fast
from trainops.recipes import form, pipeline, sources

MODEL = "retrain-lm"
PLACE = pipeline.deployment()  # [trainops] cluster, image, namespace (local by default)
SETTINGS = [key for key in form.SETTINGS if key not in ("dataset_uri", "dry_run")]

with DAG(
    dag_id="retrain_on_new_data",
    schedule=[sources.RAW_DEMO_ASSET],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["trainops", "retrain", "asset"],
    default_args={"owner": "trainops", "retries": 2, "retry_delay": timedelta(minutes=5)},
    doc_md=__doc__,
    params={
        "dataset_uri": Param(
            None,
            type=["null", "string"],
            pattern=r"^(file:///|s3://[^/\s]+)\S*$",
            title="Raw data (manual runs only)",
            description="A run started by an asset event stages the event's snapshot. A "
            "manual run has no event: give the raw data's file:// or s3:// URI.",
        ),
    },
) as dag:

    @task(multiple_outputs=True)
    @fail_fast
    def source(triggering_asset_events=None, params=None) -> dict:
        """The snapshot to stage: the newest triggering event's, or the dataset_uri param."""
        chosen = sources.source_from_events(triggering_asset_events, params.get("dataset_uri"))
        origin = chosen["from_event"] or "the dataset_uri param (no asset event)"
        print(f"staging {chosen['uri']} as {chosen['dataset_name']!r} from {origin}")
        if chosen["superseded"]:
            print(f"superseded by it: {chosen['superseded']}")
        return chosen

    @task(multiple_outputs=True)
    @fail_fast
    def train_args() -> dict:
        """Read and check the trainops_retrain Variable: the training task's arguments."""
        return form.training_kwargs(form.variable_settings(allowed=SETTINGS))

    snapshot = source()
    args = train_args()  # read before staging: the Variable's task and model say how to stage
    stage = StageDatasetOperator(
        task_id="stage",
        source_uri=snapshot["uri"],
        dataset_name=snapshot["dataset_name"],
        task=args["task"],
        tokenizer=args["tokenizer"],
        cluster=PLACE["cluster"],
        image=PLACE["image"],
        namespace=PLACE["namespace"],
    )

    pipeline.train_evaluate_gate_promote(stage, args, model=MODEL, place=PLACE)


if __name__ == "__main__":
    dag.test()
