"""What a report page links to besides its own object, and whether it reloads: one decision
for every page the report app serves, over what the app found around the page (:class:`Around`).

Every page links to the trainops home and the fleet page. A page that belongs to a training
run (its ``job.json``, its gate decision, a model card promoted from it) links back to the
run's page in Airflow, ``<base_url>/dags/<dag_id>/runs/<run_id>``, with the ids as the run's
``job.json`` recorded them (``airflow``); a record from before that field names only the DAG
(its storage path holds the run id made safe for a path, which Airflow's URL cannot be rebuilt
from), so the link opens the DAG's runs. A run's page also links to the model cards of the
versions promoted from it, and a page about a run other than its report links to the report.
A page reloads every :data:`REFRESH_S` seconds while its run is live (``status: running``).
Pure: the app reads (:mod:`trainops.reports.around`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from trainops.links import airflow_run_url
from trainops.reports.html import FrameLink

__all__ = ["REFRESH_S", "AirflowRef", "Around", "airflow_link", "airflow_ref", "frame_links", "report_href"]

REFRESH_S = 15  # seconds between reloads of a live run's pages


@dataclass(frozen=True)
class AirflowRef:
    """The Airflow run a page belongs to; ``run_id`` None when only the DAG is known."""

    dag_id: str
    run_id: str | None = None


@dataclass(frozen=True)
class Around:
    """What the app found around a page: its Airflow run, the run's report (when the page is
    not that report), the model cards promoted from the run (model, version, card URI), and
    whether the run is live."""

    airflow: AirflowRef | None = None
    run_report: str | None = None
    cards: tuple[tuple[str, int, str], ...] = ()
    live: bool = False


def airflow_ref(job: Mapping[str, object] | None, dag_segment: str | None) -> AirflowRef | None:
    """The Airflow run of a ``job.json`` (its ``airflow`` field), else the DAG of its path
    (``dag_segment``: Airflow's DAG ids need no making safe, so the segment is the id)."""
    recorded = job.get("airflow") if job is not None else None
    if isinstance(recorded, Mapping):
        dag_id, run_id = recorded.get("dag_id"), recorded.get("run_id")
        if isinstance(dag_id, str) and dag_id and isinstance(run_id, str) and run_id:
            return AirflowRef(dag_id, run_id)
    return AirflowRef(dag_segment) if dag_segment else None


def airflow_link(ref: AirflowRef, base_url: str) -> FrameLink:
    """The link to ``ref``'s page in Airflow's UI (the DAG's runs when the run is not known)."""
    if ref.run_id is not None:
        return FrameLink(
            f"Airflow run {ref.dag_id} / {ref.run_id}",
            airflow_run_url(ref.dag_id, ref.run_id, base_url),
            True,
        )
    href = f"{base_url.rstrip('/')}/dags/{quote(ref.dag_id, safe='')}/runs"
    return FrameLink(f"Airflow runs of {ref.dag_id}", href, True)


def report_href(uri: str) -> str:
    """The report app's relative link to the stored object ``uri`` (as ``html.report_link``)."""
    return "report?" + urlencode({"uri": uri})


def frame_links(around: Around, *, base_url: str) -> tuple[list[FrameLink], int | None]:
    """``(links, reload seconds or None)`` for a page with ``around`` it.

    :param base_url: Airflow's public URL (``[api] base_url``; "" for host-relative links).
    """
    links = [FrameLink("trainops home", "./"), FrameLink("Training cost", "fleet")]
    if around.airflow is not None:
        links.append(airflow_link(around.airflow, base_url))
    if around.run_report:
        links.append(FrameLink("Training report", report_href(around.run_report)))
    for model, version, card in around.cards:
        links.append(FrameLink(f"Model card {model} v{version}", report_href(card)))
    return links, REFRESH_S if around.live else None
