"""Finding the runs under the served roots: one listing per root, shared by the home page's
readers; the fleet page's query parameters."""

from __future__ import annotations

import pytest

from tests.trainops.reports.helpers import run_job
from trainer.contract import join
from trainer.storage import open_storage
from trainops.reports.access import ReportRequestError
from trainops.reports.fleet_reader import FLEET_MAX_RUNS, find_runs, fleet_dag, fleet_limit, list_roots


def test_a_root_is_listed_once_and_its_listing_reused(file_root, tmp_path):
    storage = open_storage(file_root)
    storage.put_json(join(file_root, "runs", "retrain", "r1", "train", "job.json"), run_job())
    missing = f"file://{tmp_path}/nowhere"
    listed, problems = list_roots([file_root, missing], None, what="its runs, models and datasets are")
    assert [(root, uris is not None) for root, _, uris in listed] == [(file_root, True), (missing, True)]
    assert problems == []  # an absent folder lists as empty on file://
    storage.put_json(join(file_root, "runs", "retrain", "r2", "train", "job.json"), run_job())
    runs, hidden, more = find_runs([file_root], None, limit=5, listed=listed)
    # the listing handed in is the one used: r2, written after it, is not read
    assert ([r["run_id"] for r in runs], hidden, more) == (["r1"], 0, [])
    assert [r["run_id"] for r in find_runs([file_root], None, limit=5)[0]] == ["r2", "r1"]


def test_a_root_unavailable_is_named_and_the_others_still_count(
    file_root, faulty_s3_root, s3_faults, monkeypatch
):
    from trainops.reports import access

    monkeypatch.setattr(access, "OUTAGE_TOLERANCE_S", 0.5)  # scaled down from 10 s
    s3_faults.blackout()
    try:
        listed, problems = list_roots(
            [faulty_s3_root, file_root], None, what="its runs, models and datasets are"
        )
    finally:
        s3_faults.end_blackout()
    assert [uris is None for _, _, uris in listed] == [True, False]
    assert problems == [
        f"storage is unavailable: listing '{faulty_s3_root}' kept failing for 0.5 s, so its runs, models and "
        "datasets are not shown; reload this page in a minute"
    ]


@pytest.mark.parametrize(("value", "limit"), [("", 20), ("3", 3), ("100000", FLEET_MAX_RUNS)])
def test_limit(value, limit):
    assert fleet_limit(value) == limit


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fleet_limit("-1"), "limit '-1' is not a positive whole number"),
        (lambda: fleet_dag(".."), "dag '..' is not a DAG id"),
        (lambda: fleet_dag("a\nb"), "dag 'a\\nb' contains control characters"),
    ],
)
def test_bad_parameters_are_400s_that_name_the_value(call, message):
    with pytest.raises(ReportRequestError) as err:
        call()
    assert err.value.status == 400 and message in err.value.message
