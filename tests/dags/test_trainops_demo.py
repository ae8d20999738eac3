"""trainops_demo's params: the defaults are what `make demo` trains with, the seed reaches the
trainer as an integer, and a bad value is refused by name before anything runs.

The demo's runs themselves are in tests/e2e/test_demo_dag.py."""

from __future__ import annotations

import os

import pytest

from trainops.cli.main import DEMO_DAG, load_dag


@pytest.fixture
def dag(storage):
    return load_dag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"], DEMO_DAG)


@pytest.fixture
def server_params(dag):
    """The DAG's params as the API server holds them (what a trigger is validated against)."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).params


def validate(params, conf):
    """What a trigger (``POST /api/v2/dags/{id}/dagRuns``, ``dag.test(run_conf=...)``,
    ``airflow dags test -c``) does with the conf before creating the run."""
    return params.deep_merge(conf).validate()


def test_the_defaults_are_what_make_demo_trains_with(server_params):
    from trainer.config import Config

    assert validate(server_params, None) == {
        "corrupt_data": False,
        "max_eval_loss": 3.5,
        "preempt": True,
        "seed": 1234,
    }
    assert Config().seed == 1234  # the trainer's default: the demo's models did not change
    assert validate(server_params, {"seed": 2})["seed"] == 2


def test_every_param_has_a_title_and_a_description_for_the_trigger_form(dag):
    for name, param in dag.params.items():
        assert param.schema.get("title") and param.description, name
    assert dag.params.get_param("seed").schema == {
        "type": "integer",
        "minimum": 0,
        "maximum": 2**32 - 1,
        "title": "Training seed",
    }


@pytest.mark.parametrize("seed", [2, 0, 1234])
def test_the_seed_reaches_the_trainer_as_an_integer(dag, seed):
    from trainops.operators.launch_plan import checked_run_config

    train = dag.get_task("train")
    rendered = train.render_template(train.trainer_config, {"params": {"seed": seed}})
    assert rendered["seed"] == seed and type(rendered["seed"]) is int
    config = checked_run_config(rendered, run_uri="file:///run", data_uri="file:///data", world_size=2)
    assert config.seed == seed
    # The rest renders to what it was (the DAG renders templates as native objects).
    assert {k: v for k, v in rendered.items() if k != "seed"} == {
        k: v for k, v in train.trainer_config.items() if k != "seed"
    }


@pytest.mark.parametrize(
    "value, why",
    [
        (-1, "-1 is less than the minimum of 0"),
        ("2", "'2' is not of type 'integer'"),
        (2.5, "2.5 is not of type 'integer'"),
        (None, "None is not of type 'integer'"),
        (2**32, "4294967296 is greater than the maximum of 4294967295"),
    ],
)
def test_a_bad_seed_is_refused_naming_the_field(server_params, value, why):
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"Invalid input for param seed: {why}"):
        validate(server_params, {"seed": value})


def test_a_bad_seed_in_the_conf_fails_the_trigger_before_anything_runs(dag, airflow_db, tmp_path):
    from airflow.exceptions import ParamValidationError
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        runs_before = session.query(DagRun).filter_by(dag_id=DEMO_DAG).count()
    refused = "Invalid input for param seed: -1 is less than the minimum of 0"
    with pytest.raises(ParamValidationError, match=refused):
        dag.test(run_conf={"seed": -1})
    with create_session() as session:
        assert session.query(DagRun).filter_by(dag_id=DEMO_DAG).count() == runs_before  # no run
    assert not (tmp_path / "storage").exists()  # no data written, nothing staged or trained
    assert not (tmp_path / "local").exists()  # no local job
