"""The report app as Airflow's API server serves it: mounted by the plugin, behind Airflow's auth.

The app under test is Airflow's own ``create_app`` (which mounts plugin apps with
``init_plugins``), with its default SimpleAuthManager issuing real JWTs.
"""

from __future__ import annotations

import html
import json
import os
import re
from urllib.parse import urlencode

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.trainops.reports.helpers import (
    RUN_METRICS,
    Svg,
    main_text,
    page_tables,
    page_text,
    run_job,
    svgs,
    table_with,
)
from trainer.contract import dataset_prefix, join
from trainer.storage import open_storage
from trainops.reports import access
from trainops.reports.fleet_reader import find_runs

ATTACK = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def api(airflow_db):
    """``(client, auth manager)`` for Airflow's API app with the trainops plugin mounted."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from fastapi.testclient import TestClient

    return TestClient(create_app(apps="core")), get_auth_manager()


def bearer(api, role: str | None = "viewer", name: str = "ada") -> dict:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = api[1].generate_jwt(SimpleAuthManagerUser(username=name, role=role))
    return {"Authorization": f"Bearer {token}"}


def get(api, uri: str, headers: dict | None = None):
    return api[0].get(
        "/trainops/report", params={"uri": uri}, headers=bearer(api) if headers is None else headers
    )


@pytest.fixture
def root(file_root, monkeypatch):
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", file_root)
    monkeypatch.delenv("TRAINOPS_REPORT_ROOTS", raising=False)
    return file_root


def _bad_source(tmp_path) -> str:
    """Demo data broken in known places, with a hostile id that occurs twice."""
    from trainops.staging.demo_data import demo_rows

    cols = demo_rows(60, seed=1, corrupt=True)
    cols["id"][10] = cols["id"][11] = ATTACK
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table(cols), tmp_path / "raw" / "part-00000.parquet")
    return f"file://{tmp_path}/raw"


def _failed_report(root: str, source: str) -> str:
    from trainops.staging.errors import DataValidationError
    from trainops.staging.stage import stage_dataset

    storage = open_storage(root)
    with pytest.raises(DataValidationError) as err:
        stage_dataset(storage, root, source, "web-text")
    if getattr(err.value, "report_uri", None):
        return err.value.report_uri
    # Staging that predates failure reports raises without storing one: store its real
    # summary where staging stores validation.json.
    uri = join(dataset_prefix(root, "web-text", "failed"), "validation.json")
    storage.put_json(uri, err.value.summary)
    return uri


def test_failed_validation_report_shows_every_failure_escaped(api, root, tmp_path):
    uri = _failed_report(root, _bad_source(tmp_path))
    response = get(api, uri)

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    html = response.text
    text = page_text(html)
    assert "Dataset validation report" in text and "Validation FAILED" in text
    assert ["Rows checked", "60"] in page_tables(html)[0]
    rows = {(r[0], r[1]): r for t in page_tables(html) if t[0][0] == "Expectation" for r in t}
    null_ids = rows[("expect_column_values_to_not_be_null", "id")]
    assert null_ids[2:5] == ["FAIL", "2", "rows 3, 20"]
    unique = rows[("expect_column_values_to_be_unique", "id")]
    assert unique[2:4] == ["FAIL", "6"]
    assert [i for i in (ATTACK, "n001-0000000", "f001-0000001") if i in unique[4]] == [
        ATTACK,
        "n001-0000000",
        "f001-0000001",
    ]  # demo rows 0 and 1 are repeated too
    assert rows[("expect_column_value_lengths_to_be_between", "text")][2:4] == ["FAIL", "3"]
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_quarantine_report_links_to_its_sample(api, root, tmp_path):
    from trainops.staging.demo_data import write_demo_dataset
    from trainops.staging.errors import DataValidationError
    from trainops.staging.stage import stage_dataset

    source = write_demo_dataset(f"file://{tmp_path}/raw", rows=60, seed=1, corrupt=True)
    with pytest.raises(DataValidationError) as err:  # duplicate ids cannot be quarantined
        stage_dataset(open_storage(root), root, source["uri"], "web-text", quarantine={"max_fraction": 0.2})
    response = get(api, err.value.report_uri)
    assert response.status_code == 200, response.text
    quarantine = {r[0]: r[1] for t in page_tables(response.text) for r in t if t[0][0] == "Rows quarantined"}
    assert quarantine["Rows quarantined"] == "5" and quarantine["Rows read"] == "60"
    sample_uri = quarantine["Sample of quarantined rows"]
    href = re.search(r'href="(report\?uri=[^"]+)"', response.text).group(1)
    sample = api[0].get(f"/trainops/{html.unescape(href)}", headers=bearer(api))
    assert sample.status_code == 200
    assert main_text(sample.text).startswith(f"sample.jsonl {sample_uri}")
    assert "n001-0000005" in sample.text  # a quarantined row (empty text)


def test_report_staged_on_s3_is_read_with_the_storage_client(api, s3_root, monkeypatch):
    from trainops.staging.demo_data import write_demo_dataset
    from trainops.staging.stage import stage_dataset

    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", s3_root)
    source = write_demo_dataset(s3_root.replace("/root", "/raw"), rows=300, seed=3)
    staged = stage_dataset(open_storage(s3_root), s3_root, source["uri"], "web-text")

    response = get(api, join(staged["uri"], "validation.json"))
    assert response.status_code == 200, response.text
    text = page_text(response.text)
    assert "Validation PASSED" in text
    assert ["Rows checked", "300"] in page_tables(response.text)[0]

    bucket = s3_root.split("/")[2]
    for outside in (
        f"s3://other-{bucket}/root/datasets/x/v/validation.json",
        f"s3://{bucket}/raw/part-00000.json",
        f"s3://{bucket}/root-copy/datasets/x/v/validation.json",
    ):
        refused = get(api, outside)
        assert refused.status_code == 403, outside
        assert f"uri '{outside}' is outside the trainops storage roots" in page_text(refused.text)


def test_a_storage_outage_is_a_503_page_that_names_it(api, faulty_s3_root, s3_faults, monkeypatch):
    # A page's storage request gives up after 0.5 s here (scaled down from 10 s).
    monkeypatch.setattr(access, "OUTAGE_TOLERANCE_S", 0.5)
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", faulty_s3_root)
    uri = join(faulty_s3_root, "models", "demo-lm", "versions", "1", "card.json")
    open_storage(uri).put_json(uri, {"model": "demo-lm", "version": 1})
    s3_faults.blackout()

    response = get(api, uri)

    assert response.status_code == 503
    assert response.headers["retry-after"] == "30"
    text = page_text(response.text)
    # The first request of a page is a HEAD, whose 503 has no body to name the code.
    assert f"storage is unavailable: reading '{uri}' kept failing for 0.5 s (last: refused (503))" in text
    assert (
        f"This is an outage of the storage behind '{faulty_s3_root}', not a missing report: reload "
        "this page in a minute"
    ) in text
    s3_faults.end_blackout()
    assert get(api, uri).status_code == 200


def test_uris_outside_the_root_are_refused(api, root, tmp_path):
    outside = tmp_path / "elsewhere" / "secret.json"
    outside.parent.mkdir()
    outside.write_text('{"password_hint": "TOP-SECRET"}')

    response = get(api, f"file://{outside}")
    assert response.status_code == 403
    assert "TOP-SECRET" not in response.text
    assert f"uri 'file://{outside}' is outside the trainops storage roots ['{root}']" in page_text(
        response.text
    )

    traversal = f"{root}/datasets/../../elsewhere/secret.json"
    response = get(api, traversal)
    assert response.status_code == 400
    assert "TOP-SECRET" not in response.text
    assert f"uri '{traversal}' contains a '.' or '..' segment" in page_text(response.text)

    link = tmp_path / "root" / "datasets" / "d" / "v" / "validation.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    response = get(api, f"file://{link}")
    assert response.status_code == 403
    assert "TOP-SECRET" not in response.text
    assert "leads outside the storage root" in page_text(response.text)


@pytest.mark.parametrize(
    ("uri", "status", "message"),
    [
        ("", 400, "the uri parameter is empty"),
        ("http://example.com/validation.json", 400, "is not a trainops storage URI"),
        ("/etc/passwd", 400, "is not a trainops storage URI"),
        (
            "{root}/runs/d/r/t/checkpoints/step_1/shard-0.distcp",
            400,
            "is not a report: only files ending in .json, .md",
        ),
        ("{root}/datasets/d/v/validation.json", 404, "no report at"),
    ],
)
def test_bad_requests_say_what_is_wrong(api, root, uri, status, message):
    response = get(api, uri.format(root=root))
    assert response.status_code == status
    assert message in page_text(response.text)


def test_requests_without_a_login_are_refused(api, root):
    storage = open_storage(root)
    uri = join(root, "datasets", "d", "v", "validation.json")
    storage.put_json(
        uri,
        {
            "success": True,
            "rows": 12345,
            "failed": [],
            "evaluated_expectations": 1,
            "successful_expectations": 1,
        },
    )

    anonymous = get(api, uri, headers={})
    assert anonymous.status_code == 401
    assert "12345" not in anonymous.text
    assert "Not authenticated: log in to Airflow" in page_text(anonymous.text)
    forged = get(api, uri, headers={"Authorization": "Bearer not-a-jwt"})
    assert forged.status_code in (401, 403) and "12345" not in forged.text

    logged_in = api[0].get(
        "/trainops/report", params={"uri": uri}, cookies={"_token": bearer(api)["Authorization"].split()[1]}
    )
    assert logged_in.status_code == 200 and "12345" in logged_in.text

    no_role = get(api, uri, headers=bearer(api, role=None, name="nobody"))
    assert no_role.status_code == 403
    assert "user 'nobody' may not read trainops reports" in page_text(no_role.text)


def test_gate_decision_needs_access_to_its_dag(api, root):
    from trainops.operators.gate import EvaluationGateOperator

    run_uri = join(root, "runs", "retrain", "manual_1", "train")
    gate = EvaluationGateOperator(
        task_id="gate",
        storage_root=root,
        aws_conn_id=None,
        checks=[{"name": ATTACK, "kind": "threshold", "metric": "eval_loss", "op": "<=", "value": 3.0}],
        evaluation={
            "run_uri": run_uri,
            "model_name": "demo-lm",
            "candidate": {"eval_loss": 3.5},
            "production": None,
            "production_version": None,
        },
    ).execute({})

    response = get(api, gate["gate_uri"])
    assert response.status_code == 200, response.text
    text = page_text(response.text)
    assert "Evaluation gate decision" in text and "Gate REJECTED" in text
    assert [ATTACK, "eval_loss", "3.5", "<= 3", "FAIL", ""] in table_with(response.text, "Check")
    assert "<script>" not in response.text

    refused = get(api, gate["gate_uri"], headers=bearer(api, role=None, name="nobody"))
    assert refused.status_code == 403
    assert "user 'nobody' may not read task reports of DAG 'retrain'" in page_text(refused.text)


def test_run_report_draws_the_loss_curve_from_the_metrics_beside_job_json(api, root, tmp_path):
    run_uri = join(root, "runs", "retrain", "manual_1", "train")
    storage = open_storage(root)
    job_uri = join(run_uri, "job.json")
    storage.put_json(job_uri, run_job(run_uri=run_uri, config_uri=join(run_uri, "config.yaml")))
    storage.put(join(run_uri, "metrics.jsonl"), RUN_METRICS.encode())

    response = get(api, job_uri)
    assert response.status_code == 200, response.text
    assert "default-src 'none'" in response.headers["content-security-policy"]
    page = response.text
    text = main_text(page)
    assert text.startswith(f"Training run: retrain / manual_1 / train {job_uri} TRAINED, not evaluated Steps")
    assert ["Preemptions", "1"] in table_with(page, "Status")
    assert dict(table_with(page, "Status"))["Metrics"] == join(
        run_uri, "metrics.jsonl"
    )  # an older run's file
    assert svgs(page)["Training loss by step"].count("<polyline") == 2
    assert "No evaluation yet" in text
    assert "attempt 1 (preempted)" in text and "attempt 2 (succeeded)" in text
    assert table_with(page, "Attempt")[2][:4] == ["attempt 2", "5", "6 to 10", "4,000"]
    assert [row[:5] for row in table_with(page, "Attempt", skip=1)[1:]] == [
        ["1", "spot", "2026-01-01T00:00:00+00:00", "2026-01-01T00:10:00+00:00", "preempted"],
        ["2", "on-demand", "2026-01-01T00:11:00+00:00", "2026-01-01T00:20:00+00:00", "succeeded"],
    ]
    assert "Raw JSON" in text and "SECRET-1" not in page and "<script" not in page

    # the evaluate task's result beside it is the last eval point of the loss curve
    storage.put_json(join(run_uri, "eval", "metrics.json"), {"candidate": {"eval_loss": 2.75}})
    evaluated = get(api, job_uri).text
    assert "eval loss (held-out split) at 10: 2.75" in svgs(evaluated)["Training loss by step"]
    # one that does not parse is no evaluation, not a broken page
    storage.put(join(run_uri, "eval", "metrics.json"), b"{not json")
    damaged = get(api, job_uri)
    assert damaged.status_code == 200 and "No evaluation yet" in page_text(damaged.text)

    refused = get(api, job_uri, headers=bearer(api, role=None, name="nobody"))
    assert refused.status_code == 403 and "<svg" not in refused.text

    os.remove(_split_path(join(run_uri, "metrics.jsonl")))
    missing = get(api, job_uri)
    assert missing.status_code == 200, missing.text
    assert "<svg" not in missing.text
    assert "No loss curve: no metrics were found next to job.json (no step logged yet?)." in page_text(
        missing.text
    )
    assert table_with(missing.text, "Attempt")[1][4] == "preempted"

    # The sibling passes the same root checks: a symbolic link out of the root is not followed.
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"step": 1, "loss": 1234.5, "attempt": 1}\n')
    os.symlink(outside, _split_path(join(run_uri, "metrics.jsonl")))
    linked = get(api, job_uri)
    assert linked.status_code == 200 and "<svg" not in linked.text and "1234" not in linked.text
    assert "leads outside the storage root" in page_text(linked.text)


def test_run_report_reads_the_metrics_parts_and_on_a_reload_only_the_new_ones(api, root, monkeypatch):
    from trainer.contract import RunLayout
    from trainer.runtime.metrics import MetricsLog

    access._readers.clear()
    layout = RunLayout(join(root, "runs", "retrain", "manual_2", "train"))
    storage = open_storage(root)
    storage.put_json(layout.job, run_job(run_uri=layout.run_uri))
    log = MetricsLog(storage, layout.metrics, attempt=1, flush_every=5)
    for step in range(1, 11):
        log.add(step=step, loss=10.0 / step, lr=0.1, tokens_per_s=100.0, time=float(step))
    page = get(api, layout.job).text
    assert svgs(page)["Training loss by step"].count("<polyline") == 1
    assert ["Last logged step", "10"] in table_with(page, "Status")
    assert dict(table_with(page, "Status"))["Metrics"] == layout.metrics_parts + "/"
    [(reader, _lock)] = access._readers._kept.values()
    before = reader.bytes_read
    for step in range(11, 16):
        log.add(step=step, loss=10.0 / step, lr=0.1, tokens_per_s=100.0, time=float(step))
    page = get(api, layout.job).text
    assert ["Last logged step", "15"] in table_with(page, "Status")
    assert reader.bytes_read - before == len(storage.get(layout.metrics_part(1, 3)))  # the new part only

    # the cap holds for the parts together: past it the page says so and draws no curve
    access._readers.clear()
    monkeypatch.setattr(access, "MAX_METRICS_BYTES", 2 * len(storage.get(layout.metrics_part(1, 1))))
    capped = get(api, layout.job)
    assert capped.status_code == 200 and "<svg" not in capped.text
    assert "bytes this reader may read" in page_text(capped.text)


def test_run_report_leads_with_the_outcome_read_beside_job_json(api, root):
    """The page's first line: a live run's step of its config's max_steps, a finished one's gate
    verdict, or what the promote task recorded; none of them "predates" cost accounting."""
    import time

    from trainer.contract import RunLayout
    from trainer.runtime.metrics import MetricsLog

    access._readers.clear()
    live = RunLayout(join(root, "runs", "retrain", "live_1", "train"))
    storage = open_storage(root)
    storage.put(live.config, b"train:\n  max_steps: 100\n")
    storage.put_json(
        live.job,
        run_job(run_uri=live.run_uri, config_uri=live.config, status="running", attempts=[]),
    )
    log = MetricsLog(storage, live.metrics, attempt=1, flush_every=10)
    now = time.time()
    for step in range(1, 21):
        log.add(step=step, loss=3.0, lr=0.1, tokens_per_s=100.0, time=now - 60 + 2 * step)
    text = main_text(get(api, live.job).text)
    assert text.startswith(f"Training run: retrain / live_1 / train {live.job} RUNNING: step 20/100, about ")
    assert "predates" not in text

    done = RunLayout(join(root, "runs", "retrain", "done_1", "train"))
    storage.put_json(done.job, run_job(run_uri=done.run_uri))
    check = {
        "name": "loss under 3",
        "metric": "eval_loss",
        "observed": 3.4,
        "expected": "<= 3",
        "passed": False,
    }
    storage.put_json(done.eval_gate, {"approved": False, "checks": [check]})
    text = main_text(get(api, done.job).text)
    assert f"{done.job} REJECTED: loss under 3: eval_loss (observed 3.4, expected <= 3) Steps" in text
    storage.put_json(done.eval_gate, {"approved": True, "checks": [{**check, "passed": True}]})
    storage.put_json(done.promotion, {"outcome": "identical", "version": 4})
    assert f"{done.job} IDENTICAL to production v4 Steps" in main_text(get(api, done.job).text)


def _split_path(file_uri: str) -> str:
    return file_uri[len("file://") :]


def test_model_card_and_markdown(api, root):
    from trainops.registry.promotion import promote

    storage = open_storage(root)
    export = join(root, "runs", "retrain", "manual_1", "train", "export")
    storage.put(join(export, "model.safetensors"), b"weights")
    result = promote(
        storage,
        root,
        "demo-lm",
        export_uri=export,
        card={
            "run_uri": join(root, "runs", "retrain", "manual_1", "train"),
            "config_uri": "s3://elsewhere/config.yaml",
            "metrics": {"candidate": {"eval_loss": 2.5}},
        },
        expected_production_version=None,
    )

    response = get(api, join(result["version_uri"], "card.json"))
    assert response.status_code == 200, response.text
    text = main_text(response.text)
    assert text.startswith("Model card: demo-lm v1")
    assert "Eval loss 2.5" in text and "model.safetensors" in text
    # URIs under the storage root link to their report page; one outside it is only shown
    job_link = "report?" + urlencode({"uri": join(root, "runs", "retrain", "manual_1", "train", "job.json")})
    assert f'href="{html.escape(job_link)}"' in response.text
    assert "<code>s3://elsewhere/config.yaml</code>" in response.text
    assert "report?uri=s3" not in response.text

    notes = join(result["version_uri"], "NOTES.md")
    storage.put(notes, b"# Notes\n<b>bold</b> & more")
    response = get(api, notes)
    assert response.status_code == 200
    assert "<pre># Notes\n&lt;b&gt;bold&lt;/b&gt; &amp; more</pre>" in response.text


def test_extra_roots_come_from_the_environment(api, root, tmp_path, monkeypatch):
    other = f"file://{tmp_path}/other-root"
    uri = join(other, "runs", "d", "r", "t", "eval", "gate.json")
    open_storage(other).put_json(uri, {"approved": True, "checks": []})
    assert get(api, uri).status_code == 403

    monkeypatch.setenv("TRAINOPS_REPORT_ROOTS", f"{other}, s3://reports-bucket/trainops")
    assert get(api, uri).status_code == 200

    monkeypatch.setenv("TRAINOPS_REPORT_ROOTS", "relative/path")
    response = get(api, uri)
    assert response.status_code == 500
    assert "$TRAINOPS_REPORT_ROOTS entry 'relative/path' is invalid" in page_text(response.text)


# ----------------------------------------------------------------------------- cost and the fleet


def _costed_job(run_uri: str, **fields) -> dict:
    from tests.trainops.cost.fixtures import one_preemption_cost, one_preemption_job

    job, _ = one_preemption_job()
    return {
        **job,
        "run_uri": run_uri,
        "config_uri": join(run_uri, "config.yaml"),
        "cost": one_preemption_cost(),
        **fields,
    }


def _put_run(storage, root: str, dag: str, run: str, job: dict | bytes, mtime: float) -> str:
    uri = join(root, "runs", dag, run, "train", "job.json")
    if isinstance(job, bytes):
        storage.put(uri, job)
    else:
        storage.put_json(uri, job)
    os.utime(_split_path(uri), (mtime, mtime))
    return uri


def test_run_report_draws_the_timeline_and_the_cost_table(api, root):
    from tests.trainops.cost.fixtures import one_preemption_cost, one_preemption_job
    from trainops.cost.money import money

    run_uri = join(root, "runs", "nightly", "scheduled_1", "train")
    storage = open_storage(root)
    storage.put_json(join(run_uri, "job.json"), _costed_job(run_uri))
    storage.put(
        join(run_uri, "metrics.jsonl"),
        "".join(json.dumps(r) + "\n" for r in one_preemption_job()[1]).encode(),
    )
    response = get(api, join(run_uri, "job.json"))
    assert response.status_code == 200, response.text
    assert "default-src 'none'" in response.headers["content-security-policy"]
    page = response.text
    assert page.count('class="chart timeline"') == 1 and page.count('class="preemption"') == 1
    assert page.count('class="phase"') == 16
    cost = dict(table_with(page, "Goodput (productive / billed GPU time)"))
    assert cost["Goodput (productive / billed GPU time)"] == "47.2%"
    assert cost["Spot savings (estimate)"] == money(one_preemption_cost()["savings"])
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def fleet(api, headers: dict | None = None, **params):
    return api[0].get("/trainops/fleet", params=params, headers=bearer(api) if headers is None else headers)


def _fleet_rows(html_text: str, dag: str) -> list[list[str]]:
    text = page_text(html_text)
    tables = [t for t in page_tables(html_text) if t[0][0] == "Run / task"]
    dags = [d for d in ("adhoc", "nightly") if f" {d} " in text]
    return tables[dags.index(dag)][1:]


def test_fleet_page_over_a_folder_of_runs(api, root, tmp_path):
    from tests.trainops.cost.fixtures import one_preemption_cost
    from trainops.cost.money import money

    storage = open_storage(root)
    for i in (1, 2, 3):
        _put_run(
            storage, root, "nightly", f"r{i}", _costed_job(f"{root}/runs/nightly/r{i}/train"), 1000.0 * i
        )
    old = _costed_job(f"{root}/runs/nightly/old/train")
    del old["cost"]
    _put_run(storage, root, "nightly", "old", old, 500.0)
    _put_run(storage, root, "nightly", "broken", b"{", 2500.0)
    _put_run(storage, root, "adhoc", "a1", _costed_job(f"{root}/runs/adhoc/a1/train"), 100.0)
    # a DAG whose own storage_root lies below the served root, with a mapped training task
    team = join(root, "teams", "nlp")
    nested = _put_run(storage, team, "nightly", "t1", _costed_job(f"{team}/runs/nightly/t1/train"), 1500.0)
    storage.put_json(nested.replace("/train/job.json", "/train.3/job.json"), _costed_job(team))
    os.utime(_split_path(nested.replace("/train/job.json", "/train.3/job.json")), (1400.0, 1400.0))
    # not a run: a "runs" folder inside a run, which would name another DAG than its report's
    storage.put_json(join(root, "runs", "nightly", "r1", "train", "runs", "x", "y", "z", "job.json"), {})
    # not runs: a checkpoint, a gate decision, a job.json at the wrong depth
    storage.put(join(root, "runs", "nightly", "r1", "train", "checkpoints", "step_1", "x.distcp"), b"x")
    storage.put_json(join(root, "runs", "nightly", "r1", "train", "eval", "gate.json"), {"approved": True})
    storage.put_json(join(root, "runs", "nightly", "job.json"), _costed_job(root))
    # a run whose job.json is a symbolic link out of the root, written last
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({**_costed_job(root), "status": "TOP-SECRET"}))
    os.utime(outside, (9000.0, 9000.0))
    linked = _split_path(join(root, "runs", "nightly", "linked", "train", "job.json"))
    os.makedirs(os.path.dirname(linked))
    os.symlink(outside, linked)

    response = fleet(api)
    assert response.status_code == 200, response.text
    assert "default-src 'none'" in response.headers["content-security-policy"]
    html_text = response.text
    assert "TOP-SECRET" not in html_text and "<script" not in html_text
    nightly = _fleet_rows(html_text, "nightly")
    assert [row[0] for row in nightly] == [
        "linked / train",
        "r3 / train",
        "broken / train",
        "r2 / train",
        "t1 / train",
        "t1 / train.3",
        "r1 / train",
        "old / train",
    ]
    by_run = {row[0]: row for row in nightly}
    assert (
        by_run["linked / train"][1] == "unreadable"
        and "leads outside the storage root" in by_run["linked / train"][2]
    )
    assert by_run["broken / train"][1] == "unreadable"
    assert by_run["broken / train"][2].startswith(
        join(root, "runs", "nightly", "broken", "train", "job.json") + " is not valid JSON (Expecting "
        "property name enclosed in double quotes: line 1 column 2 (char 1)), perhaps cut short; the "
        "run's record is damaged"
    )
    assert by_run["old / train"][2].startswith("no cost in job.json: a run older than cost accounting")
    expected = one_preemption_cost()
    assert by_run["r3 / train"][2:] == [
        money(expected["cost"]),
        money(expected["on_demand_cost"]),
        money(expected["savings"]),
        "47.2%",
        "1",
        "0.169",
    ]
    assert [row[0] for row in _fleet_rows(html_text, "adhoc")] == ["a1 / train"]
    assert Svg(html_text).svgs == 2  # a cost and a goodput trend for nightly; adhoc has one run
    assert dict(page_tables(html_text)[0])["Runs with a cost"] == "6"

    # each row links to the run's report, which the app serves
    href = re.search(r'href="(report\?uri=[^"]*r3[^"]*)"', html_text).group(1)
    assert api[0].get(f"/trainops/{html.unescape(href)}", headers=bearer(api)).status_code == 200

    two = fleet(api, limit="2")
    assert [row[0] for row in _fleet_rows(two.text, "nightly")] == ["linked / train", "r3 / train"]
    assert main_text(two.text).startswith("Training cost of the fleet The last 2 runs of each DAG")
    only = fleet(api, dag="adhoc")
    assert main_text(only.text).startswith("Training cost: adhoc") and "r3 / train" not in only.text
    assert "The last 100 runs" in page_text(fleet(api, limit="100000").text)

    # DAGs the user may not read are counted, not read
    runs, hidden, problems = find_runs([root], None, limit=20, may_read=lambda dag: dag != "nightly")
    assert ([r["run_id"] for r in runs], hidden, problems) == (["a1"], 1, [])


def test_fleet_page_refusals_and_empty_cases(api, root):
    assert "No training runs were found under the storage roots." in page_text(fleet(api).text)
    bad = fleet(api, limit="lots")
    assert bad.status_code == 400
    assert "limit 'lots' is not a positive whole number: pass ?limit=20 (at most 100)" in page_text(bad.text)
    assert fleet(api, limit="0").status_code == 400
    assert fleet(api, dag="..").status_code == 400
    assert fleet(api, headers={}).status_code == 401
    refused = fleet(api, headers=bearer(api, role=None, name="nobody"))
    assert refused.status_code == 403 and "user 'nobody' may not read trainops reports" in page_text(
        refused.text
    )


def test_the_plugin_puts_the_home_and_fleet_pages_in_airflows_navigation(api, root):
    from trainops.plugin import TrainopsPlugin

    home, fleet_view = TrainopsPlugin.external_views
    assert (home["href"], home["url_route"]) == ("/trainops/", "trainops-home")
    assert (fleet_view["href"], fleet_view["url_route"]) == ("/trainops/fleet", "trainops-fleet")
    listed = api[0].get("/api/v2/plugins", headers=bearer(api, role="admin"))
    assert listed.status_code == 200, listed.text
    [trainops] = [p for p in listed.json()["plugins"] if p["name"] == "trainops"]
    assert [(v["name"], v["href"], v["category"]) for v in trainops["external_views"]] == [
        ("trainops", "/trainops/", "browse"),
        ("Training cost", "/trainops/fleet", "browse"),
    ]
    for view in (home, fleet_view):
        assert api[0].get(view["href"], headers=bearer(api)).status_code == 200


def test_fleet_page_during_a_storage_outage_names_it(api, faulty_s3_root, s3_faults, monkeypatch):
    # A page's storage request gives up after 0.5 s here (scaled down from 10 s).
    monkeypatch.setattr(access, "OUTAGE_TOLERANCE_S", 0.5)
    monkeypatch.setenv("TRAINOPS_STORAGE_ROOT", faulty_s3_root)
    storage = open_storage(faulty_s3_root)
    for run in ("r1", "r2"):
        run_uri = join(faulty_s3_root, "runs", "nightly", run, "train")
        storage.put_json(join(run_uri, "job.json"), _costed_job(run_uri))
    # written within a second (S3 keeps seconds): the higher run id first
    assert [row[0] for row in _fleet_rows(fleet(api).text, "nightly")] == ["r2 / train", "r1 / train"]

    s3_faults.blackout()
    response = fleet(api)
    assert response.status_code == 200
    assert (
        f"storage is unavailable: listing '{faulty_s3_root}' kept failing for 0.5 s, so its runs are "
        "not shown; reload this page in a minute"
    ) in page_text(response.text)
    s3_faults.end_blackout()
