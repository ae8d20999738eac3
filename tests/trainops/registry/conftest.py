"""Fixtures for the registry tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["file", "s3"])
def root(request):
    """A fresh storage root, once on ``file://`` and once on moto's S3 server over HTTP."""
    return request.getfixturevalue(f"{request.param}_root")
