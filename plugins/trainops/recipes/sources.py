"""Where a run's raw data comes from: the demo dataset, or a data team's asset events.

Imported when DAG files are parsed: what it imports defers the heavy libraries (pyarrow,
boto3) to the functions that use them (pyproject's banned-module-level-imports).
"""

from __future__ import annotations

from airflow.sdk import Asset

from trainer.contract import join, safe_segment
from trainops.hooks.storage import storage_for
from trainops.recipes.form import DEMO_DATASET, dataset_name_for, demo_source_uri
from trainops.staging.demo_data import write_demo_dataset

# The raw data a data team lands (dags/data_team_publish.py) and retrain_on_new_data is
# scheduled on. The URI names the feed, not a location: each event's extra carries the
# snapshot's storage URI.
RAW_DEMO_ASSET = Asset(name="datateam-raw-demo-text", uri="datateam://raw/demo-text")


def ensure_source(uri: str, *, aws_conn_id: str | None = "aws_default", log=None) -> str:
    """``uri``, after writing the demo dataset there if ``uri`` is the storage root's demo
    location and holds nothing yet. Any other URI is returned as is (staging checks it)."""
    if uri.rstrip("/") != demo_source_uri():
        return uri
    store = storage_for(uri, aws_conn_id)
    if store.list(uri):
        return uri

    written = write_demo_dataset(uri, rows=4000, seed=0, storage=store)
    if log:
        log.info("no data at %s yet: wrote the demo dataset (%d rows)", uri, written["rows"])
    return uri


def land_demo_batch(
    root: str, batch: str, *, seed: int, rows: int = 4000, aws_conn_id: str | None = "aws_default"
) -> dict:
    """Write one snapshot of demo data to ``<root>/raw/datateam/demo-text/<batch>``; return
    the asset event's extra: ``{"uri", "rows", "dataset_name", "format"}``."""
    uri = join(root, "raw", "datateam", DEMO_DATASET, safe_segment(batch))
    written = write_demo_dataset(uri, rows=rows, seed=seed, storage=storage_for(root, aws_conn_id))
    return {"uri": written["uri"], "rows": written["rows"], "dataset_name": DEMO_DATASET, "format": "parquet"}


def source_from_events(events, fallback_uri: str | None = None) -> dict:
    """Which raw data a run triggered by asset events should stage.

    ``events`` maps each asset to its events (Airflow's ``triggering_asset_events``); each
    event has ``extra`` (``uri``, optional ``rows`` and ``dataset_name``) and ``timestamp``.
    Each event announces a complete snapshot, so when several arrived before the run started
    the newest one wins and the others are reported as superseded. Without any event (a
    manual run), ``fallback_uri`` is used. Returns ``{"uri", "dataset_name", "rows",
    "from_event", "superseded"}``.
    """
    found = [
        e
        for batch in (events or {}).values()
        for e in batch
        if isinstance(getattr(e, "extra", None), dict) and e.extra.get("uri")
    ]
    if not found:
        if not fallback_uri:
            seen = sum(len(batch) for batch in (events or {}).values())
            raise ValueError(
                f"nothing to stage: {seen} triggering asset event(s) and none has "
                "'uri' in its extra; a manual run must set the dataset_uri param"
            )
        return {
            "uri": fallback_uri,
            "dataset_name": dataset_name_for(fallback_uri),
            "rows": None,
            "from_event": None,
            "superseded": [],
        }
    found.sort(key=lambda e: e.timestamp)
    newest = found[-1]
    extra = newest.extra
    return {
        "uri": extra["uri"],
        "dataset_name": extra.get("dataset_name") or dataset_name_for(extra["uri"]),
        "rows": extra.get("rows"),
        "from_event": {
            "asset": getattr(newest.asset, "name", None),
            "source_dag_id": getattr(newest, "source_dag_id", None),
            "source_run_id": getattr(newest, "source_run_id", None),
            "timestamp": newest.timestamp.isoformat(),
        },
        "superseded": [e.extra["uri"] for e in found[:-1]],
    }
