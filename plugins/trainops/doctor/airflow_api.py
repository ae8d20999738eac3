"""Can run notes reach Airflow's REST API? The connection they use
(``[trainops] airflow_api_conn_id``, default ``trainops_airflow_api``), asked for a token and
one read, as :mod:`trainops.operators.notes` would. Imports Airflow (to read the connection)
only when called."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from trainops.doctor import checks
from trainops.doctor.checks import Check

TIMEOUT_S = 5.0
ADD_CONNECTION = (
    "airflow connections add {conn_id} --conn-type http --conn-host http://<api-server>:8080 "
    "--conn-login <user> --conn-password <password> (docs/deploying.md, 'Connections')"
)


def _connection(conn_id: str) -> Any:
    from airflow.sdk import BaseHook  # noqa: PLC0415 - the doctor's command line has no Airflow until here

    return BaseHook.get_connection(conn_id)


def api_check(
    conn_id: str,
    *,
    get_connection: Callable[[str], Any] = _connection,
    transport: Any = None,
) -> Check:
    """``airflow api``: the connection exists, a token is issued for it (or its extra's token is
    used), and a read with that token answers 200."""
    from trainops.operators.notes import _base_url  # noqa: PLC0415 - imports Airflow: only for this check

    name = "airflow api"
    try:
        conn = get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException, or no Airflow configured at all
        return Check(
            name,
            checks.FAIL,
            f"no Airflow connection {conn_id!r} ({type(exc).__name__}): a run's note (its outcome) is not written",
            ADD_CONNECTION.format(conn_id=conn_id),
        )
    try:
        base = _base_url(conn)
    except ValueError as exc:
        return Check(name, checks.FAIL, str(exc), ADD_CONNECTION.format(conn_id=conn_id))
    token = (conn.extra_dejson or {}).get("token")
    try:
        with httpx.Client(base_url=base, timeout=TIMEOUT_S, transport=transport) as client:
            if not token:
                reply = client.post("/auth/token", json={"username": conn.login, "password": conn.password})
                try:
                    token = reply.json().get("access_token") if reply.status_code in (200, 201) else None
                except (ValueError, AttributeError):  # an HTML page: a proxy, or the UI's host
                    token = None
                if not token:
                    return Check(
                        name,
                        checks.FAIL,
                        f"{base}: POST /auth/token answered {reply.status_code}, no token",
                        f"check the login and password of connection {conn_id!r}",
                    )
            reply = client.get(
                "/api/v2/dags", params={"limit": 1}, headers={"Authorization": f"Bearer {token}"}
            )
    except httpx.HTTPError as exc:
        return Check(
            name,
            checks.FAIL,
            f"{base}: {type(exc).__name__}",
            f"set connection {conn_id!r}'s host to the API server's URL, reachable from the workers",
        )
    if reply.status_code != 200:
        return Check(
            name,
            checks.FAIL,
            f"{base}: GET /api/v2/dags answered {reply.status_code}",
            "the user needs to read DAGs and edit DAG runs and task instances",
        )
    return Check(name, checks.PASS, f"{base} answers connection {conn_id!r} with a token")
