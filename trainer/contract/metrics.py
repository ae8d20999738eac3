"""The run contract, part 5: metrics, one record per step, each with its attempt, in immutable
parts ``metrics/part-<attempt>-<n>.jsonl`` (the previous version's ``metrics.jsonl`` is still read);
the one reader is here, :class:`MetricsReader`."""

import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from trainer.contract.layout import METRICS_DIR, join, metrics_part_key, metrics_part_name, metrics_run_uri

# --- 5. metrics ----------------------------------------------------------------
# One step's record: ``step``, ``attempt``, ``loss``, ``lr``, ``tokens_per_s``, ``time`` and
# optional figures (``mfu``, ``peak_mem_gib``, ...); readers carry unknown fields through.
MetricsRecord = dict[str, Any]


def metrics_records(text: str) -> list[MetricsRecord]:
    """The well-formed records of a metrics body (a part, or the legacy ``metrics.jsonl``), in
    file order: JSON objects with an integer ``step``. Anything else (a torn last line, as a
    reader may see while the previous version rewrote the file) is skipped; the rest counts."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            out.append(record)
    return out


def merge_metrics(bodies: Sequence[list[MetricsRecord]]) -> list[MetricsRecord]:
    """The run's records from its metrics objects, given in order (the legacy file first, then
    the parts by attempt and number): each object's records of an attempt replace that
    attempt's records from earlier objects from the object's first step of it on, so a rerun
    under the same attempt number replaces its own tail (and keeps the steps it did not
    replay) and a part written twice counts once. Other attempts' records are never touched:
    a stale gang cannot erase a newer attempt's records. Grouped by attempt, in order."""
    by_attempt: dict[int, list[MetricsRecord]] = {}
    for records in bodies:
        firsts: dict[int, int] = {}
        for record in records:
            firsts.setdefault(_attempt_of(record), record["step"])
        for attempt, first in firsts.items():
            kept = by_attempt.setdefault(attempt, [])
            if kept and any(r["step"] >= first for r in kept):
                kept[:] = [r for r in kept if r["step"] < first]
        for record in records:
            by_attempt[_attempt_of(record)].append(record)
    return [r for attempt in sorted(by_attempt) for r in by_attempt[attempt]]


def _attempt_of(record: MetricsRecord) -> int:
    """A record's attempt number for merging; 0 for a record without a usable one."""
    attempt = record.get("attempt")
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0


def metrics_by_step(records: list[MetricsRecord]) -> dict[int, MetricsRecord]:
    """One record per step: that of the highest attempt that reached it (a relaunched attempt
    replays the steps after its last checkpoint); within one attempt, the later record."""
    out: dict[int, MetricsRecord] = {}
    for record in records:
        step = record["step"]
        if step not in out or record.get("attempt", 0) >= out[step].get("attempt", 0):
            out[step] = record
    return out


def latest_of_attempt(records: list[MetricsRecord], attempt: int) -> MetricsRecord | None:
    """The record of the highest step ``attempt`` reached, or None."""
    mine = [r for r in records if r.get("attempt") == attempt]
    return max(mine, key=lambda r: r["step"]) if mine else None


def max_step_of_attempt(records: list[MetricsRecord], attempt: int) -> int:
    """The highest step ``attempt`` recorded (0 if none)."""
    latest = latest_of_attempt(records, attempt)
    return int(latest["step"]) if latest else 0


def last_record(records: Iterable[MetricsRecord]) -> MetricsRecord | None:
    """The run's last logged step's record: the highest step, and at it the highest attempt's
    (as :func:`metrics_by_step` would pick it); None when there is none."""
    return max(records, key=lambda r: (r["step"], _attempt_of(r)), default=None)


class MetricsStorage(Protocol):
    """What :class:`MetricsReader` needs of a storage client (``trainer.storage.Storage``)."""

    def list(self, prefix_uri: str) -> list[str]: ...

    def get_with_etag(self, uri: str) -> tuple[bytes, str]: ...

    def head(self, uri: str) -> dict[str, Any] | None: ...


class MetricsTooLarge(ValueError):
    """A run's metrics hold more bytes than the reader was allowed to read."""


