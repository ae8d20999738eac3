"""The embedded default environment: everything inside the checkout, nothing overridden."""

from __future__ import annotations

import json
import os

import pytest

from trainops.cli.devenv import apply_dev_env, checkout_dir, dev_env, storage_root_choice


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


@pytest.fixture
def a_checkout(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    (checkout / "dags").mkdir(parents=True)
    (checkout / "plugins" / "trainops").mkdir(parents=True)
    for key in dev_env(checkout):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(checkout)
    return checkout


def test_one_rule_decides_the_storage_root_and_says_where_it_comes_from(a_checkout, monkeypatch):
    embedded = f"file://{a_checkout / '.trainops' / 'storage'}"
    assert checkout_dir() == a_checkout
    source = f"the embedded default of the checkout {a_checkout}"
    assert storage_root_choice(None, apply=False) == (embedded, source)
    assert "TRAINOPS_STORAGE_ROOT" not in os.environ  # only described, for --help
    assert storage_root_choice("s3://b/p/") == ("s3://b/p", "from --storage-root")
    assert storage_root_choice(None) == (embedded, source)
    assert os.environ["AIRFLOW_HOME"] == str(a_checkout / ".airflow")  # applied, as demo does
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", "s3://mine/x")
    assert storage_root_choice(None) == ("s3://mine/x", "from $TRAINOPS_STORAGE_ROOT")
    with pytest.raises(ValueError, match="'relative/path' is not a storage URI"):
        storage_root_choice("relative/path")


def test_outside_a_checkout_the_root_is_airflows_default(tmp_path, monkeypatch):
    import trainops.cli.devenv as devenv

    monkeypatch.delenv("TRAINOPS_STORAGE_ROOT", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(devenv, "checkout_dir", lambda cwd=None: None)
    assert storage_root_choice(None) == (
        f"file://{tmp_path / 'airflow' / 'trainops-storage'}",
        "Airflow's default, $AIRFLOW_HOME/trainops-storage",
    )


def test_make_airflow_gets_the_notes_connection_with_the_servers_own_password(tmp_path, monkeypatch):
    """The API server (airflow standalone) reads its admin password from the passwords file;
    the connection notes use carries the same one, made first when there is none."""
    from trainops.cli.devenv import API_CONN_ENV, PASSWORDS_FILE, airflow_api_env

    monkeypatch.delenv(API_CONN_ENV, raising=False)
    added, password = airflow_api_env(tmp_path)
    stored = json.loads((tmp_path / PASSWORDS_FILE).read_text())
    assert stored == {"admin": password} and len(password) >= 12
    assert oct((tmp_path / PASSWORDS_FILE).stat().st_mode & 0o777) == "0o600"
    conn = json.loads(added[API_CONN_ENV])
    assert conn == {
        "conn_type": "http",
        "host": "http://localhost:8080",
        "login": "admin",
        "password": password,
    }
    # the next start keeps the password the server already has
    assert airflow_api_env(tmp_path) == (added, password)
    # a connection the user set is theirs
    monkeypatch.setenv(API_CONN_ENV, '{"conn_type": "http", "host": "http://airflow:8080"}')
    assert airflow_api_env(tmp_path)[0] == {}
