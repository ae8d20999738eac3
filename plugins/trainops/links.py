"""Operator extra links that open a stored report in the report app (``/trainops/report``).

An operator declares the links it offers and pushes, during ``execute``, the storage URI of
each report under the link's XCom key::

    class StageDatasetOperator(BaseOperator):
        operator_extra_links = (ValidationReportLink(),)

        def execute(self, context):
            ...
            context["ti"].xcom_push(key=VALIDATION_REPORT_KEY, value=validation_json_uri)

XCom keys (value: the report's storage URI, a string):

- ``trainops_validation_report``: ``<root>/datasets/<name>/<version>/validation.json``
  (StageDatasetOperator), shown as "Validation report";
- ``trainops_gate_report``: ``<run_uri>/eval/gate.json`` (EvaluationGateOperator),
  shown as "Gate decision";
- ``trainops_model_card``: ``<root>/models/<name>/versions/<v>/card.json``
  (PromoteModelOperator), shown as "Model card";
- ``trainops_run_report``: ``<run_uri>/job.json`` (FSDPTrainingOperator, pushed when the first
  attempt is launched), shown as "Training report": the run report (loss curve from the
  ``metrics.jsonl`` beside it, throughput, attempts and preemptions).

How Airflow 3 runs these: when a task ends, the task runner calls ``get_link`` of every link
the operator declares, in the worker, and stores the URL in XCom under the link's own
``xcom_key`` (``_link_<class name>``; ``finalize`` in ``airflow/sdk/execution_time/
task_runner.py``). The API server later shows that stored URL; it never imports these classes,
because a serialized operator keeps only ``{link name: xcom_key}``
(``_serialize_operator_extra_links`` in ``airflow/serialization/serialized_objects.py``).
So the links need no plugin registration, and must not get one: a plugin's
``operator_extra_links`` replace the stored ones and would run ``get_link`` in the API server,
where the Task SDK's ``XCom`` cannot be read. A task that pushed no URI gets an empty link,
which the UI shows disabled. An operator that never defers (the gate, promote) sets
``reports_known_in_process = True`` and pushes with :func:`push_report`: its links then read
what it pushed from the operator and never pull a key it did not push, which Airflow's XCom
client would log as an error ("XCom not found") on every rejected run.

The report app's home page (:data:`HOME_PATH`, :func:`home_url`) lists the recent training runs,
the models and the datasets, each with links to its report pages and to its Airflow run
(:func:`airflow_run_url`); the plugin puts it in Airflow's navigation ("Browse", "trainops").

The report app also serves the fleet page (:data:`FLEET_PATH`, :func:`fleet_url`): the last
runs of each DAG with their cost, goodput, preemptions and savings. The plugin puts it in
Airflow's navigation ("Browse", "Training cost"; see ``trainops.plugin``).

The URL starts with ``[api] base_url`` (``AIRFLOW__API__BASE_URL``), so it works behind a proxy
that serves Airflow under a path; without it the link is relative to the host (``/trainops/...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote, urlencode

from airflow.sdk import BaseOperatorLink
from airflow.sdk.configuration import conf
from airflow.sdk.execution_time.xcom import XCom

from trainops.reports.urls import REPORT_PATH
from trainops.reports.urls import report_url as page_url

__all__ = [
    "FLEET_PATH",
    "GATE_REPORT_KEY",
    "HOME_PATH",
    "MODEL_CARD_KEY",
    "REPORT_PATH",
    "RUN_REPORT_KEY",
    "VALIDATION_REPORT_KEY",
    "GateDecisionLink",
    "ModelCardLink",
    "RunReportLink",
    "StoredReportLink",
    "ValidationReportLink",
    "airflow_base_url",
    "airflow_run_url",
    "fleet_url",
    "home_url",
    "push_report",
    "report_url",
]

VALIDATION_REPORT_KEY = "trainops_validation_report"
GATE_REPORT_KEY = "trainops_gate_report"
MODEL_CARD_KEY = "trainops_model_card"
RUN_REPORT_KEY = "trainops_run_report"
FLEET_PATH = "/trainops/fleet"
HOME_PATH = "/trainops/"


def push_report(operator: object, context: Mapping[str, Any], key: str, uri: str) -> None:
    """Push a report's ``uri`` under the link's ``key`` and remember it on ``operator`` (whose
    class sets ``reports_known_in_process = True`` when it never defers)."""
    ti = context.get("ti")
    if ti is not None:
        ti.xcom_push(key=key, value=uri)
    pushed = dict(getattr(operator, "pushed_reports", None) or {})
    pushed[key] = uri
    operator.pushed_reports = pushed  # type: ignore[attr-defined]


def _base_url(base_url: str | None) -> str:
    if base_url is None:
        base_url = conf.get("api", "base_url", fallback="") or ""
    return base_url.rstrip("/")


def airflow_base_url() -> str:
    """``[api] base_url`` without its trailing slash ("" when unset: links relative to the host)."""
    return _base_url(None)


def report_url(uri: str, base_url: str | None = None) -> str:
    """The report app's URL for the stored report ``uri``.

    :param base_url: Airflow's public URL, e.g. ``https://airflow.example.com/airflow``;
        defaults to ``[api] base_url``.
    """
    return page_url(uri, _base_url(base_url))


def fleet_url(base_url: str | None = None, *, dag_id: str | None = None, limit: int | None = None) -> str:
    """The report app's URL for the fleet page, of every DAG or of ``dag_id``.

    :param base_url: Airflow's public URL; defaults to ``[api] base_url``.
    :param limit: runs per DAG (the page's default, 20, when None).
    """
    query = {k: str(v) for k, v in (("dag", dag_id), ("limit", limit)) if v is not None}
    return f"{_base_url(base_url)}{FLEET_PATH}" + (f"?{urlencode(query)}" if query else "")


def home_url(base_url: str | None = None) -> str:
    """The report app's home page: recent runs, models and datasets.

    :param base_url: Airflow's public URL; defaults to ``[api] base_url``.
    """
    return f"{_base_url(base_url)}{HOME_PATH}"


def airflow_run_url(dag_id: str, run_id: str, base_url: str | None = None) -> str:
    """The Airflow 3 UI page of a DAG run, ``<base_url>/dags/<dag_id>/runs/<run_id>``.

    Both ids are quoted whole (a run id holds ``:`` and ``+``), so neither can add a path segment.

    :param base_url: Airflow's public URL; defaults to ``[api] base_url``.
    """
    return f"{_base_url(base_url)}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


class StoredReportLink(BaseOperatorLink):
    """A link to the report whose storage URI the task pushed under :attr:`report_key`.

    Subclasses set ``name`` (the button's label) and ``report_key``.
    """

    report_key: ClassVar[str]

    def get_link(self, operator, *, ti_key) -> str:
        if getattr(operator, "reports_known_in_process", False):
            # The task ran here from start to end (it never defers), so what it pushed is on the
            # operator: pulling a key it never pushed (promote's card after a rejection) would
            # log "XCom not found" as an error on a run that went as planned.
            uri = (getattr(operator, "pushed_reports", None) or {}).get(self.report_key)
        else:
            # The configured XCom backend, as the task used when it pushed the URI.

            uri = XCom.get_value(ti_key=ti_key, key=self.report_key)
        if not isinstance(uri, str) or not uri:
            return ""
        return report_url(uri)


class ValidationReportLink(StoredReportLink):
    """The dataset validation report (``validation.json``) of a staging task."""

    name = "Validation report"
    report_key = VALIDATION_REPORT_KEY


class GateDecisionLink(StoredReportLink):
    """The evaluation gate's decision (``eval/gate.json``)."""

    name = "Gate decision"
    report_key = GATE_REPORT_KEY


class ModelCardLink(StoredReportLink):
    """The promoted model version's lineage card (``card.json``)."""

    name = "Model card"
    report_key = MODEL_CARD_KEY


class RunReportLink(StoredReportLink):
    """A training run's report, from its ``job.json`` (and the ``metrics.jsonl`` beside it)."""

    name = "Training report"
    report_key = RUN_REPORT_KEY
