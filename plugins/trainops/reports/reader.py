"""The report app's reading for the home page and for what lies around a report page: every
object through the same checks as a report (under a served root, no ``.`` segment, no symbolic
link out of the root, at most :data:`trainops.reports.access.MAX_REPORT_BYTES`), with the app's
outage tolerance. The I/O edge of :mod:`trainops.reports.home` and :mod:`trainops.reports.around`.

The home page lists each root once (:func:`trainops.reports.fleet_reader.list_roots`) and finds in that
listing the runs (:func:`trainops.reports.fleet_reader.find_runs`), the production pointers
(``[<prefix>/]models/<name>/production.json``) and the staged dataset versions
(``[<prefix>/]datasets/<name>/<version>/validation.json``, with the ``manifest.json`` beside
it when there is one), each checked as its kind (:mod:`trainops.shapes`: a damaged one is shown
as a sentence naming the field). It reads the :data:`HOME_RUNS` newest runs, every pointer, and per
dataset the :data:`DATASET_VERSIONS` newest versions (by when ``validation.json`` was
written, of at most :data:`DATASETS_SCANNED` asked). A running run's metrics (the app's kept
reader) and its ``config.yaml`` (``train.max_steps``) give its live step and ETA.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from trainer.contract import join
from trainer.storage import StorageError
from trainops.hooks.storage import storage_for
from trainops.registry.promotion import card_uri
from trainops.reports import access, fleet_reader
from trainops.reports.home import DatasetVersion, HomeRun, ModelEntry, progress
from trainops.shapes import ShapeError, check_manifest, check_pointer, load

if TYPE_CHECKING:
    from trainer.storage import Storage

__all__ = ["DATASETS_SCANNED", "DATASET_VERSIONS", "HOME_RUNS", "Reads", "max_steps_of", "read_home"]

HOME_RUNS = 20  # the newest runs on the home page, of all DAGs together
DATASET_VERSIONS = 5  # the newest versions of each dataset
DATASETS_SCANNED = 500  # validation.json objects whose time is asked (one HEAD each)


class Reads:
    """Checked reads below ``roots``; a client per root, made once."""

    def __init__(
        self, roots: Sequence[str], aws_conn_id: str | None, clients: Mapping[str, Storage] | None = None
    ):
        self.roots, self.aws_conn_id = list(roots), aws_conn_id
        self._clients: dict[str, Storage] = dict(clients or {})

    def client(self, root: str) -> Storage:
        if root not in self._clients:
            self._clients[root] = storage_for(
                root, self.aws_conn_id, outage_tolerance_s=access.OUTAGE_TOLERANCE_S
            )
        return self._clients[root]

    def locate(self, uri: str) -> tuple[str, str] | None:
        """``(root, path below it)`` of ``uri``, None when it may not be read."""
        try:
            target = access.check_report_uri(uri, self.roots)
        except access.ReportRequestError:
            return None
        return target.root, target.relative

    def data(self, uri: str) -> tuple[bytes | None, str | None]:
        """``(bytes, None)`` or ``(None, why not)``."""
        try:
            target = access.check_report_uri(uri, self.roots)
            if target.uri.startswith("file://"):
                access.check_real_path(target)
            return access.read_with_client(self.client(target.root), target, access.MAX_REPORT_BYTES), None
        except access.ReportRequestError as exc:
            return None, exc.message

    def json(self, uri: str) -> tuple[Any, str | None]:
        """``(parsed JSON, None)`` or ``(None, why not)``."""
        data, problem = self.data(uri)
        if data is None:
            return None, problem
        try:
            return json.loads(data.decode("utf-8", errors="replace")), None
        except (ValueError, RecursionError) as exc:
            return None, f"{uri!r} is not valid JSON ({exc})"

    def record(self, uri: str, check: Callable[[object, str], Any]) -> tuple[Any, str | None]:
        """``(the record at uri as check returns it, None)`` or ``(None, why not)``: missing,
        refused, unreadable, or not its kind's shape (:mod:`trainops.shapes`, naming the field)."""
        data, problem = self.data(uri)
        if data is None:
            return None, problem
        try:
            return load(data.decode("utf-8", errors="replace"), uri, check), None
        except ShapeError as exc:
            return None, str(exc)

    def read(self, uri: str) -> Any:
        """The parsed JSON at ``uri``, None when it is missing, refused or unreadable."""
        return self.json(uri)[0]

    def listing(self, prefix: str) -> list[str]:
        """The URIs below ``prefix`` ([] when it is outside the roots or cannot be listed)."""
        where = self.locate(join(prefix, "x.json"))
        if where is None:
            return []
        try:
            return list(self.client(where[0]).list(prefix))
        except (StorageError, OSError):
            return []

    def mtime(self, root: str, uri: str) -> float | None:
        try:
            head = self.client(root).head(uri)
        except (StorageError, OSError):
            return None
        value = head.get("mtime") if head else None
        return float(value) if isinstance(value, (int, float)) else None


