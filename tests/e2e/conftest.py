"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.e2e.demo_run import FirstRun, make_first_run


@pytest.fixture(scope="session")
def demo_first_run(tmp_path_factory, request, airflow_db) -> FirstRun:
    """The demo DAG's first run (a promoted v1), made once and shared (tests/e2e/demo_run.py).
    A test that uses it points ``TRAINOPS_STORAGE_ROOT`` and ``TRAINOPS_LOCAL_STATE`` at it."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    return make_first_run(tmp_path_factory.mktemp("demo-first-run"), capture)
