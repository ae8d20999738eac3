"""The Airflow plugin. Registered by the ``airflow.plugins`` entry point when trainops is
pip-installed, and by ``plugins/trainops_plugin.py`` when it is used from a plugins folder."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class TrainopsPlugin(AirflowPlugin):
    """trainops' UI surface. Operator extra links and the report app arrive with issues #5/#6."""

    name = "trainops"


def registered_by_entry_point() -> bool:
    """True when an installed distribution already publishes this plugin's entry point."""
    from importlib.metadata import entry_points

    return any(ep.value.startswith("trainops.plugin:") for ep in entry_points(group="airflow.plugins"))
