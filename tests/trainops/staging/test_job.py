"""The staging job's side: the request it reads and the result record it writes, over
``file://`` in the test's folder (the operator's side is tests/trainops/operators/test_stage_job.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainer
import trainops
from trainer.storage import open_storage
from trainops.staging.demo_data import write_demo_dataset
from trainops.staging.errors import QuarantineExceeded, SourceUnreachable, StagingError
from trainops.staging.job import build_request, failure_record, main, run
from trainops.staging.stage import stage_dataset


def _request(tmp_path, source_uri: str, **changes) -> dict:
    options = {
        "root": f"file://{tmp_path}/root",
        "source_uri": source_uri,
        "dataset_name": "demo",
        "expectations": None,
        "tokenizer": None,
        "quarantine": None,
        "eval_percent": 10,
        "slice_columns": ("source",),
        "shard_tokens": 4096,
        "result_uri": f"file://{tmp_path}/jobs/stage-1/result.json",
        "task": "causal_lm",
        "labels": None,
    }
    options.update(changes)
    return json.loads(json.dumps(build_request(**options)))  # it reaches the job as JSON


def _put_request(request: object, uri: str) -> str:
    open_storage(uri).put_json(uri, request)
    return uri


def test_the_request_holds_every_option_as_plain_json(tmp_path):
    suite = [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]
    request = _request(
        tmp_path,
        "s3://bucket/raw",
        expectations=suite,
        tokenizer={"uri": "s3://bucket/tok.json", "eos_token": "</s>"},
        quarantine={"max_fraction": 0.01, "sample_rows": 5},
    )
    assert request == {
        "version": 1,
        "root": f"file://{tmp_path}/root",
        "source_uri": "s3://bucket/raw",
        "dataset_name": "demo",
        "expectations": suite,
        "tokenizer": {"uri": "s3://bucket/tok.json", "eos_token": "</s>"},
        "quarantine": {"max_fraction": 0.01, "sample_rows": 5},
        "eval_percent": 10,
        "slice_columns": ["source"],
        "shard_tokens": 4096,
        "result_uri": f"file://{tmp_path}/jobs/stage-1/result.json",
        "task": "causal_lm",
        "labels": None,
    }


def test_a_callable_suite_cannot_cross_into_a_job(tmp_path):
    def build_suite():
        return [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]

    with pytest.raises(TypeError, match="resolve a callable suite before building a staging job request"):
        _request(tmp_path, "s3://bucket/raw", expectations=build_suite)


def test_a_staged_source_gives_the_same_result_as_staging_in_the_worker(tmp_path):
    source = write_demo_dataset(f"file://{tmp_path}/raw", rows=200, seed=7, files=2)
    request = _request(tmp_path, source["uri"])
    record = run(request, open_storage)
    assert record["status"] == "staged" and set(record) == {"status", "result"}
    assert open_storage(request["result_uri"]).get_json(request["result_uri"]) == record
    result = record["result"]
    assert result["rows"] == 200 and result["reused"] is False
    assert open_storage(result["manifest_uri"]).exists(result["manifest_uri"])
    in_worker = stage_dataset(
        open_storage(request["root"]), request["root"], source["uri"], "demo", shard_tokens=4096
    )
    assert in_worker == dict(result, reused=True)  # the very version the job committed


def test_bad_data_is_recorded_with_its_class_message_and_report(tmp_path):
    source = write_demo_dataset(f"file://{tmp_path}/raw", rows=200, seed=7, corrupt=True)
    request = _request(tmp_path, source["uri"])
    record = run(request, open_storage)
    assert open_storage(request["result_uri"]).get_json(request["result_uri"]) == record
    assert (record["status"], record["error"]) == ("failed", "DataValidationError")
    assert "failed 3 of 6 expectations over 200 rows, so nothing was staged" in record["message"]
    assert record["report_uri"].startswith(f"{request['root']}/datasets/demo/")
    assert record["message"].endswith(f"Full report: {record['report_uri']}")
    assert open_storage(record["report_uri"]).get_json(record["report_uri"])["success"] is False


def test_a_missing_source_is_recorded_by_name(tmp_path):
    request = _request(tmp_path, f"file://{tmp_path}/nowhere")
    record = run(request, open_storage)
    assert (record["status"], record["error"], record["report_uri"]) == ("failed", "SourceNotFound", None)
    assert record["message"].startswith(f"source_uri 'file://{tmp_path}/nowhere' does not exist")


def test_an_unexpected_error_is_recorded_with_its_class_in_the_message(tmp_path):
    request = _request(tmp_path, f"file://{tmp_path}/raw", eval_percent=0)
    assert run(request, open_storage) == {
        "status": "failed",
        "error": "Error",
        "message": "ValueError: eval_percent must be an integer from 1 to 50, got 0",
        "report_uri": None,
    }


@pytest.mark.parametrize(
    "exc, record",
    [
        (StagingError("no rows"), {"error": "StagingError", "message": "no rows", "report_uri": None}),
        (
            QuarantineExceeded("6 bad rows", {}, "s3://b/v/validation.json"),
            {
                "error": "QuarantineExceeded",
                "message": "6 bad rows",
                "report_uri": "s3://b/v/validation.json",
            },
        ),
        (
            SourceUnreachable("endpoint down"),
            {"error": "SourceUnreachable", "message": "endpoint down", "report_uri": None},
        ),
        (KeyError("text"), {"error": "Error", "message": "KeyError: 'text'", "report_uri": None}),
    ],
)
def test_failure_records_name_the_errors_the_operator_maps_back(exc, record):
    assert failure_record(exc) == {"status": "failed", **record}


def test_a_request_of_another_version_is_refused_before_staging(tmp_path):
    request = dict(_request(tmp_path, f"file://{tmp_path}/raw"), version=2)
    with pytest.raises(ValueError, match="staging request version 2: this trainops reads version 1"):
        run(request, open_storage)
    assert not open_storage(request["result_uri"]).exists(request["result_uri"])


def test_main_stages_and_says_what_it_staged(tmp_path, capsys):
    source = write_demo_dataset(f"file://{tmp_path}/raw", rows=150, seed=3, files=1)
    request = _request(tmp_path, source["uri"])
    assert main(["--request", _put_request(request, f"file://{tmp_path}/jobs/stage-1/request.json")]) == 0
    result = open_storage(request["result_uri"]).get_json(request["result_uri"])["result"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"staged demo version {result['version']}: 150 rows, {result['train_tokens']} train and "
        f"{result['eval_tokens']} eval tokens at {result['uri']}"
    )


def test_main_refuses_a_request_that_is_not_an_object(tmp_path):
    uri = _put_request([1, 2], f"file://{tmp_path}/request.json")
    with pytest.raises(
        SystemExit, match=r"staging request 'file://.*/request.json' is not a JSON object: \[1, 2\]"
    ):
        main(["--request", uri])


def test_the_module_runs_as_the_job_and_exits_1_on_failure(tmp_path):
    request = _request(tmp_path, f"file://{tmp_path}/nowhere")
    uri = _put_request(request, f"file://{tmp_path}/jobs/stage-1/request.json")
    paths = [str(Path(p.__file__).resolve().parents[1]) for p in (trainops, trainer)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    done = subprocess.run(
        [sys.executable, "-m", "trainops.staging.job", "--request", uri],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith(
        f"staging failed: source_uri 'file://{tmp_path}/nowhere' does not exist"
    )
    assert open_storage(request["result_uri"]).get_json(request["result_uri"])["error"] == "SourceNotFound"
