"""The embedded default environment: Airflow on SQLite and file:// storage inside a checkout.

`make demo`, `make test` and `python -m trainops demo` use it, so a fresh clone needs no
service. Every value is a default: a variable already set in the environment wins.
"""

from __future__ import annotations

import os
from pathlib import Path


def dev_env(project_dir: str | os.PathLike) -> dict[str, str]:
    """Environment defaults for running Airflow and trainops from ``project_dir``."""
    root = Path(project_dir).resolve()
    home = root / ".airflow"
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # 2 cores: a handful of task slots is plenty, more only thrashes.
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "TRAINOPS_STORAGE_ROOT": f"file://{root / '.trainops' / 'storage'}",
        "TRAINOPS_LOCAL_STATE": str(root / ".trainops" / "local"),
    }


def apply_dev_env(project_dir: str | os.PathLike) -> dict[str, str]:
    """Set the defaults in ``os.environ`` (without overriding) and return the effective values."""
    effective = {}
    for key, value in dev_env(project_dir).items():
        effective[key] = os.environ.setdefault(key, value)
    Path(effective["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    return effective
