"""What the report app may read, and how it reads it: the checks every stored object passes
(under a served root, no ``.`` segment, no symbolic link out of the root, a size cap), the
roots, the reads with the app's outage tolerance, and a run's metrics (kept readers). The
listing behind the fleet and home pages is :mod:`trainops.reports.fleet_reader`. The rules
are described in :mod:`trainops.reports.app`, which serves the pages.
"""

from __future__ import annotations

import os
import posixpath
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer.contract import MetricsReader, MetricsRecord, MetricsTooLarge
from trainer.storage import NotFound, StorageError, StorageUnavailable
from trainops.hooks.storage import storage_for
from trainops.reports import pages
from trainops.settings import default_storage_root, resolve_storage_root

if TYPE_CHECKING:
    from trainer.storage import Storage

__all__ = [
    "MAX_METRICS_BYTES",
    "MAX_REPORT_BYTES",
    "OUTAGE_TOLERANCE_S",
    "ReportRequestError",
    "ReportTarget",
    "allowed_roots",
    "check_real_path",
    "check_report_uri",
    "read_report",
    "read_run_metrics",
    "read_with_client",
    "required_access",
]

REPORT_ROOTS_ENV = "TRAINOPS_REPORT_ROOTS"
CONN_ID_ENV = "TRAINOPS_REPORTS_AWS_CONN_ID"
MAX_REPORT_BYTES = 5 * 1024 * 1024
MAX_METRICS_BYTES = 32 * 1024 * 1024  # a run's metrics, read for its job.json's page
READERS_KEPT = 8  # runs whose metrics readers are kept between requests (see read_run_metrics)
# Seconds one storage request of a page rides out an outage before the page says so (503).
OUTAGE_TOLERANCE_S = 10.0
RETRY_AFTER_S = 30  # what the 503 page's Retry-After header suggests
JOB_NAME = "job.json"

CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ReportRequestError(Exception):
    """A request the app refuses or cannot serve; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class ReportTarget:
    """A checked request: the report's URI, the root holding it, and its path below the root."""

    uri: str
    root: str
    relative: str


# ----------------------------------------------------------------------------- pure checks


def _split(uri: str) -> tuple[str, str, str]:
    """``(scheme, bucket, path)``; file URIs have an empty bucket and an absolute path."""
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://") :].partition("/")
        return "s3", bucket, key
    path = uri[len("file://") :]
    if path.startswith("localhost/"):
        path = path[len("localhost") :]
    return "file", "", path


def _below(path: str, base: str) -> str | None:
    """``path`` relative to ``base`` ("" for a bucket-wide root), or None when not below it."""
    base = base.rstrip("/")
    if not base:
        relative = path.lstrip("/")
    elif path.startswith(base + "/"):
        relative = path[len(base) + 1 :]
    else:
        return None
    return relative or None


def check_report_uri(uri: str, roots: Sequence[str]) -> ReportTarget:
    """Where ``uri`` lies among ``roots``; raise ReportRequestError (400, 403) if it may not be read.

    :param uri: what the request asked for, e.g. ``s3://bucket/root/datasets/d/v/validation.json``.
    :param roots: allowed storage roots, validated (no trailing slash).
    """
    if not uri or not uri.strip():
        raise ReportRequestError(
            400,
            "the uri parameter is empty: pass ?uri=<storage URI of a "
            "report>, such as the one an operator's link points to",
        )
    if CONTROL.search(uri):
        raise ReportRequestError(400, f"uri {uri!r} contains control characters")
    if not uri.startswith(("file://", "s3://")):
        raise ReportRequestError(
            400, f"uri {uri!r} is not a trainops storage URI: use s3://bucket/... or file:///..."
        )
    scheme, bucket, path = _split(uri)
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ReportRequestError(
            400, f"uri {uri!r} contains a '.' or '..' segment: give the report's direct URI"
        )
    if scheme == "file":
        if not path.startswith("/"):
            raise ReportRequestError(400, f"uri {uri!r} is not an absolute file:/// URI")
        path = posixpath.normpath(path)
    for root in roots:
        root_scheme, root_bucket, root_path = _split(root)
        if (root_scheme, root_bucket) != (scheme, bucket):
            continue
        if scheme == "file":
            root_path = posixpath.normpath(root_path)
        relative = _below(path, root_path)
        if relative is not None:
            canonical = f"s3://{bucket}/{path}" if scheme == "s3" else f"file://{path}"
            break
    else:
        raise ReportRequestError(
            403,
            f"uri {uri!r} is outside the trainops storage roots {list(roots)}; only "
            f"reports under them are served (the API server adds roots from "
            f"${REPORT_ROOTS_ENV})",
        )
    if not canonical.endswith(pages.JSON_SUFFIXES + pages.TEXT_SUFFIXES):
        suffixes = ", ".join(pages.JSON_SUFFIXES + pages.TEXT_SUFFIXES)
        raise ReportRequestError(
            400, f"uri {uri!r} is not a report: only files ending in {suffixes} are rendered"
        )
    return ReportTarget(uri=canonical, root=root, relative=relative)


