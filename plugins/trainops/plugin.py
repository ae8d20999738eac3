"""The Airflow plugin. Registered by the ``airflow.plugins`` entry point when trainops is
pip-installed, and by ``plugins/trainops_plugin.py`` when it is used from a plugins folder.

It serves the report app (:mod:`trainops.reports.app`) at ``<base_url>/trainops``, and puts two
of its pages in Airflow's navigation under Browse: the home page (recent training runs, models
and datasets, each linked to its Airflow run), as "trainops", and the fleet page (the cost,
goodput and savings of the last runs of each DAG), as "Training cost". The operator extra links (:mod:`trainops.links`) are
declared by the operators themselves and are deliberately not registered here: see that
module for why.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from airflow.plugins_manager import AirflowPlugin

from trainops.links import fleet_url, home_url

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

REPORTS_URL_PREFIX = "/trainops"


class _ReportsApp:
    """ASGI app that builds the report app on its first request.

    Airflow reads ``fastapi_apps`` when it loads plugins, in every process (scheduler,
    DAG processor, workers), but only the API server serves requests. Building the app on
    first use keeps FastAPI and Airflow's API security modules out of the other processes.
    """

    def __init__(self) -> None:
        self._app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            # No await between the check and the assignment: one event loop builds it once.
            from trainops.reports.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class TrainopsPlugin(AirflowPlugin):
    """trainops' UI surface: the report app that the operators' extra links open."""

    name = "trainops"
    fastapi_apps = [  # noqa: RUF012 - AirflowPlugin reads plain class lists
        {"app": _ReportsApp(), "url_prefix": REPORTS_URL_PREFIX, "name": "trainops reports"},
    ]
    # Shown in Airflow's UI (an iframe at /plugin/trainops-fleet); the page's CSP allows
    # framing by the same origin only.
    external_views = [  # noqa: RUF012 - AirflowPlugin reads plain class lists
        {
            "name": "trainops",
            "href": home_url(),
            "destination": "nav",
            "category": "browse",
            "url_route": "trainops-home",
        },
        {
            "name": "Training cost",
            "href": fleet_url(),
            "destination": "nav",
            "category": "browse",
            "url_route": "trainops-fleet",
        },
    ]


def registered_by_entry_point() -> bool:
    """True when an installed distribution already publishes this plugin's entry point."""
    return any(ep.value.startswith("trainops.plugin:") for ep in entry_points(group="airflow.plugins"))
