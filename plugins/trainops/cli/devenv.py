"""The embedded default environment: Airflow on SQLite and file:// storage inside a checkout.

`make demo`, `make test` and `python -m trainops demo` use it, so a fresh clone needs no
service. Every value is a default: a variable already set in the environment wins.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import trainops
from trainops.settings import resolve_storage_root


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


def checkout_dir(cwd: str | os.PathLike | None = None) -> Path | None:
    """The checkout whose embedded default the commands use: ``cwd`` when it holds ``dags/``
    and ``plugins/trainops/`` (as ``make demo`` runs), else the checkout this ``trainops`` was
    imported from; None for an installed package outside a checkout."""
    for candidate in (Path(cwd or os.getcwd()), Path(trainops.__file__).resolve().parents[2]):
        if (candidate / "dags").is_dir() and (candidate / "plugins" / "trainops").is_dir():
            return candidate.resolve()
    return None


def storage_root_choice(
    explicit: str | None = None, *, checkout: str | os.PathLike | None = None, apply: bool = True
) -> tuple[str, str]:
    """The storage root a command uses and where it comes from, the one rule for every
    ``python -m trainops`` command: ``explicit`` (``--storage-root``), else
    ``$TRAINOPS_STORAGE_ROOT``, else the checkout's embedded default (what ``make demo``
    writes; applied to ``os.environ`` like ``demo`` does unless ``apply`` is False), else
    Airflow's ``$AIRFLOW_HOME/trainops-storage``.

    :param checkout: the checkout (``demo --project-dir``); None: :func:`checkout_dir`.
    :raises ValueError: the root is not a storage URI (the message names it).
    """
    if explicit:
        return resolve_storage_root(explicit), "from --storage-root"
    if os.environ.get("TRAINOPS_STORAGE_ROOT"):
        if apply and checkout is not None:
            apply_dev_env(checkout)
        return resolve_storage_root(None), "from $TRAINOPS_STORAGE_ROOT"
    where = Path(checkout).resolve() if checkout is not None else checkout_dir()
    if where is not None:
        source = f"the embedded default of the checkout {where}"
        if apply:
            apply_dev_env(where)
            return resolve_storage_root(None), source
        return dev_env(where)["TRAINOPS_STORAGE_ROOT"], source
    return resolve_storage_root(None), "Airflow's default, $AIRFLOW_HOME/trainops-storage"


PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"  # Airflow's default name
API_CONN_ENV = "AIRFLOW_CONN_TRAINOPS_AIRFLOW_API"  # [trainops] airflow_api_conn_id's default


def airflow_api_env(
    home: str | os.PathLike, port: int = 8080, user: str = "admin"
) -> tuple[dict[str, str], str]:
    """What ``make airflow`` adds so that run notes are written (trainops.operators.notes): the
    connection ``trainops_airflow_api`` to this API server, logged in as ``user`` with the
    password ``airflow standalone`` uses. That password is the one in ``$AIRFLOW_HOME``'s
    passwords file; when there is none yet, one is made and written there first, so the
    server and the connection agree. Returns ``(environment additions, the password)``; a
    connection already set in the environment is left alone."""
    path = Path(home) / PASSWORDS_FILE
    try:
        passwords = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        passwords = {}
    if not isinstance(passwords, dict) or not isinstance(passwords.get(user), str):
        passwords = {**(passwords if isinstance(passwords, dict) else {}), user: secrets.token_urlsafe(12)}
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
            file.write(json.dumps(passwords))  # never readable by others, not even for a moment
        path.chmod(0o600)  # a file that was there keeps its old mode through os.open
    password = passwords[user]
    if os.environ.get(API_CONN_ENV):
        return {}, password
    conn = {"conn_type": "http", "host": f"http://localhost:{port}", "login": user, "password": password}
    return {API_CONN_ENV: json.dumps(conn)}, password
