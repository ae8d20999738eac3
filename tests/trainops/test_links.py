"""Report links: computed by the task runner from the pushed XCom, shown by the API server."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import DAG, BaseOperator

from trainops.links import (
    GATE_REPORT_KEY,
    RUN_REPORT_KEY,
    VALIDATION_REPORT_KEY,
    GateDecisionLink,
    ModelCardLink,
    RunReportLink,
    ValidationReportLink,
    report_url,
)

PROBE_DAG_ID = "trainops_links_probe"
REPORT_URI = "s3://lake/trainops/datasets/web text/3f9a/validation.json"
JOB_URI = "s3://lake/trainops/runs/retrain/manual__2026-01-01T00_00_00_00_00/train/job.json"
PROBE_DAG_FILE = """# An Airflow DAG for tests/trainops/test_links.py.
from tests.trainops.test_links import build_probe_dag

dag = build_probe_dag()
"""


class PushReportsOperator(BaseOperator):
    """Pushes report URIs the way trainops operators do, and offers all four links."""

    operator_extra_links = (ValidationReportLink(), GateDecisionLink(), ModelCardLink(), RunReportLink())

    def __init__(self, *, reports: dict, **kwargs):
        super().__init__(**kwargs)
        self.reports = reports

    def execute(self, context):
        for key, uri in self.reports.items():
            context["ti"].xcom_push(key=key, value=uri)


def build_probe_dag():
    with DAG(PROBE_DAG_ID, schedule=None) as dag:
        PushReportsOperator(
            task_id="stage",
            reports={VALIDATION_REPORT_KEY: REPORT_URI, GATE_REPORT_KEY: "", RUN_REPORT_KEY: JOB_URI},
        )
    return dag


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("https://airflow.example.com/team-a/", "https://airflow.example.com/team-a/trainops/report"),
        ("https://airflow.example.com", "https://airflow.example.com/trainops/report"),
        ("", "/trainops/report"),
    ],
)
def test_report_url_keeps_the_proxy_path_and_encodes_the_uri(base_url, expected):
    url = report_url("s3://b/root/runs/d/manual__2026-01-01T00:00:00+00:00/t/eval/gate.json", base_url)
    assert url == (
        f"{expected}?uri=s3%3A%2F%2Fb%2Froot%2Fruns%2Fd%2F"
        "manual__2026-01-01T00%3A00%3A00%2B00%3A00%2Ft%2Feval%2Fgate.json"
    )


def test_report_url_reads_airflow_base_url(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://proxy.example.com/airflow")
    assert report_url("file:///r/a.json") == (
        "https://proxy.example.com/airflow/trainops/report?uri=file%3A%2F%2F%2Fr%2Fa.json"
    )


def test_links_follow_the_pushed_xcom_through_airflow(airflow_db, tmp_path, monkeypatch):
    """dag.test() runs the task runner, which stores each link's URL; the API lists them."""
    from airflow import plugins_manager
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    # The plugin's navigation entries take [api] base_url when it is imported, once per process:
    # load it under the suite's settings, not this test's, or later tests see this base URL.
    plugins_manager.ensure_plugins_loaded()
    (tmp_path / "links_probe.py").write_text(PROBE_DAG_FILE)
    # dag.test() needs its DAG in a bundle; this one sits in tmp_path, beside the dags folder.
    monkeypatch.setenv(
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST",
        json.dumps(
            [
                {
                    "name": "trainops-links-test",
                    "kwargs": {"path": str(tmp_path)},
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                },
                {
                    "name": "dags-folder",
                    "kwargs": {},
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                },
            ]
        ),
    )
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team-a/")

    dagrun = build_probe_dag().test()
    assert str(dagrun.state).endswith("success")

    client = TestClient(create_app(apps="core"))
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ada", role="viewer"))
    response = client.get(
        f"/api/v2/dags/{PROBE_DAG_ID}/dagRuns/{dagrun.run_id}/taskInstances/stage/links",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["extra_links"] == {
        "Gate decision": None,  # pushed empty: no report, so the UI shows the link disabled
        "Model card": None,  # not pushed at all
        "Training report": "https://airflow.example.com/team-a/trainops/report?uri="
        "s3%3A%2F%2Flake%2Ftrainops%2Fruns%2Fretrain%2F"
        "manual__2026-01-01T00_00_00_00_00%2Ftrain%2Fjob.json",
        "Validation report": "https://airflow.example.com/team-a/trainops/report?uri="
        "s3%3A%2F%2Flake%2Ftrainops%2Fdatasets%2Fweb+text%2F3f9a%2F"
        "validation.json",
    }


def test_each_operator_offers_the_link_for_the_key_it_pushes():
    from trainops.operators import gate, promote, stage, train

    offered = {
        op.__name__: [(link.name, link.report_key) for link in op.operator_extra_links]
        for op in (
            stage.StageDatasetOperator,
            gate.EvaluationGateOperator,
            promote.PromoteModelOperator,
            train.FSDPTrainingOperator,
        )
    }
    assert offered == {
        "StageDatasetOperator": [("Validation report", stage.VALIDATION_REPORT_KEY)],
        "EvaluationGateOperator": [("Gate decision", gate.GATE_REPORT_KEY)],
        "PromoteModelOperator": [("Model card", promote.MODEL_CARD_KEY)],
        "FSDPTrainingOperator": [("Training report", train.RUN_REPORT_KEY)],
    }
    assert train.RUN_REPORT_KEY == "trainops_run_report"


def test_training_pushes_its_job_json_when_the_first_attempt_is_launched(file_root, monkeypatch):
    """The link works from the first attempt on: the report shows the attempt running."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import TaskDeferred

    import trainops.cluster
    from tests.trainops.cluster.fake_backend import FakeCluster
    from tests.trainops.operators.test_train import layout_of, operator
    from tests.trainops.reports.helpers import page_text, table_with
    from trainer.storage import open_storage
    from trainops.reports.run_page import render_run_report

    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: FakeCluster())
    pushed = []
    ti = SimpleNamespace(
        dag_id="retrain",
        run_id="manual__2026-01-01T00:00:00+00:00",
        task_id="train",
        map_index=-1,
        xcom_push=lambda key, value: pushed.append((key, value)),
    )
    with pytest.raises(TaskDeferred):
        operator(file_root).execute({"ti": ti})

    job_uri = layout_of(file_root).job
    assert pushed == [(RUN_REPORT_KEY, job_uri)]
    html = render_run_report(job_uri, open_storage(file_root).get(job_uri), None)
    assert "Status running" in page_text(html)
    attempt = table_with(html, "Attempt")[1]
    assert attempt[:2] == ["1", "spot"] and attempt[3:] == ["running", "-", "-", "-", "-", "-"]


def test_training_records_its_airflow_run_and_logs_its_report_url_at_the_start(
    file_root, monkeypatch, caplog, capsys
):
    """The run's job.json names the Airflow run as Airflow does (its path cannot: ``:`` and
    ``+`` are made safe), so report pages link back to it; the task log names the report."""
    import logging
    from types import SimpleNamespace

    from airflow.sdk.exceptions import TaskDeferred

    import trainops.cluster
    from tests.trainops.cluster.fake_backend import FakeCluster
    from tests.trainops.operators.test_train import layout_of, operator
    from trainer.storage import open_storage

    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **kw: FakeCluster())
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com")
    run_id = "manual__2026-01-01T00:00:00+00:00"
    ti = SimpleNamespace(
        dag_id="retrain", run_id=run_id, task_id="train", map_index=-1, xcom_push=lambda **kw: None
    )
    op = operator(file_root)
    with caplog.at_level(logging.INFO):
        op.pre_execute({"ti": ti})
        with pytest.raises(TaskDeferred):
            op.execute({"ti": ti})

    job_uri = layout_of(file_root).job
    assert open_storage(file_root).get_json(job_uri)["airflow"] == {
        "dag_id": "retrain",
        "run_id": run_id,
        "task_id": "train",
        "map_index": -1,
    }
    logged = caplog.text + capsys.readouterr().out  # the task's logger writes through structlog
    assert f"trainops Training report: {report_url(job_uri)}" in logged
    assert report_url(job_uri).startswith("https://airflow.example.com/trainops/report?uri=file%3A")
    assert "trainops home (runs, models, datasets): https://airflow.example.com/trainops/" in logged


def test_gate_and_promote_log_where_their_report_will_be_and_never_fail_for_it(monkeypatch, caplog, capsys):
    import logging

    from trainops.operators.evaluate import EvaluateModelOperator
    from trainops.operators.gate import EvaluationGateOperator
    from trainops.operators.promote import PromoteModelOperator

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    gate = EvaluationGateOperator(task_id="gate", evaluation={})
    promote = PromoteModelOperator(
        task_id="promote", model_name="m", gate={}, training={}, dataset={}, evaluation={}
    )
    evaluate = EvaluateModelOperator(task_id="evaluate", training={}, model_name="m")
    with caplog.at_level(logging.INFO):
        gate.pre_execute({})
        promote.pre_execute({})
        evaluate.pre_execute({})
    logged = caplog.text + capsys.readouterr().out
    assert "trainops Gate decision: on this task's 'Gate decision' link once it is written" in logged
    assert "trainops Model card: on this task's 'Model card' link once it is written" in logged
    # evaluate has no report link of its own: the home page only
    assert logged.count("trainops home (runs, models, datasets): /trainops/") == 3
    assert logged.count("once it is written") == 2

    def broken(context):
        raise RuntimeError("no storage root")

    # Once the evaluation is rendered, the gate knows its decision's URI before it runs.
    run = "file:///r/runs/d/manual__2026-01-01T00_00_00_00_00/train"
    caplog.clear()
    with caplog.at_level(logging.INFO):
        EvaluationGateOperator(task_id="gate", evaluation={"run_uri": run}).pre_execute({})
    assert (
        "trainops Gate decision: /trainops/report?uri=file%3A%2F%2F%2Fr%2Fruns%2Fd%2F"
        "manual__2026-01-01T00_00_00_00_00%2Ftrain%2Feval%2Fgate.json"
    ) in (caplog.text + capsys.readouterr().out)

    monkeypatch.setattr(gate, "report_uri", broken)
    with caplog.at_level(logging.INFO):
        gate.pre_execute({})  # a log line never fails the task
    assert "could not tell where this task's trainops report is: no storage root" in (
        caplog.text + capsys.readouterr().out
    )
