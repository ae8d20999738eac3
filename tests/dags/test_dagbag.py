"""The dags/ folder as Airflow loads it: no import errors, and DAGs a team can run and own."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ("retrain_scheduled", "retrain_manual", "data_team_publish", "retrain_on_new_data")
# The training task relaunches itself after preemptions (its own budget); an Airflow retry
# would only repeat a program error. Every other task of the example DAGs retries.
NO_RETRY_TASKS = {"train"}


@pytest.fixture(scope="module")
def bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_no_import_errors_and_every_example_is_there(bag):
    assert bag.import_errors == {}
    assert set(EXAMPLES) <= set(bag.dags)


@pytest.mark.parametrize("dag_id", sorted({*EXAMPLES, "trainops_demo"}))
def test_every_dag_has_an_owner_tags_and_docs(bag, dag_id):
    dag = bag.dags[dag_id]
    assert dag.owner and dag.owner != "airflow"  # Airflow's placeholder owner
    assert dag.tags
    assert dag.doc_md and len(dag.doc_md) > 200


@pytest.mark.parametrize("dag_id", EXAMPLES)
def test_retries_are_sensible(bag, dag_id):
    dag = bag.dags[dag_id]
    retries = {task.task_id: task.retries for task in dag.tasks}
    assert {t: r for t, r in retries.items() if t not in NO_RETRY_TASKS and r < 1} == {}
    for task_id in NO_RETRY_TASKS & set(retries):
        assert retries[task_id] == 0
        assert "Retries" in dag.doc_md and "max_preemptions" in dag.doc_md  # says why
    assert all(task.retry_delay.total_seconds() >= 30 for task in dag.tasks if task.retries)


def test_retrain_scheduled_runs_nightly_one_at_a_time(bag):
    dag = bag.dags["retrain_scheduled"]
    assert dag.schedule == "0 3 * * *"
    assert dag.catchup is False and dag.max_active_runs == 1
    assert {"stage", "train", "evaluate", "gate", "promote"} <= set(dag.task_ids)


def test_retrain_manual_has_no_schedule_and_the_form(bag):
    dag = bag.dags["retrain_manual"]
    assert dag.schedule is None
    assert set(dag.params) == {
        "dataset_uri",
        "model_preset",
        "hf_model",
        "task",
        "nodes",
        "gpus_per_node",
        "capacity",
        "max_preemptions",
        "restarts_in_place",
        "lr",
        "max_steps",
        "warm_start",
        "dry_run",
    }
    for key in dag.params:
        param = dag.params.get_param(key)
        schema = param.schema
        assert schema.get("title") and param.description, key
        if schema["type"] in ("integer", "number"):  # a range
            assert "maximum" in schema and ({"minimum", "exclusiveMinimum"} & set(schema)), key
        elif schema["type"] == "string":  # a fixed set, or a shape and a length
            assert "enum" in schema or {"pattern", "maxLength"} <= set(schema), key
        else:
            assert schema["type"] == "boolean", key
    assert dag.params.get_param("capacity").schema["enum"] == ["spot", "on-demand", "spot-then-on-demand"]


def test_the_data_team_asset_connects_producer_and_consumer(bag):
    producer, consumer = bag.dags["data_team_publish"], bag.dags["retrain_on_new_data"]
    outlets = [o for task in producer.tasks for o in task.outlets]
    assert [o.name for o in outlets] == ["datateam-raw-demo-text"]
    assert [a.name for a in consumer.schedule] == ["datateam-raw-demo-text"]
    assert consumer.max_active_runs == 1


def test_scheduled_plan_reads_the_variable_and_refuses_what_it_does_not_know(bag, monkeypatch):
    """The unattended DAGs' settings come from the trainops_retrain Variable (JSON)."""
    import json

    from airflow.sdk.exceptions import AirflowFailException

    from trainops.recipes.form import SettingsError

    plan = bag.dags["retrain_scheduled"].get_task("plan").python_callable
    monkeypatch.delenv("AIRFLOW_VAR_TRAINOPS_RETRAIN", raising=False)
    defaults = plan()
    assert defaults["dataset_uri"].endswith("/raw/demo-text")
    assert defaults["trainer_config"]["train"]["max_steps"] == 60
    # scheduled retraining starts from production when there is one (the operator resolves auto)
    assert defaults["trainer_config"]["init"] == {"from": "auto"}

    monkeypatch.setenv(
        "AIRFLOW_VAR_TRAINOPS_RETRAIN",
        json.dumps(
            {
                "dataset_uri": "s3://raw/tickets/2026-*/*.parquet",
                "nodes": 4,
                "gpus_per_node": 8,
                "capacity": "spot-then-on-demand",
                "max_steps": 20000,
                "warm_start": "none",
            }
        ),
    )
    chosen = plan()
    assert chosen["dataset_name"] == "tickets" and chosen["dry_run"] is False
    kwargs = chosen
    assert (kwargs["nodes"], kwargs["gpus_per_node"], kwargs["capacity"]) == (4, 8, "spot-then-on-demand")
    assert kwargs["trainer_config"]["train"]["max_steps"] == 20000
    assert kwargs["trainer_config"]["init"] == {"from": "none"}

    # A bad Variable fails the same way on every try: the task fails at once, without retry.
    monkeypatch.setenv("AIRFLOW_VAR_TRAINOPS_RETRAIN", json.dumps({"dry_run": True}))
    with pytest.raises(
        AirflowFailException, match=r"Variable trainops_retrain: unknown setting.*'dry_run'"
    ) as err:
        plan()
    assert isinstance(err.value.__cause__, SettingsError)
    monkeypatch.setenv("AIRFLOW_VAR_TRAINOPS_RETRAIN", json.dumps({"nodes": 0}))
    with pytest.raises(AirflowFailException, match="Variable trainops_retrain: nodes=0 is invalid"):
        plan()
