"""Provider metadata, published through the ``apache_airflow_provider`` entry point.

``airflow providers list`` shows trainops with its version, and ``airflow providers links``
its operator extra links. In Airflow 3 the ``extra-links`` entry is metadata only: the links
work because each operator declares them (see :mod:`trainops.links`), not because they are
listed here.

trainops invents no connection type: it uses Airflow's ``aws`` and ``kubernetes`` ones, so
there is no ``connection-types`` entry. The plugin is published by the ``airflow.plugins``
entry point only: listing it here as well would register it twice.
"""

from __future__ import annotations

from trainops import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "trainops",
        "name": "trainops",
        "description": "Retrain models on schedule on spot GPUs: stage and validate data, "
        "train with FSDP under torchrun, checkpoint to S3, evaluate, promote.",
        "versions": [__version__],
        "operators": [
            {
                "integration-name": "trainops",
                "python-modules": [
                    "trainops.operators.stage",
                    "trainops.operators.train",
                    "trainops.operators.evaluate",
                    "trainops.operators.evaluate_checkpoints",
                    "trainops.operators.gate",
                    "trainops.operators.promote",
                    "trainops.operators.rollback",
                ],
            }
        ],
        "triggers": [{"integration-name": "trainops", "python-modules": ["trainops.triggers.job"]}],
        "extra-links": [
            "trainops.links.ValidationReportLink",
            "trainops.links.GateDecisionLink",
            "trainops.links.ModelCardLink",
            "trainops.links.RunReportLink",
        ],
        "integrations": [
            {
                "integration-name": "trainops",
                "external-doc-url": "https://example.invalid/trainops",
                "tags": ["software"],
            }
        ],
    }
