"""Staging as a job on a cluster backend: ``python -m trainops.staging.job --request URI``.

``StageDatasetOperator`` stages small sources in the Airflow worker; a source larger than its
``job_threshold_bytes`` is staged by one CPU job on the same backend as training (the local
backend, or a Kubernetes pod through a JobSpec). The operator writes a *request* (every
staging option, the suite already resolved to a plain list or a URI) to storage and launches
this module; the module stages and writes a *result* record, which the operator reads when the
job ends. Nothing here imports Airflow: the job needs the trainops package with its staging
dependencies (pyarrow, great-expectations) and storage credentials from its environment
(Secret references, IRSA, workload identity), never from the request.

Result record: ``{"status": "staged", "result": {...}}`` (``stage_dataset``'s result) or
``{"status": "failed", "error": <class name>, "message": ..., "report_uri": ...}``. The exit
status is 0 when staged and 1 otherwise; the operator reads the record, not the status.
"""

from __future__ import annotations

import argparse
import logging
import sys

from trainer.storage import open_storage
from trainops.staging.stage import stage_dataset

REQUEST_VERSION = 1
# Errors whose class the operator maps back (the rest become a plain failure with logs).
KNOWN_ERRORS = (
    "DataValidationError",
    "QuarantineExceeded",
    "StagingError",
    "SourceNotFound",
    "SourceUnreachable",
)


def build_request(
    *,
    root: str,
    source_uri: str,
    dataset_name: str,
    expectations,
    tokenizer,
    quarantine: dict | None,
    eval_percent: int,
    slice_columns: list[str],
    shard_tokens: int,
    result_uri: str,
    task: str = "causal_lm",
    labels: list[str] | None = None,
) -> dict:
    """The JSON request for one staging job. ``expectations`` must already be a plain list,
    a suite URI or None (a callable cannot cross into a job: resolve it first)."""
    if callable(expectations):
        raise TypeError("resolve a callable suite before building a staging job request")
    return {
        "version": REQUEST_VERSION,
        "root": root,
        "source_uri": source_uri,
        "dataset_name": dataset_name,
        "expectations": expectations,
        "tokenizer": tokenizer,
        "quarantine": quarantine,
        "eval_percent": eval_percent,
        "slice_columns": list(slice_columns),
        "shard_tokens": shard_tokens,
        "result_uri": result_uri,
        "task": task,
        "labels": labels,
    }


def failure_record(exc: BaseException) -> dict:
    """The result record of a staging that raised ``exc``."""
    name = type(exc).__name__
    return {
        "status": "failed",
        "error": name if name in KNOWN_ERRORS else "Error",
        "message": f"{exc}" if name in KNOWN_ERRORS else f"{name}: {exc}",
        "report_uri": getattr(exc, "report_uri", None),
    }


def run(request: dict, open_storage) -> dict:
    """Stage as ``request`` says; the result record (also written to ``result_uri``)."""
    if request.get("version") != REQUEST_VERSION:
        raise ValueError(
            f"staging request version {request.get('version')!r}: this trainops "
            f"reads version {REQUEST_VERSION}; use the same trainops on both sides"
        )
    log = logging.getLogger("trainops.staging.job")
    try:
        result = stage_dataset(
            open_storage(request["root"]),
            request["root"],
            request["source_uri"],
            request["dataset_name"],
            source_storage=open_storage(request["source_uri"]),
            expectations=request["expectations"],
            tokenizer=request["tokenizer"],
            quarantine=request["quarantine"],
            eval_percent=request["eval_percent"],
            slice_columns=request["slice_columns"],
            shard_tokens=request["shard_tokens"],
            open_storage=open_storage,
            log=log,
            task=request.get("task", "causal_lm"),
            labels=request.get("labels"),
        )
        record = {"status": "staged", "result": result}
    except Exception as exc:  # recorded for the operator, which decides what it means
        log.error("staging failed: %s: %s", type(exc).__name__, exc)
        record = failure_record(exc)
    open_storage(request["result_uri"]).put_json(request["result_uri"], record)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainops.staging.job", description="Stage a dataset as StageDatasetOperator asks."
    )
    parser.add_argument("--request", required=True, help="URI of the staging request JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    request = open_storage(args.request).get_json(args.request)
    if not isinstance(request, dict):
        raise SystemExit(f"staging request {args.request!r} is not a JSON object: {str(request)[:200]}")
    record = run(request, open_storage)
    if record["status"] == "staged":
        r = record["result"]
        print(
            f"staged {r['dataset_name']} version {r['version']}: {r['rows']} rows, "
            f"{r['train_tokens']} train and {r['eval_tokens']} eval tokens at {r['uri']}",
            flush=True,
        )
        return 0
    print(f"staging failed: {record['message']}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
