"""The runs of the trainops DAGs as Airflow's database has them, read after a real dag.test():
a run that failed on its input, with the task that failed and the note it left (written by
fail_fast through the database, as under ``dag.test()``)."""

import uuid

import pytest

from tests.bundles import use_dag_folder
from trainops.reports.dag_runs_db import recent_dag_runs
from trainops.runs.dag_runs import dag_run_outcome

_DAG_FILE = """
import pendulum
from airflow.sdk import DAG
from trainops.operators.gate import EvaluationGateOperator

with DAG({dag_id!r}, schedule=None, catchup=False, render_template_as_native_obj=True,
         params={{"checks": [{{"kind": "thresold", "metric": "eval_loss", "value": 1}}]}},
         start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
    EvaluationGateOperator(task_id="gate", evaluation={{"candidate": {{"eval_loss": 1.0}}}},
                           checks="{{{{ params.checks }}}}", storage_root={root!r}, aws_conn_id=None)
"""


@pytest.mark.slow
def test_a_run_that_failed_on_a_setting_is_read_with_its_task_and_reason(
    airflow_db, file_root, tmp_path, monkeypatch
):
    from trainops.cli.main import load_dag

    dag_id = f"gate_fails_{uuid.uuid4().hex[:10]}"  # the metadata DB outlives this test run
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / f"{dag_id}.py").write_text(_DAG_FILE.format(dag_id=dag_id, root=file_root))
    use_dag_folder(monkeypatch, folder, "dag-runs-test")
    dagrun = load_dag(str(folder), dag_id).test()
    assert str(dagrun.state).endswith("failed")
    (mine,) = [r for r in recent_dag_runs(limit=200) if r.dag_id == dag_id]
    assert (mine.state, mine.failed_task) == ("failed", "gate")
    assert mine.note.startswith("FAILED at gate: ") and "thresold" in mine.note
    found = dag_run_outcome(mine, None)
    assert found.kind == "failed" and found.text.startswith("failed at gate: ") and "thresold" in found.text
    # a DAG the reader may not see is left out
    assert not [r for r in recent_dag_runs(limit=200, may_read=lambda d: d != dag_id) if r.dag_id == dag_id]
