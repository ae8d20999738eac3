"""deploy_on_promotion: an example deploy DAG, scheduled on a new production model.

Each time `PromoteModelOperator` or `RollbackModelOperator` moves a model's production
pointer, it emits an event on the Asset `trainops://models/<name>`, with the version, its
folder's URI, the version it replaced and who moved it in the event's extra. This DAG is
scheduled on the Assets of `retrain-lm` (the retraining DAGs' model) and `demo-lm` (the
demo's): each event starts a run, which deploys what the model's production pointer names now
(a later move may have come since the event), checks that its folder holds a promoted version,
and records what it would serve in `models/<name>/deployment.json` (`trainops.recipes.deploy`).
Put your serving platform's call in its place.

A rollback from the command line (`python -m trainops rollback`) runs outside Airflow and
emits no event: run `RollbackModelOperator` in a DAG when a deploy must follow it at once
(the next event's run deploys what production is then, in any case).

**Retries**: two: recording a release again is harmless.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from trainops.hooks.storage import storage_for
from trainops.operators.production_asset import model_asset
from trainops.recipes.deploy import record_release, releases
from trainops.settings import resolve_storage_root

with DAG(
    dag_id="deploy_on_promotion",
    schedule=(model_asset("retrain-lm") | model_asset("demo-lm")),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["trainops", "deploy", "example"],
    default_args={"owner": "trainops", "retries": 2, "retry_delay": timedelta(minutes=1)},
    doc_md=__doc__,
) as dag:

    @task
    def deploy(triggering_asset_events=None) -> list[dict]:
        """Deploy what production is now for each model the triggering events name."""
        extras = [event.extra for events in (triggering_asset_events or {}).values() for event in events]
        root = resolve_storage_root(None)
        store = storage_for(root)
        done = [record_release(store, root, release) for release in releases(extras)]
        for record in done:
            event = record["event"]
            print(
                f"deployed {record['model']} v{record['version']} from {record['uri']} "
                f"(on the {event['action']} of v{event['version']})"
            )
        return done

    deploy()


if __name__ == "__main__":
    dag.test()
