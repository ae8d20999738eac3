"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.e2e.demo_run import FirstRun, make_first_run


@pytest.fixture(scope="session")
def demo_first_run(tmp_path_factory, airflow_db) -> FirstRun:
    """The demo's first run (a promoted v1) by ``python -m trainops demo``, made once and shared
    (tests/e2e/demo_run.py). A test that goes on from it points ``TRAINOPS_STORAGE_ROOT`` and
    ``TRAINOPS_LOCAL_STATE`` at it."""
    return make_first_run(tmp_path_factory.mktemp("demo-first-run"))


@pytest.fixture
def local_state(tmp_path, monkeypatch):
    """The local cluster's state folder inside the test's temporary directory."""
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    return tmp_path / "local"
