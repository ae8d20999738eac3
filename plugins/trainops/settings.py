"""Where trainops keeps its data by default. Standard library only: read at DAG-parse time."""

from __future__ import annotations

import os
import pathlib

__all__ = ["SettingsError", "default_storage_root", "local_state_dir", "resolve_storage_root"]


class SettingsError(ValueError):
    """A setting of the example DAGs' form (``trainops.recipes.form``) is unknown or invalid;
    the message names it. Here, below the operators and the recipes, so that ``fail_fast``
    knows it without importing the recipes (and the form without importing the operators)."""


def _airflow_home() -> pathlib.Path:
    return pathlib.Path(os.environ.get("AIRFLOW_HOME") or "~/airflow").expanduser()


def _validated(value: str, source: str) -> str:
    """Return ``value`` without trailing slashes, or raise ValueError naming it."""
    uri = value.strip()
    if uri.startswith("file://"):
        path = uri[len("file://") :]
        if not path.startswith("/"):
            raise ValueError(
                f"{source} {value!r} is a relative file:// path: use an absolute path "
                "such as file:///var/lib/trainops"
            )
        stripped = "file://" + (path.rstrip("/") or "/")
        return stripped
    if uri.startswith("s3://"):
        bucket = uri[len("s3://") :].split("/", 1)[0]
        if not bucket:
            raise ValueError(f"{source} {value!r} has no bucket: use s3://bucket/prefix")
        return uri.rstrip("/")
    raise ValueError(f"{source} {value!r} is not a storage URI: use file:///abs/path or s3://bucket/prefix")


def default_storage_root() -> str:
    """``$TRAINOPS_STORAGE_ROOT`` if set, else ``file://<AIRFLOW_HOME>/trainops-storage``."""
    value = os.environ.get("TRAINOPS_STORAGE_ROOT")
    if value:
        return _validated(value, "TRAINOPS_STORAGE_ROOT")
    return f"file://{_airflow_home().absolute() / 'trainops-storage'}"


def local_state_dir() -> pathlib.Path:
    """``$TRAINOPS_LOCAL_STATE`` if set, else ``<AIRFLOW_HOME>/trainops-local``; not created here."""
    value = os.environ.get("TRAINOPS_LOCAL_STATE")
    if value:
        return pathlib.Path(value).expanduser().absolute()
    return _airflow_home().absolute() / "trainops-local"


def resolve_storage_root(value: str | None) -> str:
    """The given root (validated, no trailing slash), or the default one when empty."""
    if value is None or not value.strip():
        return default_storage_root()
    return _validated(value, "storage_root")
