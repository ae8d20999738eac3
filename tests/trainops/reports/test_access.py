"""The checks every object the report app reads passes: under a served root, no ``.``
segment, a report's suffix; and which DAG's access a report needs."""

from __future__ import annotations

import pytest

from trainops.reports.access import ReportRequestError, check_report_uri, required_access


@pytest.mark.parametrize(
    ("uri", "roots", "relative"),
    [
        ("s3://b/root/datasets/d/v/validation.json", ["s3://b/root"], "datasets/d/v/validation.json"),
        ("s3://b/runs/dag/r/t/eval/gate.json", ["s3://b"], "runs/dag/r/t/eval/gate.json"),
        ("file://localhost/srv/t/a.json", ["file:///srv/t"], "a.json"),
        ("file:///srv/t//x/a.json", ["file:///srv/t"], "x/a.json"),
    ],
)
def test_uri_check_accepts_reports_under_a_root(uri, roots, relative):
    assert check_report_uri(uri, roots).relative == relative


@pytest.mark.parametrize(
    ("uri", "status"),
    [
        ("s3://b/root2/a.json", 403),
        ("s3://b/root", 403),
        ("s3://c/root/a.json", 403),
        ("file:///srv/t/a.json", 403),
        ("s3://b/root/./a.json", 400),
        ("s3://b/root/a/../../x.json", 400),
        ("s3://b/root/a.json\n", 400),
        ("file://srv/root/a.json", 400),
    ],
)
def test_uri_check_refuses(uri, status):
    with pytest.raises(ReportRequestError) as err:
        check_report_uri(uri, ["s3://b/root"])
    assert err.value.status == status
    assert repr(uri) in err.value.message


def test_run_reports_name_their_dag():
    target = check_report_uri("s3://b/root/runs/retrain/r1/train/job.json", ["s3://b/root"])
    assert required_access(target) == "retrain"
    models = check_report_uri("s3://b/root/models/m/versions/1/card.json", ["s3://b/root"])
    assert required_access(models) is None
    # a DAG's own storage root below the served one: its runs still need that DAG's access
    nested = check_report_uri("s3://b/root/team-a/runs/secret/r1/train/eval/gate.json", ["s3://b/root"])
    assert required_access(nested) == "secret"
