"""Default locations and validation of storage roots."""

from __future__ import annotations

import pathlib

import pytest

from trainops.settings import default_storage_root, local_state_dir, resolve_storage_root


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in ("TRAINOPS_STORAGE_ROOT", "TRAINOPS_LOCAL_STATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))


def test_defaults_live_under_airflow_home(tmp_path):
    assert default_storage_root() == f"file://{tmp_path}/airflow/trainops-storage"
    assert local_state_dir() == tmp_path / "airflow" / "trainops-local"
    assert not (tmp_path / "airflow").exists()


def test_without_airflow_home_defaults_to_home_airflow(monkeypatch, tmp_path):
    monkeypatch.delenv("AIRFLOW_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_storage_root() == f"file://{tmp_path}/home/airflow/trainops-storage"
    assert local_state_dir() == tmp_path / "home" / "airflow" / "trainops-local"


def test_environment_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", "s3://models-bucket/trainops/")
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "state"))
    assert default_storage_root() == "s3://models-bucket/trainops"
    assert local_state_dir() == pathlib.Path(tmp_path / "state")


def test_invalid_environment_root_is_named(monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", "gs://bucket/x")
    with pytest.raises(ValueError, match=r"TRAINOPS_STORAGE_ROOT 'gs://bucket/x'.*s3://bucket"):
        default_storage_root()


def test_resolve_normalises_and_falls_back(tmp_path):
    assert resolve_storage_root("s3://b/root///") == "s3://b/root"
    assert resolve_storage_root("file:///data/trainops/") == "file:///data/trainops"
    assert resolve_storage_root("s3://b") == "s3://b"
    assert resolve_storage_root(None) == f"file://{tmp_path}/airflow/trainops-storage"
    assert resolve_storage_root("") == f"file://{tmp_path}/airflow/trainops-storage"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("file://data/root", r"'file://data/root' is a relative file:// path.*absolute"),
        ("s3:///prefix", r"'s3:///prefix' has no bucket"),
        ("/data/root", r"'/data/root' is not a storage URI.*file:///abs/path"),
        ("gs://b/x", r"'gs://b/x' is not a storage URI"),
    ],
)
def test_resolve_rejects_bad_roots(value, message):
    with pytest.raises(ValueError, match=message):
        resolve_storage_root(value)
