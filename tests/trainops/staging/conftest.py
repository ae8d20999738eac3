"""Fixtures for the staging tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def raw_uri(tmp_path):
    """A ``file://`` folder for source data, beside (not inside) the storage root."""
    return f"file://{tmp_path}/raw"
