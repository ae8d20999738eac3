"""retrain_manual: its form refuses bad values by name, and a dry run launches nothing.

The settings, plan, sources and dry run it is made of are tested in tests/trainops/recipes/."""

from __future__ import annotations

import os

import pytest

from trainops.cli.main import load_dag, xcom_results

DAG_ID = "retrain_manual"


@pytest.fixture
def server_params(storage):
    """The DAG's params as the API server holds them (what a trigger is validated against)."""
    from airflow.serialization.serialized_objects import DagSerialization

    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DAG_ID)
    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).params


def validate(params, conf):
    """What ``POST /api/v2/dags/{id}/dagRuns`` does with the conf before creating the run."""
    return params.deep_merge(conf).validate()


def test_every_default_is_valid_and_runs_on_the_embedded_default(server_params, storage):
    values = validate(server_params, None)
    assert values == {
        "dataset_uri": f"{storage}/raw/demo-text",
        "model_preset": "tiny",
        "hf_model": "",
        "task": "causal_lm",
        "nodes": 1,
        "gpus_per_node": 0,
        "capacity": "spot",
        "max_preemptions": 3,
        "restarts_in_place": 2,
        "lr": 0.003,
        "max_steps": 60,
        "warm_start": "auto",
        "dry_run": False,
    }
    assert validate(
        server_params,
        {
            "dataset_uri": "s3://raw/tickets/2026-*/*.parquet",
            "model_preset": "1b",
            "nodes": 4,
            "gpus_per_node": 8,
            "capacity": "spot-then-on-demand",
            "lr": 1e-4,
        },
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("dataset_uri", "raw/tickets"),  # not a URI
        ("dataset_uri", "file://relative/path"),
        ("model_preset", "huge"),
        ("hf_model", "hf.co/Qwen/Qwen2-0.5B"),  # a hub name: trainops reads folders, never the hub
        ("nodes", 0),
        ("nodes", "2"),  # a string, not a number
        ("gpus_per_node", 17),
        ("capacity", "cheapest"),
        ("max_preemptions", -1),
        ("restarts_in_place", 11),  # past a few, a relaunch elsewhere serves better
        ("restarts_in_place", -1),
        ("lr", 0),
        ("lr", 2.0),
        ("max_steps", 0),
        ("dry_run", "yes"),
        ("warm_start", "latest"),  # not a word init.from knows
        ("warm_start", "https://hf.co/model"),  # not file:// or s3://
    ],
)
def test_a_bad_value_is_refused_naming_the_field(server_params, field, value):
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"Invalid input for param {field}:"):
        validate(server_params, {field: value})


@pytest.mark.slow
def test_a_dry_run_renders_the_job_and_launches_nothing(airflow_db, storage, tmp_path, capfd):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from trainer.storage import open_storage

    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DAG_ID)
    dagrun = dag.test(
        run_conf={
            "dry_run": True,
            "nodes": 2,
            "gpus_per_node": 8,
            "capacity": "spot-then-on-demand",
            "restarts_in_place": 0,
            "max_steps": 500,
        }
    )
    assert str(dagrun.state).endswith("success")
    with create_session() as session:
        states = {
            ti.task_id: str(ti.state).rsplit(".", 1)[-1].lower()
            for ti in session.query(TaskInstance).filter_by(dag_id=DAG_ID, run_id=dagrun.run_id)
        }
    assert states.pop("dry_run") == "success"
    assert (states.pop("plan"), states.pop("launch_or_dry_run")) == ("success", "success")
    assert set(states.values()) == {"skipped"}, states

    report = xcom_results(DAG_ID, dagrun.run_id, ["dry_run"])["dry_run"]
    assert report["trainer_config"]["train"]["max_steps"] == 500
    assert report["job_spec"]["nodes"] == 2 and report["job_spec"]["gpus_per_node"] == 8
    assert report["job_spec"]["capacity"] == "spot-then-on-demand"
    job = next(m for m in report["manifests"] if m["kind"] == "Job")
    assert job["spec"]["completions"] == 2
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # The form's restarts in place reach torchrun: 0 relaunches the gang on every failure.
    assert report["restarts_in_place"] == report["job_spec"]["restarts_in_place"] == 0
    assert "--max-restarts=0" in container["command"] + container.get("args", [])
    out = capfd.readouterr()
    assert "DRY RUN on cluster 'local': nothing is staged or launched." in out.out + out.err
    assert "kind: Job" in out.out + out.err
    # The cost estimate: no earlier run, so the tiny preset's FLOPs on 16 GPUs of no known type.
    estimate = report["estimate"]
    assert (estimate["steps"], estimate["accelerators"], estimate["step_time_source"]) == (
        500,
        16,
        "preset FLOPs",
    )
    assert estimate["on_demand_cost"] == pytest.approx(
        estimate["gpu_hours"] * 4.0
    )  # the default per GPU-hour
    printed = out.out + out.err
    assert "COST ESTIMATE (before launch; every figure is an estimate, in USD):" in printed
    assert (
        "  500 steps x 5.3e-05 s/step (preset FLOPs) = 0.0267 s on 16 accelerators (instance type unknown)"
        in printed
    )
    assert (
        "peak FLOP/s unknown for GPU nodes of unknown instance type: assumed an A100's 312 TFLOP/s bf16"
        in printed
    )
    assert "capacity spot-then-on-demand" in printed

    # Nothing was staged, trained or written, and no job was started.
    assert open_storage(storage).list(storage) == []
    assert not (tmp_path / "local" / "jobs").exists()


@pytest.mark.slow
def test_a_misspelt_setting_fails_plan_once_without_retry(airflow_db, storage, capfd):
    """A retry cannot fix a typo: plan fails on its first try, whatever its retries, with the hint."""
    from datetime import timedelta

    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    dag = load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DAG_ID)
    plan = dag.get_task("plan")
    plan.retries, plan.retry_delay = 2, timedelta(0)  # would retry at once, were it retryable
    dagrun = dag.test(run_conf={"max_step": 10})

    assert str(dagrun.state).endswith("failed")
    with create_session() as session:
        tis = {
            ti.task_id: ti
            for ti in session.query(TaskInstance).filter_by(dag_id=DAG_ID, run_id=dagrun.run_id)
        }
        failed_plan = (str(tis["plan"].state).rsplit(".", 1)[-1].lower(), tis["plan"].try_number)
        downstream = {str(tis[t].state).rsplit(".", 1)[-1].lower() for t in ("source", "stage", "train")}
    assert failed_plan == ("failed", 1)
    assert downstream == {"upstream_failed"}
    out = capfd.readouterr()
    printed = out.out + out.err
    assert "unknown setting(s) 'max_step' (did you mean 'max_steps'?)" in printed
    assert "SettingsError: not retried" in printed
