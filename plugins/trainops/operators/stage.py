"""StageDatasetOperator: validate a raw dataset with GX and stage it as token shards."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk import Asset, AssetAlias, Context
from airflow.sdk.exceptions import AirflowFailException

from trainer.contract import TASK_CAUSAL_LM, join, run_prefix
from trainer.storage import NotFound
from trainops.cluster.base import JobAlreadyExists
from trainops.hooks.storage import get_json_object, job_env_for, storage_for
from trainops.links import ValidationReportLink
from trainops.operators.base import DEFAULT_IMAGE, ClusterJobOperator, task_identity
from trainops.operators.deadlines import waiting_failed
from trainops.operators.fail_fast import fail_fast
from trainops.operators.job_options import check_renders
from trainops.operators.launch_plan import one_process_job
from trainops.operators.stage_sizing import stage_pod
from trainops.operators.stage_spark import stage_on_spark
from trainops.settings import resolve_storage_root
from trainops.staging.assets import ASSET_ALIAS, asset_name, asset_uri, event_extra, is_runtime_name
from trainops.staging.errors import DataValidationError, StagingError
from trainops.staging.job import build_request
from trainops.staging.options import (
    DEFAULT_SLICE_COLUMNS,
    check_dataset_name,
    check_engine,
    check_labels,
    check_options,
    check_quarantine,
    check_task,
    check_tokenizer,
)
from trainops.staging.reader import DEFAULT_BATCH_ROWS, check_not_empty_parquet, list_source_objects
from trainops.staging.stage import stage_dataset
from trainops.staging.suite import check_suite_spec, resolve_suite
from trainops.staging.tokenize import DEFAULT_EVAL_PERCENT, DEFAULT_SHARD_TOKENS
from trainops.staging.validation import failure_lines
from trainops.triggers.events import check_event

__all__ = ["StageDatasetOperator", "dataset_asset"]

# The report app's XCom key for a staging task's validation report (see trainops.links).
VALIDATION_REPORT_KEY = "trainops_validation_report"


def dataset_asset(dataset_name: str) -> Asset:
    """The Asset a staged dataset's events go to; schedule a DAG on it to retrain on new data.

    ``Asset(name="trainops-dataset-<name>", uri="trainops://datasets/<name>")``.
    """
    return Asset(name=asset_name(dataset_name), uri=asset_uri(dataset_name))


class StageDatasetOperator(ClusterJobOperator):
    """Validate ``source_uri`` with great-expectations, then tokenize and pack it into shards.

    The result is a content-addressed dataset version under
    ``<storage_root>/datasets/<dataset_name>/<version>/`` with a ``manifest.json`` the
    trainer reads. The version hashes the input objects' identities (ETag, or size and
    mtime), the suite, the tokenizer, the split rule, the shard size, the slice columns and
    the quarantine options; staging the same source with the same options again reuses the
    existing version without reading the data. Every row is validated, in bounded-memory
    batches, in one pass that also tokenizes.

    When validation fails, the task fails without retrying; its log names each failed
    expectation on a line of its own (the column, the expectation, the failing rows, a sample),
    the error lists every failed expectation with its column, unexpected count and sample ids,
    and the full report is
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
    :param dataset_name: name of the dataset under ``<storage_root>/datasets/``: one folder, so
        not empty, ``.``, ``..`` or holding a ``/``. (templated)
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
    :param slice_columns: columns recorded in the eval index for per-slice evaluation
        (default: ``source`` for ``causal_lm``, none for ``sft`` and ``classification``).
    :param task: what the dataset is for (``trainer.contract.tasks``): ``causal_lm`` (default;
        a ``text`` column, the default suite above), ``sft`` (``prompt`` and ``response``
        columns; the default suite asks for a non-empty prompt and response in every record;
        each record is staged as one training sample whose response alone is scored) or
        ``classification`` (``text`` and ``label`` columns; the label set is the data's, sorted,
        recorded in the manifest, or ``labels``; the default suite asks for a non-empty text and
        label in every record; a label with over 10 times another's records is warned about).
        ``sft`` and ``classification`` stage on the worker engine only.
    :param labels: ``classification`` only: the fixed label set, in the order of the
        classifier's outputs (None: the labels the data holds, sorted). A record with another
        label is not staged: it is quarantined, or the staging fails naming it. Fix it for a
        model retrained on fresh data, so a label that goes missing from one delivery does not
        renumber the others.
    :param shard_tokens: tokens per shard file.
    :param storage_root: storage root URI; defaults to the embedded root. (templated)
    :param aws_conn_id: Airflow AWS connection for ``s3://``; when it is not defined,
        boto3's default credential chain is used.
    :param cluster: the backend for a staging job (``local`` or ``kubernetes``), the same
        as training's.
    :param job_threshold_bytes: sources up to this many bytes (the sum of their objects'
        sizes) stage in this worker; larger ones stage as one CPU job on ``cluster``
        (``python -m trainops.staging.job``; default 1 GiB; 0: always a job; None: never).
        The job's image needs trainops with its staging dependencies; its storage
        credentials come from ``job_options`` (``env_from_secrets``, ``service_account``).
    :param image: the image of the staging job (Kubernetes).
    :param namespace: Kubernetes namespace of the staging job.
    :param job_options: further JobSpec fields for the job (``cpu``, ``memory``, secrets, ...;
        see FSDPTrainingOperator).
    :param deferrable: wait for a staging job in the triggerer (default: ``[trainops]
        default_deferrable``, True when unset).
    :param poll_interval: seconds between polls of a staging job's state, a positive number.
    :param kubernetes_conn_id: Airflow connection for ``cluster='kubernetes'``.
    :param engine: ``"worker"`` (default) or ``"spark"``: the same validation, version and
        shards computed on Spark (the ``spark`` extra): local mode in this worker, or the
        Spark Connect server of ``spark_remote`` / ``spark_conn_id`` / ``SPARK_REMOTE``. See "Staging on Spark" in ``docs/staging.md``.
    :param spark_remote: a Spark Connect URL (``sc://host:15002``) for ``engine="spark"``.
    :param spark_conn_id: an Airflow connection whose host and port name the Spark Connect
        server (``spark_remote`` wins when both are set).
    :param spark_conf: Spark settings for a local session (``{"spark.driver.memory": "4g"}``).
    """

    operator_extra_links = (ValidationReportLink(),)
    template_fields: Sequence[str] = ("source_uri", "dataset_name", "storage_root", "task", "tokenizer")
    ui_color = "#e8f4e8"
    job_role_labels: ClassVar[Mapping[str, str]] = {"trainops/role": "stage"}

    def __init__(
        self,
        *,
        source_uri: str,
        dataset_name: str,
        expectations: list | str | Callable | None = None,
        tokenizer: str | dict | None = None,
        quarantine: dict | None = None,
        eval_percent: int = DEFAULT_EVAL_PERCENT,
        slice_columns: Sequence[str] | None = None,
        task: str = TASK_CAUSAL_LM,
        labels: Sequence[str] | None = None,
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        cluster: str = "local",
        job_threshold_bytes: int | None = 1 << 30,
        image: str = DEFAULT_IMAGE,
        namespace: str = "default",
        job_options: dict[str, Any] | None = None,
        deferrable: bool | None = None,
        poll_interval: float = 5.0,
        kubernetes_conn_id: str | None = "kubernetes_default",
        engine: str = "worker",
        spark_remote: str | None = None,
        spark_conn_id: str | None = None,
        spark_conf: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.engine = check_engine(engine, spark_remote=spark_remote)
        # task and tokenizer may come from an XCom or a template (a form's settings): then they
        # are checked when the task runs, once rendered (execute), as the dataset name is.
        self.task = check_task(task, self.engine) if _plain(task) else task
        self.labels = check_labels(labels, task) if _plain(task) else labels
        if slice_columns is None and _plain(task):
            slice_columns = DEFAULT_SLICE_COLUMNS[task]
        self.spark_remote, self.spark_conn_id, self.spark_conf = spark_remote, spark_conn_id, spark_conf
        check_options(eval_percent=eval_percent, shard_tokens=shard_tokens, slice_columns=slice_columns or [])
        alias = is_runtime_name(dataset_name)
        if not alias:
            check_dataset_name(dataset_name)  # else when the task runs, once rendered
        outlet = AssetAlias(ASSET_ALIAS) if alias else dataset_asset(dataset_name)
        kwargs["outlets"] = [*_as_list(kwargs.get("outlets")), outlet]
        super().__init__(
            cluster=cluster,
            image=image,
            namespace=namespace,
            job_options=job_options,
            deferrable=deferrable,
            poll_interval=poll_interval,
            storage_root=storage_root,
            aws_conn_id=aws_conn_id,
            kubernetes_conn_id=kubernetes_conn_id,
            **kwargs,
        )
        self._alias = alias
        self.source_uri = source_uri
        self.dataset_name = dataset_name
        self.expectations = check_suite_spec(expectations)
        if _plain(tokenizer):
            check_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.quarantine = check_quarantine(quarantine)
        self.eval_percent = eval_percent
        self.slice_columns = None if slice_columns is None else list(slice_columns)
        self.shard_tokens = shard_tokens
        if job_threshold_bytes is not None and (
            isinstance(job_threshold_bytes, bool)
            or not isinstance(job_threshold_bytes, int)
            or job_threshold_bytes < 0
        ):
            raise ValueError(
                f"job_threshold_bytes must be None or an integer >= 0, got {job_threshold_bytes!r}"
            )
        self.job_threshold_bytes = job_threshold_bytes
        check_renders(
            cluster,
            distributed=False,
            image=image,
            namespace=namespace,
            capacity="on-demand",
            **self.job_options,
        )

    @fail_fast
    def execute(self, context: Context) -> dict:
        check_dataset_name(self.dataset_name)  # before anything is read or written
        self.task = check_task(self.task, self.engine)  # rendered by now
        self.labels = check_labels(self.labels, self.task)
        check_tokenizer(self.tokenizer)
        if self.slice_columns is None:
            self.slice_columns = list(DEFAULT_SLICE_COLUMNS[self.task])
        root = resolve_storage_root(self.storage_root)
        threshold = self.job_threshold_bytes
        try:
            if self.engine == "spark":
                return self._finish(context, stage_on_spark(self, root))
            if threshold is not None and (size := self._source_bytes()) > threshold:
                self.log.info(
                    "source is %.1f MiB, over job_threshold_bytes (%.1f MiB): staging "
                    "as a job on the %s cluster",
                    size / 2**20,
                    threshold / 2**20,
                    self.cluster,
                )
                return self._stage_in_job(context, root)
            result = stage_dataset(
                storage_for(root, self.aws_conn_id),
                root,
                self.source_uri,
                self.dataset_name,
                source_storage=storage_for(self.source_uri, self.aws_conn_id),
                expectations=self.expectations,
                tokenizer=self.tokenizer,
                quarantine=self.quarantine,
                eval_percent=self.eval_percent,
                slice_columns=self.slice_columns,
                shard_tokens=self.shard_tokens,
                batch_rows=DEFAULT_BATCH_ROWS,
                open_storage=lambda uri: storage_for(uri, self.aws_conn_id),
                log=self.log,
                task=self.task,
                labels=self.labels,
            )
        except DataValidationError as exc:
            _push_report(context, exc.report_uri)
            self._log_failures(exc.summary)
            # The same data fails the same way on every try; retries only add delay.
            raise AirflowFailException(str(exc)) from exc
        return self._finish(context, result)

    def _finish(self, context: Context, result: dict) -> dict:
        _push_report(context, result["validation_uri"])
        self._emit_asset_event(context, result)
        self.log.info(
            "%s dataset %s version %s: %d rows (%d quarantined), %d train tokens, %d eval tokens at %s",
            "reused" if result["reused"] else "staged",
            result["dataset_name"],
            result["version"],
            result["rows"],
            result["quarantined_rows"],
            result["train_tokens"],
            result["eval_tokens"],
            result["uri"],
        )
        return result

    # -- staging as a job ---------------------------------------------------------------
    def _source_bytes(self) -> int:
        """The source's total size (the sum of its objects' sizes); a zero-byte Parquet object
        is refused here already, before a staging job is asked for."""
        objects = list_source_objects(storage_for(self.source_uri, self.aws_conn_id), self.source_uri)
        check_not_empty_parquet(objects)
        self._listed = [(int(o.size or 0), o.format) for o in objects]  # sizes the staging pod
        return sum(size for size, _ in self._listed)

    def _sized_job_options(self) -> dict[str, Any]:
        """``job_options`` over the staging pod's size for this source
        (:mod:`trainops.operators.stage_sizing`; said in the log on Kubernetes, where it counts)."""
        if getattr(self, "_listed", None) is None:
            self._source_bytes()
        pod = stage_pod(
            self._listed,
            downloads=not self.source_uri.startswith("file://"),
            hf_tokenizer=self.tokenizer is not None,
        )
        if self.cluster == "kubernetes":
            self.log.info("%s (job_options cpu, memory, ephemeral_storage override it)", pod.describe())
        return {**pod.options(), **self.job_options}

    def _job_uris(self, context: Context, root: str) -> tuple[str, str]:
        i = task_identity(context)
        prefix = join(run_prefix(root, i["dag_id"], i["run_id"], i["task_id"], i["map_index"]), "stage")
        return join(prefix, "request.json"), join(prefix, "result.json")

    def _stage_in_job(self, context: Context, root: str) -> dict:
        request_uri, result_uri = self._job_uris(context, root)
        store = storage_for(root, self.aws_conn_id)
        live = self.live_jobs(context)
        if live:
            self.log.info("reattaching to the live staging job %s", live[0]["job_id"])
            handle = live[0]
        else:
            suite = self.expectations
            if callable(suite):  # a callable cannot cross into the job: its list does
                suite = resolve_suite(suite)
            store.put_json(
                request_uri,
                build_request(
                    root=root,
                    source_uri=self.source_uri,
                    dataset_name=self.dataset_name,
                    expectations=suite,
                    tokenizer=self.tokenizer,
                    quarantine=self.quarantine,
                    eval_percent=self.eval_percent,
                    slice_columns=list(self.slice_columns or ()),
                    shard_tokens=self.shard_tokens,
                    result_uri=result_uri,
                    task=self.task,
                    labels=None if self.labels is None else list(self.labels),
                ),
            )
            store.delete(result_uri)  # a previous try's result must not be read as this one's
            try_number = int(getattr(context.get("ti"), "try_number", None) or 1)
            spec = one_process_job(
                "stage",
                identity=task_identity(context),
                attempt=try_number,
                args=["python", "-m", "trainops.staging.job", "--request", request_uri],
                labels={**self.task_labels(context), "trainops/attempt": str(try_number)},
                image=self.image,
                namespace=self.namespace,
                capacity="on-demand",
                job_options=self._sized_job_options(),
                storage_env=job_env_for(root, self.aws_conn_id),
            )

            try:
                handle = self.backend.launch(spec)
            except JobAlreadyExists as exists:  # this try's job, launched before a lost reply
                handle = exists.handle
                self.log.info("staging job %s is already there: reattaching", handle["job_id"])
            else:
                self.log.info("staging job %s launched (request %s)", handle["job_id"], request_uri)
        return self.wait_for(context, handle)

    @fail_fast
    def execute_complete(self, context: Context, event: object = None) -> dict:
        """The staging job ended: read its result record and finish as staging in the worker
        would; then delete the job (its logs tail is in any error this raises)."""
        checked = check_event(event, expected=("finished", "timeout", "error"))
        handle = checked["handle"]
        if checked["status"] == "error":  # watching failed, not the job: leave it running
            raise RuntimeError(waiting_failed(checked, 1, what="staging job"))
        if checked["status"] != "finished":
            self.backend.delete(handle)
            raise RuntimeError(
                f"staging job {handle['job_id']} {checked['status']}: "
                f"{checked.get('message')}; the job was deleted"
            )
        try:
            return self._read_result(context, checked)
        finally:  # read (or found missing) and reported: the job has nothing more to give
            self.clean_up(handle, "finish")

    def _read_result(self, context: Context, checked: Any) -> dict:
        """The finished staging job's result record, as staging in the worker would return it."""
        handle = checked["handle"]
        root = resolve_storage_root(self.storage_root)
        _, result_uri = self._job_uris(context, root)
        try:
            record: dict[str, Any] | None = get_json_object(storage_for(root, self.aws_conn_id), result_uri)
        except NotFound:
            record = None
        if record is None:
            state = checked["state"]
            raise RuntimeError(
                f"staging job {handle['job_id']} ended {state['phase']} "
                f"({state.get('reason') or 'no reason given'}) without a result at {result_uri}; "
                f"last log lines:\n{self.backend.logs_tail(handle, lines=20)}"
            )
        if record["status"] == "staged":
            return self._finish(context, record["result"])
        _push_report(context, record.get("report_uri"))
        if record["error"] in ("DataValidationError", "QuarantineExceeded") and record.get("report_uri"):
            self._log_failures(self._read_report(root, record["report_uri"]))
        if record["error"] in ("DataValidationError", "QuarantineExceeded", "StagingError"):
            # the same data fails the same way (and fail_fast leaves the note: the input's fault)
            raise AirflowFailException(record["message"]) from StagingError(record["message"])
        raise RuntimeError(f"staging job {handle['job_id']} failed: {record['message']}")

    def _log_failures(self, summary: dict | None) -> None:
        """Each failed expectation on a line of its own, before the long error message."""
        for line in failure_lines(summary or {}):
            self.log.error("%s", line)

    def _read_report(self, root: str, uri: str) -> dict | None:
        """A staging job's validation report (None when it cannot be read: the error says the rest)."""
        try:
            return get_json_object(storage_for(root, self.aws_conn_id), uri)
        except Exception as exc:  # the validation failure is the news, not a lost report
            self.log.warning("could not read the validation report %s: %s", uri, exc)
            return None

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


def _plain(value: object) -> bool:
    """Whether an argument is its own value now: not an XCom nor a template rendered at run time."""
    return value is None or (isinstance(value, (str, dict)) and "{{" not in str(value))