def max_steps_of(reads: Reads, job: Mapping[str, Any]) -> int | None:
    """The run's ``train.max_steps``, from the ``config.yaml`` its ``job.json`` names; None
    when it cannot be read or holds none."""
    config_uri = job.get("config_uri")
    data = reads.data(config_uri)[0] if isinstance(config_uri, str) else None
    try:
        config = yaml.safe_load(data) if data else None
    except yaml.YAMLError:
        return None
    train = config.get("train") if isinstance(config, dict) else None
    value = train.get("max_steps") if isinstance(train, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _home_run(reads: Reads, run: Any, now: float) -> HomeRun:
    job = run["job"] or {}
    if run["problem"] is not None or job.get("status") != "running":
        return {"run": run, "progress": None, "progress_problem": None}
    target = access.check_report_uri(run["uri"], reads.roots)
    records, problem, _ = access.read_run_metrics(target, reads.roots, reads.aws_conn_id)
    if records is None:
        return {"run": run, "progress": None, "progress_problem": problem}
    found = progress(records, max_steps_of(reads, job), now)
    return {"run": run, "progress": found, "progress_problem": None if found else "no step logged yet"}


def _found(listed: Sequence[tuple[str, Any, list[str] | None]], folder: str, depth: int, name: str):
    """``(root, storage root, parts)`` of each ``[<prefix>/]<folder>/<depth segments>/<name>``
    in the listings (the prefix holds no ``runs``, ``models`` or ``datasets`` folder)."""
    for root, _, uris in listed:
        base = root.rstrip("/") + "/"
        for uri in uris or []:
            if not uri.startswith(base) or not uri.endswith("/" + name):
                continue
            parts = uri[len(base) :].split("/")
            at = len(parts) - depth - 2
            if at < 0 or parts[at] != folder or not all(parts[at + 1 : -1]):
                continue
            if {"runs", "models", "datasets"} & set(parts[:at]):
                continue
            yield root, join(root, *parts[:at]), parts[at + 1 : -1]


def read_home(
    roots: Sequence[str], aws_conn_id: str | None, *, may_read: Callable[[str], bool], now: float
) -> tuple[list[HomeRun], list[ModelEntry], list[DatasetVersion], int, list[str]]:
    """``(runs, models, datasets, hidden DAGs, problems)`` for :func:`trainops.reports.home.home_page`."""
    listed, problems = fleet_reader.list_roots(roots, aws_conn_id, what="its runs, models and datasets are")
    reads = Reads(roots, aws_conn_id, {root: storage for root, storage, _ in listed})
    runs, hidden, more = fleet_reader.find_runs(
        roots, aws_conn_id, limit=HOME_RUNS, may_read=may_read, listed=listed
    )
    problems += more
    runs.sort(key=lambda r: (r["mtime"] is None, -(r["mtime"] or 0.0), r["run_id"]))
    home_runs = [_home_run(reads, run, now) for run in runs[:HOME_RUNS]]

    models: list[ModelEntry] = []
    for _, storage_root, (name,) in _found(listed, "models", 1, "production.json"):
        pointer, problem = reads.record(join(storage_root, "models", name, "production.json"), check_pointer)
        metrics = None
        if pointer is not None:  # what the production version was promoted on, from its card
            card, _ = reads.json(card_uri(storage_root, name, int(pointer["version"])))
            metrics = (
                card.get("metrics")
                if isinstance(card, dict) and isinstance(card.get("metrics"), dict)
                else None
            )
        models.append(
            {"name": name, "root": storage_root, "pointer": pointer, "problem": problem, "metrics": metrics}
        )

    all_uris = {uri for _, _, uris in listed for uri in uris or []}
    by_name: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for root, storage_root, (name, version) in _found(listed, "datasets", 2, "validation.json"):
        by_name.setdefault((storage_root, name), []).append(
            (root, version, join(storage_root, "datasets", name, version))
        )
    datasets: list[DatasetVersion] = []
    scanned = 0
    for (storage_root, name), versions in sorted(by_name.items()):
        dated = []
        for root, version, prefix in versions:
            scanned += 1
            when = reads.mtime(root, join(prefix, "validation.json")) if scanned <= DATASETS_SCANNED else None
            dated.append((when, version, prefix))
        dated.sort(key=lambda d: (d[0] is None, -(d[0] or 0.0), d[1]))
        for when, version, prefix in dated[:DATASET_VERSIONS]:
            validation, problem = reads.json(join(prefix, "validation.json"))
            manifest_uri = join(prefix, "manifest.json")
            manifest, manifest_problem = (
                reads.record(manifest_uri, check_manifest) if manifest_uri in all_uris else (None, None)
            )
            datasets.append(
                {
                    "name": name,
                    "root": storage_root,
                    "version": version,
                    "validation_uri": join(prefix, "validation.json"),
                    "validation": validation if isinstance(validation, dict) else None,
                    "manifest_uri": manifest_uri if manifest_uri in all_uris else None,
                    "manifest": manifest,
                    "mtime": when,
                    "problem": problem,
                    "manifest_problem": manifest_problem,
                }
            )
    if scanned > DATASETS_SCANNED:
        problems.append(
            f"{scanned} dataset versions were found; only the first {DATASETS_SCANNED} were dated, "
            "so the newest of the others may be missing"
        )
    return home_runs, models, datasets, hidden, problems
