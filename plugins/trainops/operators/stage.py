"""StageDatasetOperator: validate a raw dataset with GX and stage it as token shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from trainops.staging.expectations import normalize_expectations
from trainops.staging.reader import DEFAULT_BATCH_ROWS
from trainops.staging.stage import check_options
from trainops.staging.tokenize import DEFAULT_EVAL_PERCENT, DEFAULT_SHARD_TOKENS

_CLUSTERS = ("local", "kubernetes")


class StageDatasetOperator(BaseOperator):
    """Validate ``source_uri`` with great-expectations, then tokenize and pack it into shards.

    The result is a content-addressed dataset version under
    ``<storage_root>/datasets/<dataset_name>/<version>/`` with a ``manifest.json`` the
    trainer reads. Staging the same source with the same options again reuses the
    existing version without reading the data. When validation fails, the task fails
    without retrying, nothing is written, and the error lists every failed expectation
    with its column, unexpected count and sample ids.

    Returns (XCom) ``{"dataset_name", "version", "uri", "manifest_uri", "rows",
    "train_tokens", "eval_tokens", "reused"}``; ``uri`` is the ``data_uri`` to train on.

    :param source_uri: a Parquet/JSONL/CSV object or a folder of them, ``file://`` or
        ``s3://``. (templated)
    :param dataset_name: name of the dataset under ``<storage_root>/datasets/``. (templated)
    :param expectations: the suite as a list of ``{"type": "expect_...", "kwargs": {...}}``
        dicts; defaults to the built-in suite (id not null and unique, text not null with
        length 1..20000, source not null, 1..100M rows).
    :param eval_percent: share of records (by a hash of their id, so stable across
        versions) that go to the eval split, 1 to 50.
    :param slice_columns: columns recorded in the eval index for per-slice evaluation.
    :param shard_tokens: tokens per shard file.
    :param storage_root: storage root URI; defaults to the embedded root. (templated)
    :param aws_conn_id: Airflow AWS connection for ``s3://``; when it is not defined,
        boto3's default credential chain is used.
    :param cluster: where the work runs; accepted for uniformity with the other
        operators, staging always runs in the Airflow worker for now.
    """

    template_fields: Sequence[str] = ("source_uri", "dataset_name", "storage_root")
    ui_color = "#e8f4e8"

    def __init__(
        self,
        *,
        source_uri: str,
        dataset_name: str,
        expectations: list[dict] | None = None,
        eval_percent: int = DEFAULT_EVAL_PERCENT,
        slice_columns: Sequence[str] = ("source",),
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        cluster: str = "local",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_options(eval_percent=eval_percent, shard_tokens=shard_tokens,
                      slice_columns=slice_columns)
        if cluster not in _CLUSTERS:
            raise ValueError(f"cluster must be one of {_CLUSTERS}, got {cluster!r}")
        self.source_uri = source_uri
        self.dataset_name = dataset_name
        self.expectations = (
            normalize_expectations(expectations) if expectations is not None else None
        )
        self.eval_percent = eval_percent
        self.slice_columns = list(slice_columns)
        self.shard_tokens = shard_tokens
        self.storage_root = storage_root
        self.aws_conn_id = aws_conn_id
        self.cluster = cluster

    def execute(self, context: Context) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from trainops.settings import resolve_storage_root
        from trainops.staging.errors import StagingError
        from trainops.staging.stage import stage_dataset
        from trainops.storage_conn import storage_for

        if not self.dataset_name or not str(self.dataset_name).strip():
            raise ValueError("dataset_name is empty: give the dataset a name such as 'demo'")
        root = resolve_storage_root(self.storage_root)
        try:
            result = stage_dataset(
                storage_for(root, self.aws_conn_id), root, self.source_uri, self.dataset_name,
                source_storage=storage_for(self.source_uri, self.aws_conn_id),
                expectations=self.expectations, eval_percent=self.eval_percent,
                slice_columns=self.slice_columns, shard_tokens=self.shard_tokens,
                batch_rows=DEFAULT_BATCH_ROWS, log=self.log,
            )
        except StagingError as exc:
            # The same data fails the same way on every try; retries only add delay.
            raise AirflowFailException(str(exc)) from exc
        self.log.info(
            "%s dataset %s version %s: %d rows, %d train tokens, %d eval tokens at %s",
            "reused" if result["reused"] else "staged", result["dataset_name"],
            result["version"], result["rows"], result["train_tokens"], result["eval_tokens"],
            result["uri"],
        )
        return result

