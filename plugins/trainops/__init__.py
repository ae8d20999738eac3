"""trainops: Airflow operators that retrain models on spot GPUs and promote only better ones.

This package is the Airflow side. It never imports torch; from the trainer it imports only the
run contract (``trainer.contract``), the storage client (``trainer.storage``) and the config
schema (``trainer.config``), all free of torch and Airflow.
"""

__version__ = "0.1.0"
