"""The bar of links on every report page, and the reload of a live run's pages."""

from __future__ import annotations

import re

from tests.trainops.reports.helpers import main_text, page_text
from trainops.reports.frame import REFRESH_S, AirflowRef, Around, airflow_ref, frame_links
from trainops.reports.html import FrameLink, framed, page

ATTACK = '"><script>alert(1)</script>'


def _links(html: str) -> list[tuple[str, str, str]]:
    """(text, href, class) of the bar's links."""
    bar = re.search(r'<nav class="frame">(.*?)</nav>', html, re.S).group(1)
    return [
        (text, href.replace("&amp;", "&"), css or "")
        for css, href, text in re.findall(r'<a(?: class="([^"]*)")? href="([^"]*)">([^<]*)</a>', bar)
    ]


def test_a_finished_runs_report_links_home_to_airflow_and_its_model_card_and_does_not_reload():
    around = Around(
        airflow=AirflowRef("retrain", "manual__2026-01-01T00:00:00+00:00"),
        cards=(("demo-lm", 3, "s3://b/root/models/demo-lm/versions/3/card.json"),),
    )
    links, refresh = frame_links(around, base_url="https://airflow.example.com/team-a")
    html = framed(
        page("Training run", "s3://b/root/runs/x/job.json", "<p>body</p>"), links, refresh_s=refresh
    )
    assert refresh is None and "http-equiv" not in html
    assert _links(html) == [
        ("trainops home", "./", ""),
        ("Training cost", "fleet", ""),
        (
            "Airflow run retrain / manual__2026-01-01T00:00:00+00:00",
            "https://airflow.example.com/team-a/dags/retrain/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00",
            "airflow",
        ),
        (
            "Model card demo-lm v3",
            "report?uri=s3%3A%2F%2Fb%2Froot%2Fmodels%2Fdemo-lm%2Fversions%2F3%2Fcard.json",
            "",
        ),
    ]
    assert main_text(html).startswith("Training run s3://b/root/runs/x/job.json body")


def test_a_live_runs_page_reloads_and_says_so():
    links, refresh = frame_links(Around(airflow=AirflowRef("retrain"), live=True), base_url="")
    html = framed(page("Training run", "", ""), links, refresh_s=refresh)
    assert refresh == REFRESH_S == 15
    assert f'<meta http-equiv="refresh" content="{REFRESH_S}">' in html.split("</head>")[0]
    assert f"live: this page reloads every {REFRESH_S} s" in page_text(html)
    # a record without the Airflow ids: its DAG's runs, host-relative without a base_url
    assert ("Airflow runs of retrain", "/dags/retrain/runs", "airflow") in _links(html)


def test_a_page_about_a_run_links_to_its_report():
    links, _ = frame_links(Around(run_report="file:///r/runs/d/r/t/job.json"), base_url="")
    assert FrameLink("Training report", "report?uri=file%3A%2F%2F%2Fr%2Fruns%2Fd%2Fr%2Ft%2Fjob.json") in links


def test_hostile_ids_are_escaped_and_cannot_leave_the_runs_path():
    links, _ = frame_links(Around(airflow=AirflowRef(ATTACK, "../../admin")), base_url="")
    html = framed(page("t", "", ""), links)
    assert "<script>" not in html
    [(_, href, _)] = [link for link in _links(html) if link[2] == "airflow"]
    assert href == "/dags/%22%3E%3Cscript%3Ealert%281%29%3C%2Fscript%3E/runs/..%2F..%2Fadmin"


def test_airflow_ids_come_from_the_record_else_the_dag_of_the_path():
    ids = {"dag_id": "retrain", "run_id": "scheduled__2026-01-02T00:00:00+00:00", "task_id": "train"}
    assert airflow_ref({"airflow": ids}, "retrain") == AirflowRef("retrain", ids["run_id"])
    assert airflow_ref({"status": "running"}, "retrain") == AirflowRef("retrain")
    assert airflow_ref({"airflow": {"dag_id": "d", "run_id": 7}}, "d") == AirflowRef("d")  # not an id
    assert airflow_ref(None, None) is None
