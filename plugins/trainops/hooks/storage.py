"""Storage clients built from Airflow connections, and the storage environment for jobs.

On the Airflow side S3 credentials come from an Airflow ``aws`` connection (the same
fields and extras the Amazon provider reads). Training jobs never receive keys: they get
the endpoint (without any ``user:password@`` in its URL, dropped with a warning) and region
only, and use their own identity (IRSA, a Secret by reference, instance profile).

Outage tolerance: how long one ``s3://`` request keeps retrying throttling, 5xx, resets and
timeouts before it fails with ``StorageUnavailable`` (``trainer.storage``). The trainer's
default, five minutes, would hold a worker slot that long on every request of an outage, so the
Airflow side has its own: ``[trainops] storage_outage_tolerance`` (seconds, default
:data:`DEFAULT_OUTAGE_TOLERANCE_S`) for the operators and the registry; the trigger's progress
lines and the report app pass shorter ones of their own. The training pods get
``$TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S`` from :func:`job_env_for` when the deployment sets it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from trainer.storage import OUTAGE_TOLERANCE_ENV, Storage, StorageError, open_storage, outage_tolerance
from trainops.cluster.credentials import without_userinfo
from trainops.settings import resolve_storage_root

__all__ = [
    "DEFAULT_OUTAGE_TOLERANCE_S",
    "airflow_outage_tolerance",
    "get_json_object",
    "job_env_for",
    "root_and_storage",
    "storage_for",
]

log = logging.getLogger(__name__)

# Two minutes: throttling storms and blips of a minute or two (the 90 s outage that once failed
# training among them) pass without failing a task, and no request holds a worker slot for the
# trainer's five minutes. A longer outage fails the task, and Airflow's retries take over.
DEFAULT_OUTAGE_TOLERANCE_S = 120.0

_fallback_logged: set[str] = set()
_userinfo_logged: set[str] = set()
_fallback_lock = threading.Lock()


def _first_time(key: str, seen: set[str]) -> bool:
    """Whether ``key`` is new to ``seen`` (and now in it): what is said once per process."""
    with _fallback_lock:
        first = key not in seen
        seen.add(key)
    return first


def _connection_options(aws_conn_id: str | None) -> dict | None:
    """Storage options from the Airflow connection, or None when there is no such connection."""
    if not aws_conn_id:
        return None
    # Airflow is imported here, not at the top: the command line (rollback, cost) uses this
    # module without Airflow (2 s, and its configuration, which the demo sets up first).
    from airflow.sdk import BaseHook  # noqa: PLC0415
    from airflow.sdk.exceptions import AirflowNotFoundException  # noqa: PLC0415

    try:
        conn = BaseHook.get_connection(aws_conn_id)
    except AirflowNotFoundException:
        if _first_time(aws_conn_id, _fallback_logged):
            log.info(
                "Airflow connection %r is not defined; S3 access uses boto3's default "
                "credential chain (environment, IRSA, instance profile)",
                aws_conn_id,
            )
        return None
    extra = conn.extra_dejson or {}
    s3_config = (extra.get("service_config") or {}).get("s3") or {}
    endpoint = extra.get("endpoint_url") or s3_config.get("endpoint_url") or None
    return {
        "endpoint_url": endpoint and _without_userinfo(endpoint, f"Airflow connection {aws_conn_id!r}"),
        "region": extra.get("region_name") or None,
        "aws_access_key_id": conn.login or extra.get("aws_access_key_id") or None,
        "aws_secret_access_key": conn.password or extra.get("aws_secret_access_key") or None,
        "aws_session_token": extra.get("aws_session_token") or None,
    }


def _without_userinfo(endpoint: str, source: str) -> str:
    """``endpoint`` without its userinfo (``user:password@``), saying once per ``source`` in the
    log that it was dropped (never what it was): S3 signs requests with keys, so a URL's
    userinfo is no credential boto3 uses, only one that would travel into the jobs' environment,
    the storage client's repr and the messages that name the endpoint."""
    stripped, dropped = without_userinfo(endpoint)
    if dropped and _first_time(source, _userinfo_logged):
        log.warning(
            "the S3 endpoint of %s has userinfo (user:password@) in its URL: dropped, the endpoint "
            "used is %s. Credentials never travel in the endpoint: the Airflow side takes them from "
            "the connection's login and password (or its extras), the training jobs from a Secret "
            "(job_options env_from_secrets) or their service account (IRSA, workload identity)",
            source,
            stripped,
        )
    return stripped


