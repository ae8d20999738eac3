"""Fixtures for the staging tests."""

from __future__ import annotations

import urllib.request

import pytest


@pytest.fixture
def raw_uri(tmp_path):
    """A ``file://`` folder for source data, beside (not inside) the storage root."""
    return f"file://{tmp_path}/raw"


def _reset_auth(endpoint: str, free_actions: str) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=free_actions.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.fixture
def deny_s3(moto_server):
    """Call it to make the moto server refuse every request whose keys IAM does not know
    (moto's INITIAL_NO_AUTH_ACTION_COUNT, set over its HTTP API); undone after the test.

    moto keeps this setting per process, so it applies to the shared server: write the
    test's data first, then deny.
    """
    denied = []

    def deny() -> None:
        _reset_auth(moto_server, "0")
        denied.append(True)

    yield deny
    if denied:
        _reset_auth(moto_server, "inf")
