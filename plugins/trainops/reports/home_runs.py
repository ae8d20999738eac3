"""The home page's runs, one per DAG run: Airflow's recent runs of the trainops DAGs
(:mod:`.dag_runs_db`) joined with what storage holds of each one's training
(:func:`trainops.runs.facts.read_facts`, under the served roots), newest first. A database that
cannot be read is one sentence on the page, never an error."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from trainer.contract import run_prefix
from trainer.storage import Storage
from trainops.hooks.storage import storage_for
from trainops.reports.dag_runs_db import DEFAULT_LIMIT, recent_dag_runs
from trainops.reports.home import HomeRun
from trainops.runs.dag_runs import DagRunRow, rows
from trainops.runs.facts import read_facts
from trainops.runs.outcome import RunFacts
from trainops.runs.refs import RunRef

log = logging.getLogger(__name__)


def _known_runs(runs: Sequence[HomeRun]) -> dict[tuple[str, str], tuple[str, str, str]]:
    """(dag_id, Airflow run id) -> (the training's run URI, the root it was found under, its
    task id)."""
    out = {}
    for entry in runs:
        job = entry["run"]["job"] or {}
        airflow = job.get("airflow")
        run_id = airflow.get("run_id") if isinstance(airflow, dict) else None
        run_uri = job.get("run_uri")
        if isinstance(run_id, str) and isinstance(run_uri, str):
            root = entry["run"]["uri"].rsplit("/", 5)[0]  # <root>/runs/<dag>/<run>/<task>/job.json
            out[(entry["run"]["dag_id"], run_id)] = (run_uri, root, entry["run"]["task_id"])
    return out


def dag_run_rows(
    roots: Sequence[str],
    conn_id: str | None,
    *,
    may_read: Callable[[str], bool],
    known: Sequence[HomeRun] = (),
    now: float,
    limit: int = DEFAULT_LIMIT,
    read_runs: Callable[..., list] = recent_dag_runs,
) -> tuple[list[DagRunRow], str | None]:
    """``(rows, problem)``: a row per recent DAG run; ``problem`` says why there are none when
    Airflow's database could not be read."""
    try:
        infos = read_runs(limit=limit, may_read=may_read)
    except Exception as exc:  # no database here, or it is down: the rest of the page still shows
        log.warning("could not read the DAG runs from Airflow's database", exc_info=True)
        return [], f"The DAG runs could not be read from Airflow's database: {type(exc).__name__}."
    found = _known_runs(known)
    facts: dict[tuple[str, str], RunFacts] = {}
    clients: dict[str, Storage] = {}

    def client(root: str) -> Storage:
        """The root's storage client, made once (each making looks the connection up)."""
        if root not in clients:
            clients[root] = storage_for(root, conn_id)
        return clients[root]

    for info in infos:
        key = (info.dag_id, info.run_id)
        places = (
            [found[key]]
            if key in found
            else [(run_prefix(r, info.dag_id, info.run_id, "train"), r, "train") for r in roots]
        )
        for run_uri, root, task in places:
            try:
                f = read_facts(
                    client(root),
                    RunRef(run_uri, info.dag_id, info.run_id, task, root),
                    now=now,
                )
            except Exception:  # a damaged or unreadable record: the row says what Airflow knows
                log.warning("could not read the training of %s %s", info.dag_id, info.run_id, exc_info=True)
                continue
            if not f.problem:
                facts[key] = f
                break
    return rows(infos, facts), None