def required_access(target: ReportTarget) -> str | None:
    """The DAG whose task-instance read access the report needs, or None (website access):
    a report below ``runs/<dag_id>/``, whether under the root itself or under a DAG's own
    storage root below it (``team-a/runs/<dag_id>/...``, see :mod:`trainops.cost.runs`)."""
    parts = target.relative.split("/")
    for i, part in enumerate(parts[:-2]):
        if part == "runs" and parts[i + 1]:
            return parts[i + 1]
    return None


# ----------------------------------------------------------------------------- I/O


def allowed_roots() -> list[str]:
    """The default storage root and the roots in ``$TRAINOPS_REPORT_ROOTS``, read each call."""
    roots = [default_storage_root()]
    for item in re.split(r"[,\s]+", os.environ.get(REPORT_ROOTS_ENV, "")):
        if not item:
            continue
        try:
            roots.append(resolve_storage_root(item))
        except ValueError as exc:
            raise ValueError(f"${REPORT_ROOTS_ENV} entry {item!r} is invalid: {exc}") from None
    return list(dict.fromkeys(roots))


def check_real_path(target: ReportTarget) -> None:
    """Refuse a file:// report that a symbolic link places outside its root."""
    path, root = _split(target.uri)[2], _split(target.root)[2]
    real, real_root = os.path.realpath(path), os.path.realpath(root or "/")
    if real_root != "/" and not real.startswith(real_root.rstrip("/") + "/"):
        raise ReportRequestError(
            403,
            f"uri {target.uri!r} leads outside the storage root {target.root!r} through a "
            "symbolic link; only reports inside the root are served",
        )


def read_report(target: ReportTarget, aws_conn_id: str | None, max_bytes: int = MAX_REPORT_BYTES) -> bytes:
    """The report's bytes, read with the operators' storage client (with the app's outage
    tolerance); ReportRequestError if not: 503 naming the outage when storage is unavailable."""
    if target.uri.startswith("file://"):
        check_real_path(target)
    storage = storage_for(target.root, aws_conn_id, outage_tolerance_s=OUTAGE_TOLERANCE_S)
    return read_with_client(storage, target, max_bytes)


