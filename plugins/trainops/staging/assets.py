"""How a staged dataset is named as an Airflow Asset (plain strings; no Airflow import).

* Asset name ``trainops-dataset-<name>``, URI ``trainops://datasets/<name>``, where
  ``<name>`` is the dataset name made path-safe the way the storage layout makes it
  (every character outside ``[A-Za-z0-9._=-]`` becomes ``_``). The URI names the dataset,
  not a storage location: every version of it, on any storage root, is the same Asset, and
  each staging run is one event on it.
* When the dataset name is only known at run time (templated or an XCom), the staging task
  declares the alias ``trainops-datasets`` and attaches each event to the dataset's Asset
  through it. A DAG scheduled on that Asset runs whichever way the event was emitted.
* The event's extra: ``dataset_name``, ``version``, ``rows``, ``tokens``, ``train_tokens``,
  ``eval_tokens``, ``uri`` (the version prefix, the trainer's ``data_uri``),
  ``manifest_uri``, ``reused`` and ``quarantined_rows``.
"""

from __future__ import annotations

from trainer.contract import safe_segment

ASSET_SCHEME = "trainops"
ASSET_ALIAS = "trainops-datasets"


def asset_name(dataset_name: str) -> str:
    return f"trainops-dataset-{safe_segment(dataset_name)}"


def asset_uri(dataset_name: str) -> str:
    return f"{ASSET_SCHEME}://datasets/{safe_segment(dataset_name)}"


def is_runtime_name(dataset_name) -> bool:
    """True when the name is only known when the task runs (a template or an XCom)."""
    return not isinstance(dataset_name, str) or "{{" in dataset_name or "{%" in dataset_name


def event_extra(result: dict) -> dict:
    """The Asset event's extra from a staging result (JSON values only)."""
    return {
        "dataset_name": result["dataset_name"],
        "version": result["version"],
        "rows": int(result["rows"]),
        "tokens": int(result["train_tokens"]) + int(result["eval_tokens"]),
        "train_tokens": int(result["train_tokens"]),
        "eval_tokens": int(result["eval_tokens"]),
        "uri": result["uri"],
        "manifest_uri": result["manifest_uri"],
        "reused": bool(result["reused"]),
        "quarantined_rows": int(result.get("quarantined_rows", 0)),
    }
