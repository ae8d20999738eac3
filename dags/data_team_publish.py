"""data_team_publish: an example producer, the kind of DAG a data team owns.

Every day at 02:00 UTC it lands a fresh snapshot of raw data (here: generated demo text, as
Parquet) under `<storage root>/raw/datateam/demo-text/<run id>/` and emits an event on the
Asset `datateam-raw-demo-text` (URI `datateam://raw/demo-text`). The event's extra says what
landed: `{"uri": <the snapshot's storage URI>, "rows": <count>, "dataset_name": "demo-text",
"format": "parquet"}`.

The data team knows nothing about training. `retrain_on_new_data` is scheduled on that Asset
and reads the event's extra to decide what to stage: a contract between the two teams made of
one Asset name and three keys. A real producer would write its extract where this one writes
demo data, and set the same extra.

**Params** (manual triggers): `rows`, the snapshot's size.

**Retries**: two, five minutes apart: landing data is idempotent (the snapshot folder is
named after the run), so a retry simply writes it again.
"""

from __future__ import annotations

import zlib
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from trainops.recipes import sources
from trainops.settings import resolve_storage_root

with DAG(
    dag_id="data_team_publish",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["data-team", "producer", "example"],
    # The example keeps trainops as owner; a data team would put its own name here.
    default_args={"owner": "trainops", "retries": 2, "retry_delay": timedelta(minutes=5)},
    doc_md=__doc__,
    params={
        "rows": Param(
            4000,
            type="integer",
            minimum=100,
            maximum=1_000_000,
            title="Rows",
            description="Rows in the snapshot, 100 to 1,000,000.",
        ),
    },
) as dag:

    @task(outlets=[sources.RAW_DEMO_ASSET])
    def land_raw_data(params=None, dag_run=None, outlet_events=None) -> dict:
        """Write this run's snapshot and announce it on the Asset, with its URI and row count."""
        extra = sources.land_demo_batch(
            resolve_storage_root(None),
            dag_run.run_id,
            seed=zlib.crc32(dag_run.run_id.encode()) % 1000,
            rows=int(params["rows"]),
        )
        outlet_events[sources.RAW_DEMO_ASSET].extra = extra
        print(f"landed {extra['rows']} rows at {extra['uri']}")
        return extra

    land_raw_data()


if __name__ == "__main__":
    dag.test()
