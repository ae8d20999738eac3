"""The recent runs of the trainops DAGs, from Airflow's metadata database (the report app runs
in the API server, which has it): each run's state, times, note and the task that failed.

A DAG is a trainops DAG when one of its task instances ran one of the trainops operators
(:data:`trainops.runs.dag_runs.OPERATORS`, by the ``operator`` column). Three queries, bounded
by ``limit`` runs; no DAG file is parsed.
"""

from __future__ import annotations

from collections.abc import Callable

from trainops.runs.dag_runs import OPERATORS, DagRunInfo

DEFAULT_LIMIT = 30


def recent_dag_runs(
    limit: int = DEFAULT_LIMIT, may_read: Callable[[str], bool] = lambda dag: True
) -> list[DagRunInfo]:
    """The newest ``limit`` runs of the trainops DAGs ``may_read`` allows, newest first."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select  # noqa: PLC0415

    with create_session() as session:
        dag_ids = [
            d
            for d in session.scalars(
                select(TaskInstance.dag_id).where(TaskInstance.operator.in_(OPERATORS)).distinct()
            ).all()
            if may_read(d)
        ]
        if not dag_ids:
            return []
        found = session.scalars(
            select(DagRun).where(DagRun.dag_id.in_(dag_ids)).order_by(DagRun.id.desc()).limit(limit)
        ).all()
        runs = [(r.dag_id, r.run_id, str(r.state), r.start_date, r.end_date, r.note) for r in found]
        failed: dict[tuple[str, str], str] = {}
        if runs:
            rows = session.execute(
                select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.end_date)
                .where(TaskInstance.dag_id.in_(dag_ids))
                .where(TaskInstance.run_id.in_([r[1] for r in runs]))
                .where(TaskInstance.state == "failed")
                .order_by(TaskInstance.end_date)
            ).all()
            for dag_id, run_id, task_id, _end in rows:
                failed.setdefault((dag_id, run_id), task_id)
    return [
        DagRunInfo(
            dag_id=dag_id,
            run_id=run_id,
            state=state.removeprefix("DagRunState.").lower(),
            start=start,
            end=end,
            failed_task=failed.get((dag_id, run_id)),
            note=note,
        )
        for dag_id, run_id, state, start, end, note in runs
    ]