def airflow_outage_tolerance() -> float:
    """``[trainops] storage_outage_tolerance`` (``AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE``):
    seconds, default :data:`DEFAULT_OUTAGE_TOLERANCE_S`; ValueError naming the setting when it
    is not a number of seconds >= 0."""
    from airflow.configuration import conf  # noqa: PLC0415 - as in _connection_options: no Airflow for the CLI

    raw = conf.get("trainops", "storage_outage_tolerance", fallback=None)
    if raw is None or not str(raw).strip():
        return DEFAULT_OUTAGE_TOLERANCE_S
    try:
        return outage_tolerance(float(raw))
    except (ValueError, StorageError):
        raise ValueError(
            f"[trainops] storage_outage_tolerance is {raw!r}, not a number of seconds >= 0: set it "
            f"(or AIRFLOW__TRAINOPS__STORAGE_OUTAGE_TOLERANCE) to e.g. {DEFAULT_OUTAGE_TOLERANCE_S:.0f}, "
            "or unset it for the default"
        ) from None


def storage_for(
    root_uri: str, aws_conn_id: str | None = "aws_default", *, outage_tolerance_s: float | None = None
) -> Storage:
    """The storage client for ``root_uri``, using ``aws_conn_id`` for ``s3://`` when it exists.

    :param root_uri: ``file:///abs/path`` or ``s3://bucket/prefix``.
    :param aws_conn_id: Airflow AWS connection; when it is unset or not defined, boto3's
        default credential chain is used.
    :param outage_tolerance_s: how long an ``s3://`` request rides out an outage (see the
        module docstring); None: ``[trainops] storage_outage_tolerance``.
    """
    if not root_uri.startswith("s3://"):
        return open_storage(root_uri)
    tolerance = airflow_outage_tolerance() if outage_tolerance_s is None else outage_tolerance_s
    options = _connection_options(aws_conn_id) or {}
    return open_storage(root_uri, **options, outage_tolerance_s=tolerance)


def root_and_storage(
    storage_root: str | None, aws_conn_id: str | None = "aws_default"
) -> tuple[str, Storage]:
    """An operator's storage: its ``storage_root`` (or the default root) and a client for it."""
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
    """Environment a training job needs to reach ``root_uri``: endpoint and region, never keys
    (nor the endpoint's userinfo, :func:`_without_userinfo`); and
    ``$TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S`` when the deployment sets it (checked here, so a
    bad value fails before anything launches)."""
    if not root_uri.startswith("s3://"):
        return {}
    tolerance = _job_outage_tolerance()
    options = _connection_options(aws_conn_id) or {}
    endpoint = options.get("endpoint_url")
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if not endpoint and os.environ.get(name):
            endpoint = _without_userinfo(os.environ[name], f"${name}")
    region = options.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    env = {}
    if endpoint:
        env["AWS_ENDPOINT_URL_S3"] = endpoint
    if region:
        env["AWS_REGION"] = region
    if tolerance is not None:
        env[OUTAGE_TOLERANCE_ENV] = tolerance
    return env


def _job_outage_tolerance() -> str | None:
    """``$TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S`` as set, once checked; None when unset."""
    raw = os.environ.get(OUTAGE_TOLERANCE_ENV, "").strip()
    if not raw:
        return None
    try:
        outage_tolerance()
    except StorageError as exc:
        raise ValueError(str(exc)) from None
    return raw
