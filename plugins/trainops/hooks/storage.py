"""Storage clients built from Airflow connections, and the storage environment for jobs.

On the Airflow side S3 credentials come from an Airflow ``aws`` connection (the same
fields and extras the Amazon provider reads). Training jobs never receive keys: they get
the endpoint and region only and use their own identity (IRSA, instance profile, env).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from trainer.storage import Storage, open_storage

__all__ = ["get_json_object", "job_env_for", "root_and_storage", "storage_for"]

log = logging.getLogger(__name__)

_fallback_logged: set[str] = set()
_fallback_lock = threading.Lock()


def _connection_options(aws_conn_id: str | None) -> dict | None:
    """Storage options from the Airflow connection, or None when there is no such connection."""
    if not aws_conn_id:
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(aws_conn_id)
    except AirflowNotFoundException:
        with _fallback_lock:
            first = aws_conn_id not in _fallback_logged
            _fallback_logged.add(aws_conn_id)
        if first:
            log.info(
                "Airflow connection %r is not defined; S3 access uses boto3's default "
                "credential chain (environment, IRSA, instance profile)",
                aws_conn_id,
            )
        return None
    extra = conn.extra_dejson or {}
    s3_config = (extra.get("service_config") or {}).get("s3") or {}
    return {
        "endpoint_url": extra.get("endpoint_url") or s3_config.get("endpoint_url") or None,
        "region": extra.get("region_name") or None,
        "aws_access_key_id": conn.login or extra.get("aws_access_key_id") or None,
        "aws_secret_access_key": conn.password or extra.get("aws_secret_access_key") or None,
        "aws_session_token": extra.get("aws_session_token") or None,
    }


def storage_for(root_uri: str, aws_conn_id: str | None = "aws_default") -> Storage:
    """The storage client for ``root_uri``, using ``aws_conn_id`` for ``s3://`` when it exists.

    :param root_uri: ``file:///abs/path`` or ``s3://bucket/prefix``.
    :param aws_conn_id: Airflow AWS connection; when it is unset or not defined, boto3's
        default credential chain is used.
    """
    if not root_uri.startswith("s3://"):
        return open_storage(root_uri)
    options = _connection_options(aws_conn_id) or {}
    return open_storage(root_uri, **options)


def root_and_storage(
    storage_root: str | None, aws_conn_id: str | None = "aws_default"
) -> tuple[str, Storage]:
    """An operator's storage: its ``storage_root`` (or the default root) and a client for it."""
    from trainops.settings import resolve_storage_root

    root = resolve_storage_root(storage_root)
    return root, storage_for(root, aws_conn_id)


def get_json_object(storage: Storage, uri: str) -> dict[str, Any]:
    """The JSON object stored at ``uri`` (``NotFound`` when there is none); ValueError naming
    the file when it holds another JSON value, so a damaged record is not read as empty."""
    data = storage.get_json(uri)
    if not isinstance(data, dict):
        raise ValueError(f"{uri} holds a JSON {type(data).__name__}, not an object; restore or delete it")
    return data


def job_env_for(root_uri: str, aws_conn_id: str | None = "aws_default") -> dict[str, str]:
    """Environment a training job needs to reach ``root_uri``: endpoint and region, never keys."""
    if not root_uri.startswith("s3://"):
        return {}
    options = _connection_options(aws_conn_id) or {}
    endpoint = (
        options.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    region = options.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    env = {}
    if endpoint:
        env["AWS_ENDPOINT_URL_S3"] = endpoint
    if region:
        env["AWS_REGION"] = region
    return env
