"""The embedded default environment: everything inside the checkout, nothing overridden."""

from __future__ import annotations

import os

from trainops.cli.devenv import apply_dev_env, dev_env


def test_the_defaults_keep_airflow_and_storage_inside_the_checkout(tmp_path):
    env = dev_env(tmp_path)
    assert env["AIRFLOW_HOME"] == str(tmp_path / ".airflow")
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(tmp_path / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(tmp_path / "plugins")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path / '.airflow' / 'airflow.db'}"
    assert env["TRAINOPS_STORAGE_ROOT"] == f"file://{tmp_path / '.trainops' / 'storage'}"
    assert env["TRAINOPS_LOCAL_STATE"] == str(tmp_path / ".trainops" / "local")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"


def test_a_relative_project_dir_is_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert dev_env(".")["AIRFLOW_HOME"] == str(tmp_path.resolve() / ".airflow")


def test_applying_sets_only_what_is_unset_and_creates_airflow_home(tmp_path, monkeypatch):
    for key in dev_env(tmp_path):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", "s3://bucket/mine")
    effective = apply_dev_env(tmp_path)
    assert effective["TRAINOPS_STORAGE_ROOT"] == "s3://bucket/mine"
    assert os.environ["TRAINOPS_STORAGE_ROOT"] == "s3://bucket/mine"
    assert os.environ["AIRFLOW_HOME"] == effective["AIRFLOW_HOME"] == str(tmp_path / ".airflow")
    assert (tmp_path / ".airflow").is_dir()
