"""dag.test() runs only DAGs it finds in a configured bundle: point Airflow at a test's folder."""

import json


def use_dag_folder(monkeypatch, folder, name: str) -> None:
    """Make ``folder`` the only DAG bundle (named ``name``) for the rest of the test."""
    monkeypatch.setenv(
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST",
        json.dumps(
            [
                {
                    "name": name,
                    "kwargs": {"path": str(folder), "refresh_interval": 0},
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                }
            ]
        ),
    )
