"""StageDatasetOperator(engine="spark"): the Spark engine driven from the Airflow worker."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from trainops.hooks.storage import storage_for
from trainops.staging.spark.session import remote_from_connection
from trainops.staging.spark.stage import stage_dataset_spark


def stage_on_spark(op: Any, root: str) -> dict:
    """Stage with the Spark engine, driven from this worker (local mode or Spark Connect);
    ``op`` is the StageDatasetOperator. Returns the same record as in-worker staging."""
    remote = op.spark_remote
    if remote is None and op.spark_conn_id:
        conn = BaseHook.get_connection(op.spark_conn_id)
        remote = remote_from_connection(op.spark_conn_id, conn.host, conn.port)
    return stage_dataset_spark(
        storage_for(root, op.aws_conn_id),
        root,
        op.source_uri,
        op.dataset_name,
        source_storage=storage_for(op.source_uri, op.aws_conn_id),
        expectations=op.expectations,
        tokenizer=op.tokenizer,
        quarantine=op.quarantine,
        eval_percent=op.eval_percent,
        slice_columns=op.slice_columns,
        shard_tokens=op.shard_tokens,
        open_storage=lambda uri: storage_for(uri, op.aws_conn_id),
        spark_remote=remote,
        spark_conf=op.spark_conf,
        log=op.log,
    )
