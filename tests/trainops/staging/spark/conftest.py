"""Fixtures for the Spark staging tests."""

from tests.trainops.staging.spark.session_fixture import spark

__all__ = ["spark"]
