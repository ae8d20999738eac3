"""Provider metadata, published through the ``apache_airflow_provider`` entry point.

trainops invents no connection type: it uses Airflow's ``aws`` and ``kubernetes`` ones. The
plugin is published by the ``airflow.plugins`` entry point only: listing it here as well would
register it twice.
"""

from __future__ import annotations


def get_provider_info() -> dict:
    from trainops import __version__

    return {
        "package-name": "trainops",
        "name": "trainops",
        "description": "Retrain models on schedule on spot GPUs: stage and validate data, "
                       "train with FSDP under torchrun, checkpoint to S3, evaluate, promote.",
        "versions": [__version__],
        "operators": [{
            "integration-name": "trainops",
            "python-modules": [
                "trainops.operators.stage", "trainops.operators.train",
                "trainops.operators.evaluate", "trainops.operators.gate",
                "trainops.operators.promote",
            ],
        }],
        "triggers": [{"integration-name": "trainops", "python-modules": ["trainops.triggers.job"]}],
        "integrations": [{"integration-name": "trainops", "external-doc-url":
                          "https://example.invalid/trainops", "tags": ["software"]}],
    }
