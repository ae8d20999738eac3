"""``python -m trainops ...``: the demo, Airflow standalone, rollback and render-job commands."""
