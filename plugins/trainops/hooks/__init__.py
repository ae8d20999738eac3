"""Airflow connections -> clients: the storage client for ``file://`` and ``s3://``."""
