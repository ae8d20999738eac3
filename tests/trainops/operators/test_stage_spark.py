"""StageDatasetOperator(engine="spark"): the same XCom and report as in-worker staging."""

import pytest

from tests.trainops.staging.spark.session_fixture import spark
from trainer.storage import open_storage
from trainops.operators.stage import StageDatasetOperator
from trainops.staging.demo_data import write_demo_dataset

__all__ = ["spark"]


class _TI:
    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


@pytest.mark.slow
def test_engine_spark_stages_in_local_mode_and_returns_the_documented_xcom(spark, file_root, tmp_path):
    raw = write_demo_dataset(f"file://{tmp_path}/raw", rows=300, seed=9)
    common = {"source_uri": raw["uri"], "dataset_name": "demo", "aws_conn_id": None, "shard_tokens": 4096}
    op = StageDatasetOperator(task_id="stage", storage_root=file_root, engine="spark", **common)
    ti = _TI()
    result = op.execute(context={"ti": ti})
    assert result["rows"] == 300 and result["reused"] is False
    assert ti.pushed == {"trainops_validation_report": result["validation_uri"]}
    manifest = open_storage(file_root).get_json(result["manifest_uri"])
    assert manifest["engine"] == "spark"
    assert manifest["splits"]["train"]["tokens"] == result["train_tokens"] > 0
    worker_root = f"file://{tmp_path}/worker"
    worker = StageDatasetOperator(task_id="stage", storage_root=worker_root, **common).execute(context={})
    assert {k: v for k, v in worker.items() if "uri" not in k} == {
        k: v for k, v in result.items() if "uri" not in k
    }
