"""StageDatasetOperator: validate a raw dataset with GX and stage it as token shards."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import Asset, AssetAlias, BaseOperator, Context

from trainops.links import ValidationReportLink
from trainops.staging.assets import ASSET_ALIAS, asset_name, asset_uri, event_extra, is_runtime_name
from trainops.staging.options import check_options, check_quarantine, check_tokenizer
from trainops.staging.reader import DEFAULT_BATCH_ROWS
from trainops.staging.suite import check_suite_spec
from trainops.staging.tokenize import DEFAULT_EVAL_PERCENT, DEFAULT_SHARD_TOKENS

__all__ = ["StageDatasetOperator", "dataset_asset"]

_CLUSTERS = ("local", "kubernetes")
# The report app's XCom key for a staging task's validation report (see trainops.links).
VALIDATION_REPORT_KEY = "trainops_validation_report"


def dataset_asset(dataset_name: str) -> Asset:
    """The Asset a staged dataset's events go to; schedule a DAG on it to retrain on new data.

    ``Asset(name="trainops-dataset-<name>", uri="trainops://datasets/<name>")``.
    """
    return Asset(name=asset_name(dataset_name), uri=asset_uri(dataset_name))


class StageDatasetOperator(BaseOperator):
    """Validate ``source_uri`` with great-expectations, then tokenize and pack it into shards.

    The result is a content-addressed dataset version under
    ``<storage_root>/datasets/<dataset_name>/<version>/`` with a ``manifest.json`` the
    trainer reads. The version hashes the input objects' identities (ETag, or size and
    mtime), the suite, the tokenizer, the split rule, the shard size, the slice columns and
    the quarantine options; staging the same source with the same options again reuses the
    existing version without reading the data. Every row is validated, in bounded-memory
    batches, in one pass that also tokenizes.

    When validation fails, the task fails without retrying; the error lists every failed
    expectation with its column, unexpected count and sample ids, and the full report is
    kept at ``<version>/validation.json`` (no manifest, so nothing that looks staged). Its
    URI is pushed to XCom under ``trainops_validation_report``, on success too.

    Asset: on success the task emits an event for
    ``Asset(name="trainops-dataset-<name>", uri="trainops://datasets/<name>")`` (see
    :func:`dataset_asset`) whose extra holds ``version``, ``rows``, ``tokens``, ``uri`` and
    ``manifest_uri`` (and the split token counts, ``reused``, ``quarantined_rows``). When
    ``dataset_name`` is templated, the name is only known at run time, so the task declares
    ``AssetAlias("trainops-datasets")`` and attaches the event to the dataset's Asset
    through it; DAGs scheduled on the Asset run either way.

    Returns (XCom) ``{"dataset_name", "version", "uri", "manifest_uri", "rows",
    "train_tokens", "eval_tokens", "reused", "validation_uri", "quarantined_rows"}``;
    ``uri`` is the ``data_uri`` to train on.

    :param source_uri: Parquet/JSONL/CSV data, ``file://`` or ``s3://``: one object, a
        prefix (read recursively) or a glob (``s3://b/raw/*.parquet``,
        ``file:///d/**/*.jsonl``). (templated)
    :param dataset_name: name of the dataset under ``<storage_root>/datasets/``. (templated)
    :param expectations: the suite: a list of ``{"type": "expect_...", "kwargs": {...}}``
        dicts or GX expectation objects, a GX ``ExpectationSuite``, a callable returning one
        of those (called when the task runs), or the ``file://`` / ``s3://`` URI of a suite
        JSON file. Defaults to the built-in suite (id not null and unique, text not null with
        length 1..20000, source not null, 1..100M rows). See ``docs/staging.md``.
    :param tokenizer: None for the built-in byte-level tokenizer, or the URI of a Hugging
        Face ``tokenizer.json`` (needs the ``tokenizers`` package on the worker), or
        ``{"uri": ..., "eos_token": "</s>"}``. Shards are uint16, or uint32 when the
        vocabulary needs it.
    :param quarantine: None: any row failing a row expectation fails the task. Or
        ``{"max_fraction": 0.01, "sample_rows": 100}``: such rows are dropped and counted, a
        sample is written to ``<version>/quarantine/sample.jsonl``, and the task fails only
        if more than ``max_fraction`` of the rows were dropped.
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

    operator_extra_links = (ValidationReportLink(),)
    template_fields: Sequence[str] = ("source_uri", "dataset_name", "storage_root")
    ui_color = "#e8f4e8"

    def __init__(
        self,
        *,
        source_uri: str,
        dataset_name: str,
        expectations: list | str | Callable | None = None,
        tokenizer: str | dict | None = None,
        quarantine: dict | None = None,
        eval_percent: int = DEFAULT_EVAL_PERCENT,
        slice_columns: Sequence[str] = ("source",),
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        cluster: str = "local",
        **kwargs: Any,
    ) -> None:
        check_options(eval_percent=eval_percent, shard_tokens=shard_tokens,
                      slice_columns=slice_columns)
        if cluster not in _CLUSTERS:
            raise ValueError(f"cluster must be one of {_CLUSTERS}, got {cluster!r}")
        alias = is_runtime_name(dataset_name)
        outlet = AssetAlias(ASSET_ALIAS) if alias else dataset_asset(dataset_name)
        kwargs["outlets"] = [*_as_list(kwargs.get("outlets")), outlet]
        super().__init__(**kwargs)
        self._alias = alias
        self.source_uri = source_uri
        self.dataset_name = dataset_name
        self.expectations = check_suite_spec(expectations)
        check_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.quarantine = check_quarantine(quarantine)
        self.eval_percent = eval_percent
        self.slice_columns = list(slice_columns)
        self.shard_tokens = shard_tokens
        self.storage_root = storage_root
        self.aws_conn_id = aws_conn_id
        self.cluster = cluster

    def execute(self, context: Context) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from trainops.settings import resolve_storage_root
        from trainops.staging.errors import DataValidationError, StagingError
        from trainops.staging.stage import stage_dataset
        from trainops.storage_conn import storage_for

        if not isinstance(self.dataset_name, str) or not self.dataset_name.strip():
            raise ValueError(f"dataset_name {self.dataset_name!r} is empty: give the dataset a "
                             "name such as 'demo'")
        root = resolve_storage_root(self.storage_root)
        try:
            result = stage_dataset(
                storage_for(root, self.aws_conn_id), root, self.source_uri, self.dataset_name,
                source_storage=storage_for(self.source_uri, self.aws_conn_id),
                expectations=self.expectations, tokenizer=self.tokenizer,
                quarantine=self.quarantine, eval_percent=self.eval_percent,
                slice_columns=self.slice_columns, shard_tokens=self.shard_tokens,
                batch_rows=DEFAULT_BATCH_ROWS,
                open_storage=lambda uri: storage_for(uri, self.aws_conn_id), log=self.log,
            )
        except DataValidationError as exc:
            _push_report(context, exc.report_uri)
            # The same data fails the same way on every try; retries only add delay.
            raise AirflowFailException(str(exc)) from exc
        except StagingError as exc:
            raise AirflowFailException(str(exc)) from exc
        _push_report(context, result["validation_uri"])
        self._emit_asset_event(context, result)
        self.log.info(
            "%s dataset %s version %s: %d rows (%d quarantined), %d train tokens, %d eval "
            "tokens at %s", "reused" if result["reused"] else "staged", result["dataset_name"],
            result["version"], result["rows"], result["quarantined_rows"],
            result["train_tokens"], result["eval_tokens"], result["uri"],
        )
        return result

    def _emit_asset_event(self, context: Context, result: dict) -> None:
        events = context.get("outlet_events")
        if events is None:  # called outside a task run (tests, scripts)
            return
        extra = event_extra(result)
        asset = dataset_asset(result["dataset_name"])
        if self._alias:
            events[AssetAlias(ASSET_ALIAS)].add(asset, extra=extra)
        else:
            events[asset].extra.update(extra)


def _push_report(context: Context, uri: str | None) -> None:
    ti = context.get("ti")
    if ti is not None and uri:
        ti.xcom_push(key=VALIDATION_REPORT_KEY, value=uri)


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