class MetricsReader:
    """The one reader of a run's metrics, for the trigger, the operator, the report app and the
    local supervisor. It keeps what it read: each part is immutable, so a reader that polls
    fetches only the parts that are new since its last read (a listing, then one GET per new
    part), and the legacy ``metrics.jsonl`` again only when its etag changed.

    :param storage: the client for ``run_uri``.
    :param run_uri: the run prefix (or its ``metrics.jsonl``, see :func:`metrics_run_uri`).
    :param attempt: read only this attempt's parts (the trigger and the supervisor follow one
        attempt, and keep no other attempt's records in memory).
    :param max_bytes: raise :class:`MetricsTooLarge` once the records held would pass this
        many bytes (the report app's cap); None: no cap.
    :param check: called with every object URI before it is read; raises to refuse it (the
        report app refuses a file that a symbolic link places outside its root).
    :param workers: parts fetched at once when many are new (a report's first read of a long run).
    """

    def __init__(
        self,
        storage: MetricsStorage,
        run_uri: str,
        *,
        attempt: int | None = None,
        max_bytes: int | None = None,
        check: Callable[[str], None] | None = None,
        workers: int = 8,
    ):
        self.storage, self.attempt, self.max_bytes = storage, attempt, max_bytes
        self.run_uri = metrics_run_uri(run_uri)
        self.legacy_uri = join(self.run_uri, "metrics.jsonl")
        self.parts_uri = join(self.run_uri, METRICS_DIR)
        self.check, self._workers = check, max(1, workers)
        self._parts: dict[tuple[int, int], list[MetricsRecord]] = {}
        self._sizes: dict[tuple[int, int], int] = {}
        self._legacy: list[MetricsRecord] = []
        self._legacy_etag: str | None = None
        self._legacy_size = 0
        self._size_held = 0  # bytes of the objects whose records are held
        self.found = False  # whether the last read found any metrics object of the run (any attempt)
        self.bytes_read = 0  # bytes fetched so far (parts and legacy file), for tests and benchmarks

    @property
    def parts_held(self) -> int:
        """How many parts this reader holds the records of."""
        return len(self._parts)

    @property
    def held_bytes(self) -> int:
        """Bytes of the objects whose records this reader holds."""
        return self._size_held

    def records(self) -> list[MetricsRecord]:
        """Every record (of ``attempt``, when set), merged (:func:`merge_metrics`); reads what is new."""
        self._refresh_legacy()
        listed = self._listed()
        self._fetch({k: u for k, u in listed.items() if k not in self._parts})
        return self._merged(sorted(listed))

    def latest(self) -> dict[int, MetricsRecord]:
        """Each attempt's record of the highest step it reached, reading only each attempt's
        newest part (and the legacy file): a part replaces its attempt's records from its first
        step on, so nothing before the newest part can hold a higher step. A reader used for
        this keeps only the newest parts, so its memory stays flat over a long run."""
        self._refresh_legacy()
        listed = self._listed()
        newest: dict[int, tuple[int, int]] = {}
        for key in listed:
            newest[key[0]] = max(newest.get(key[0], key), key)
        keys = sorted(newest.values())
        for older in set(self._parts) - set(keys):
            self._forget(older)
        self._fetch({k: listed[k] for k in keys if k not in self._parts})
        merged = self._merged(keys)
        out: dict[int, MetricsRecord] = {}
        for attempt in sorted({_attempt_of(r) for r in merged}):
            found = latest_of_attempt(merged, attempt)
            if found is not None:
                out[attempt] = found
        return out

    def _merged(self, keys: list[tuple[int, int]]) -> list[MetricsRecord]:
        return merge_metrics([self._legacy, *(self._parts[k] for k in keys if k in self._parts)])

    def _listed(self) -> dict[tuple[int, int], str]:
        """The parts there now (of ``attempt``, when set), by key."""
        listed, any_part = {}, False
        for uri in self.storage.list(self.parts_uri):
            key = metrics_part_key(uri)
            if key is None or not uri.endswith(f"/{METRICS_DIR}/{metrics_part_name(*key)}"):
                continue  # not a part, or one in a folder below
            any_part = True
            if self.attempt is None or key[0] == self.attempt:
                listed[key] = uri
        for gone in set(self._parts) - set(listed):  # deleted (a run pruned): forgotten too
            self._forget(gone)
        self.found = any_part or self._legacy_etag is not None
        return listed

    def _fetch(self, wanted: dict[tuple[int, int], str]) -> None:
        keys = sorted(wanted)
        uris = [wanted[k] for k in keys]
        for uri in uris:
            if self.check is not None:
                self.check(uri)
        if len(uris) > 1 and self._workers > 1:
            with ThreadPoolExecutor(min(self._workers, len(uris))) as pool:
                bodies = list(pool.map(self._get, uris))
        else:
            bodies = [self._get(uri) for uri in uris]
        self._allow(sum(len(b) for b in bodies if b is not None))
        for key, body in zip(keys, bodies, strict=True):
            if body is not None:  # None: listed, then deleted before the read
                self._parts[key] = metrics_records(body.decode("utf-8", "replace"))
                self._sizes[key] = len(body)
                self._size_held += len(body)

    def _get(self, uri: str) -> bytes | None:
        try:
            body = self.storage.get_with_etag(uri)[0]
        except FileNotFoundError:  # trainer.storage.NotFound is one
            return None
        self.bytes_read += len(body)
        return body

    def _refresh_legacy(self) -> None:
        head = self.storage.head(self.legacy_uri)
        if head is not None and head.get("etag") == self._legacy_etag:
            return
        self._size_held -= self._legacy_size
        self._legacy, self._legacy_etag, self._legacy_size = [], None, 0
        if head is None:
            return
        self._allow(int(head.get("size", 0)))  # before reading: the file is read whole
        if self.check is not None:
            self.check(self.legacy_uri)
        try:
            body, etag = self.storage.get_with_etag(self.legacy_uri)
        except FileNotFoundError:  # deleted since the head
            return
        self.bytes_read += len(body)
        self._allow(len(body))
        records = metrics_records(body.decode("utf-8", "replace"))
        if self.attempt is not None:
            records = [r for r in records if r.get("attempt") == self.attempt]
        self._legacy, self._legacy_etag, self._legacy_size = records, etag, len(body)
        self._size_held += len(body)

    def _forget(self, key: tuple[int, int]) -> None:
        del self._parts[key]
        self._size_held -= self._sizes.pop(key)

    def _allow(self, more: int) -> None:
        """Raise :class:`MetricsTooLarge` if holding ``more`` bytes would pass ``max_bytes``."""
        if self.max_bytes is not None and self._size_held + more > self.max_bytes:
            raise MetricsTooLarge(
                f"the metrics under {self.run_uri!r} hold more than the {self.max_bytes} bytes this "
                "reader may read; read them with your storage tools instead"
            )
