import json

import pytest
from airflow.sdk.exceptions import AirflowFailException

from trainer.storage import open_storage
from trainops.operators.stage import StageDatasetOperator
from trainops.staging.demo_data import write_demo_dataset
from trainops.staging.errors import SourceNotFound


def _op(**kwargs):
    args = dict(task_id="stage", source_uri="file:///nowhere", dataset_name="demo",
                aws_conn_id=None)
    args.update(kwargs)
    return StageDatasetOperator(**args)


def test_execute_returns_the_documented_xcom(file_root, tmp_path):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=400, seed=9)
    op = _op(source_uri=raw["uri"], storage_root=file_root, shard_tokens=4096)
    result = op.execute(context={})
    assert json.loads(json.dumps(result)) == result
    assert set(result) == {"dataset_name", "version", "uri", "manifest_uri", "rows",
                           "train_tokens", "eval_tokens", "reused"}
    assert result["dataset_name"] == "demo" and result["rows"] == 400
    assert result["uri"] == f"{file_root}/datasets/demo/{result['version']}"
    manifest = open_storage(file_root).get_json(result["manifest_uri"])
    assert manifest["splits"]["train"]["tokens"] == result["train_tokens"] > 0
    assert result["reused"] is False
    assert op.execute(context={}) == dict(result, reused=True)


def test_source_on_s3_stages_into_a_file_root(s3_root, file_root):
    raw = write_demo_dataset(f"{s3_root}/raw", rows=150, seed=2, files=1)
    result = _op(source_uri=raw["uri"], storage_root=file_root).execute(context={})
    manifest = open_storage(file_root).get_json(result["manifest_uri"])
    assert manifest["source"]["objects"][0]["uri"] == raw["files"][0]
    assert result["rows"] == 150


def test_failed_validation_fails_the_task_without_retry(file_root, tmp_path):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=200, seed=9, corrupt=True)
    with pytest.raises(AirflowFailException, match="expect_column_values_to_be_unique on 'id'"):
        _op(source_uri=raw["uri"], storage_root=file_root).execute(context={})
    assert open_storage(file_root).list(file_root) == []


def test_missing_source_is_named_and_may_be_retried(file_root, tmp_path):
    missing = f"file://{tmp_path}/not-there/"
    with pytest.raises(SourceNotFound, match="not-there' does not exist"):
        _op(source_uri=missing, storage_root=file_root).execute(context={})


@pytest.mark.parametrize("kwargs, message", [
    ({"eval_percent": 0}, "eval_percent must be an integer from 1 to 50, got 0"),
    ({"eval_percent": 60}, "got 60"),
    ({"expectations": [{"type": "expect_nothing"}]}, "'expect_nothing'"),
    ({"expectations": {"type": "x"}}, "must be a list"),
    ({"slice_columns": "source"}, "got the string 'source'"),
    ({"cluster": "slurm"}, "got 'slurm'"),
])
def test_init_rejects_bad_arguments_without_io(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _op(**kwargs)


def test_templated_fields():
    assert StageDatasetOperator.template_fields == ("source_uri", "dataset_name", "storage_root")
