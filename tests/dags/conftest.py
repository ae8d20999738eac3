"""Shared by the DAG tests: storage and local cluster state in the test's own folder."""

import pytest


@pytest.fixture
def storage(tmp_path, monkeypatch):
    """The storage root (``file://``) the DAG's tasks write to; the local cluster's state beside it."""
    root = f"file://{tmp_path}/storage"
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", root)
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    return root
