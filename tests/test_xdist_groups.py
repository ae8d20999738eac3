"""The suite's worker groups hold (tests/conftest.py, ``shared_group``).

Under ``make test`` (pytest-xdist, ``--dist loadgroup``) the tests that share a module or session
fixture must run on one worker, so the fixture is made once. xdist tells its scheduler a test's
group through a suffix of the test's id (``...::test@group``); when that side channel breaks (as
it does silently under pytest 9.2, pytest-xdist#1386) every worker makes every shared fixture
again and the suite runs minutes longer, with nothing failing. These tests fail instead.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import shared_group

_MADE: list[int] = []


@pytest.fixture(scope="module")
def made_once() -> list[int]:
    _MADE.append(os.getpid())
    return _MADE


@pytest.mark.parametrize("index", range(3))
def test_tests_that_share_a_module_fixture_run_on_one_worker(made_once, index, request):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert request.node.nodeid.endswith(f"@{__name__.replace('.', '/')}.py"), (
            f"{request.node.nodeid} carries no worker group: xdist's loadgroup is not grouping "
            "(see pyproject.toml on the pytest pin)"
        )
    assert made_once == [os.getpid()]  # made once, in this process


def test_a_test_without_a_shared_fixture_has_no_group(request):
    assert shared_group(request.node) is None
    assert "@" not in request.node.nodeid