def read_with_client(storage: Storage, target: ReportTarget, max_bytes: int) -> bytes:
    """:func:`read_report` with a client at hand (the root and link checks already done)."""
    try:
        head = storage.head(target.uri)
        if head is None:
            raise NotFound(target.uri)
        if head.get("size", 0) > max_bytes:
            raise ReportRequestError(
                413,
                f"{target.uri!r} holds {head['size']} bytes, more than the "
                f"{max_bytes} a report page shows; download it with your storage "
                "tools instead",
            )
        return storage.get(target.uri)
    except NotFound:
        raise ReportRequestError(
            404, f"no report at {target.uri!r}: the task has not written it (yet), or it was deleted"
        ) from None
    except StorageUnavailable as exc:
        last = re.search(r"\(last: (.*?)\), beyond", str(exc))
        why = f" (last: {last.group(1)})" if last else ""
        raise ReportRequestError(
            503,
            f"storage is unavailable: reading {target.uri!r} kept failing for "
            f"{OUTAGE_TOLERANCE_S:g} s{why}. This is an outage of the storage behind "
            f"{target.root!r}, not a missing report: reload this page in a minute, and check the "
            "storage endpoint if it persists",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    except (StorageError, OSError) as exc:
        raise ReportRequestError(502, f"could not read {target.uri!r}: {exc}") from None


def read_run_metrics(
    job: ReportTarget, roots: Sequence[str], aws_conn_id: str | None
) -> tuple[list[MetricsRecord] | None, str | None, str]:
    """``(records, None, where)`` of the metrics beside a run's ``job.json``, or
    ``(None, why, where)``; ``where`` is the parts' folder, or the previous version's
    ``metrics.jsonl`` when the run has only that.

    Read by :class:`trainer.contract.MetricsReader`: the run's parts and the previous version's
    ``metrics.jsonl``. Each object goes through the same checks as any report (under a root,
    no symbolic link out of it), and together they may hold at most :data:`MAX_METRICS_BYTES`.
    The reader of each recently shown run is kept (:data:`READERS_KEPT`), so a reload reads
    only the parts written since.
    """
    run_uri = job.uri[: -len("/" + JOB_NAME)]

    def check(uri: str) -> None:
        target = check_report_uri(uri, roots)
        if target.uri.startswith("file://"):
            check_real_path(target)

    storage = storage_for(job.root, aws_conn_id, outage_tolerance_s=OUTAGE_TOLERANCE_S)
    reader, lock = _readers.reader(storage, job.root, run_uri, check)
    try:
        with lock:
            # this request's client (its connection may have changed) and roots
            reader.storage, reader.check = storage, check
            records = reader.records()
            found, parts = reader.found, reader.parts_held
    except ReportRequestError as exc:
        return None, exc.message, reader.parts_uri + "/"
    except MetricsTooLarge as exc:
        return None, str(exc), reader.parts_uri + "/"
    except StorageUnavailable:
        return (
            None,
            (
                f"storage is unavailable: reading the metrics under {run_uri!r} kept failing for "
                f"{OUTAGE_TOLERANCE_S:g} s; reload this page in a minute"
            ),
            reader.parts_uri + "/",
        )
    except (StorageError, OSError) as exc:
        return None, f"could not read the metrics under {run_uri!r}: {exc}", reader.parts_uri + "/"
    finally:
        _readers.trim()
    where = reader.parts_uri + "/" if parts else reader.legacy_uri
    if not found:
        return None, f"no metrics were found next to {JOB_NAME} (no step logged yet?)", where
    return records, None, where


class _KeptReaders:
    """The metrics readers of the runs shown lately, newest last: at most :data:`READERS_KEPT`,
    and fewer when together they hold more than :data:`MAX_METRICS_BYTES` (the newest stays).
    Each has a lock: one request at a time reads a run's new parts, and the next finds them read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str], tuple[MetricsReader, threading.Lock]] = OrderedDict()

    def reader(
        self, storage: Storage, root: str, run_uri: str, check: Callable[[str], None]
    ) -> tuple[MetricsReader, threading.Lock]:
        with self._lock:
            kept = self._kept.pop((root, run_uri), None)
            if kept is None:
                kept = MetricsReader(storage, run_uri, max_bytes=MAX_METRICS_BYTES), threading.Lock()
            self._kept[(root, run_uri)] = kept
            return kept

    def trim(self) -> None:
        with self._lock:
            while len(self._kept) > 1 and (
                len(self._kept) > READERS_KEPT
                or sum(reader.held_bytes for reader, _ in self._kept.values()) > MAX_METRICS_BYTES
            ):
                self._kept.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


_readers = _KeptReaders()
