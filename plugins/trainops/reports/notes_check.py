"""Does the API server see the connection run notes are written through? When it does not, the
home page says so once, with the command that makes it: a rejection's reason otherwise shows
only in the gate task's log (the note is where a person looks first).

Read where the home page is served (Airflow's API server, which reads connections from its
secrets backends and database). Workers may hold the connection where the API server does not
(an environment variable only they have), so the sentence says what was looked for, and where.
"""

from __future__ import annotations

from collections.abc import Callable

ADD_CONNECTION = (
    "airflow connections add {conn_id} --conn-type http --conn-host http://<api-server>:8080 "
    "--conn-login <user> --conn-password <password>"
)


def _lookup(conn_id: str) -> object:
    from airflow.models.connection import Connection

    return Connection.get_connection_from_secrets(conn_id)


def notes_conn_id() -> str:
    """The connection notes are written through: ``[trainops] airflow_api_conn_id``, as the
    tasks read it (:func:`trainops.operators.notes.api_conn_id`)."""
    from trainops.operators.notes import api_conn_id  # noqa: PLC0415 - the REST client, only here

    return api_conn_id()


def notes_problem(conn_id: str, lookup: Callable[[str], object] = _lookup) -> str | None:
    """One sentence when connection ``conn_id`` cannot be found here; None when it can."""
    try:
        lookup(conn_id)
    except Exception:  # AirflowNotFoundException, or no secrets backend to ask
        return (
            f"Run notes (a rejection's reason, a failure's) are not written: there is no Airflow connection "
            f"{conn_id!r} here. Create it where the tasks run: {ADD_CONNECTION.format(conn_id=conn_id)} "
            "(`make airflow` makes it; `python -m trainops doctor` checks it)."
        )
    return None
