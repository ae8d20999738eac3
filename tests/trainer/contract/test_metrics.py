"""Metrics records, their parts and the one reader (``trainer.contract.metrics``)."""

import json

import pytest

from trainer.contract import (
    MetricsReader,
    MetricsTooLarge,
    RunLayout,
    last_record,
    latest_of_attempt,
    max_step_of_attempt,
    merge_metrics,
    metrics_by_step,
    metrics_part_key,
    metrics_part_name,
    metrics_records,
    metrics_run_uri,
)
from trainer.storage import open_storage

TEXT = (
    '{"step": 1, "loss": 5.0, "attempt": 1}\n{"step": 2, "loss": 4.0, "attempt": 1}\n'
    '{"step": 2, "loss": 3.9, "attempt": 2}\nnot json\n{"step": 3, "loss": 3.5, "attempt": 2}\n'
    '["a list"]\n{"step": "5"}\n{"step": 4, "lo'
)  # a torn last line, as a reader may see mid-rewrite


def test_attempts_are_kept_apart_and_garbage_is_skipped():
    records = metrics_records(TEXT)
    assert [(r["step"], r["attempt"]) for r in records] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    assert max_step_of_attempt(records, 1) == 2
    assert max_step_of_attempt(records, 2) == 3
    assert max_step_of_attempt(records, 3) == 0
    assert latest_of_attempt(records, 2)["loss"] == 3.5
    assert latest_of_attempt(records, 9) is None


def test_later_attempt_wins_a_replayed_step():
    by_step = metrics_by_step(metrics_records(TEXT))
    assert sorted(by_step) == [1, 2, 3]
    assert by_step[2]["loss"] == 3.9


def test_the_highest_attempt_wins_even_when_an_older_record_comes_later():
    # an older attempt's record after a newer one's (a late write from a fenced gang) loses
    text = '{"step": 2, "loss": 3.9, "attempt": 2}\n{"step": 2, "loss": 4.0, "attempt": 1}\n'
    assert metrics_by_step(metrics_records(text))[2]["loss"] == 3.9


class Counting:
    """A storage that counts what a reader asks of it (a polling reader must not re-read)."""

    def __init__(self, inner):
        self.inner, self.gets, self.lists = inner, [], 0

    def list(self, prefix_uri):
        self.lists += 1
        return self.inner.list(prefix_uri)

    def get_with_etag(self, uri):
        self.gets.append(uri.rsplit("/", 1)[-1])
        return self.inner.get_with_etag(uri)

    def head(self, uri):
        return self.inner.head(uri)


def put_part(storage, run, attempt, seq, *steps, loss=1.0):
    body = "".join(json.dumps({"step": s, "attempt": attempt, "loss": loss}) + "\n" for s in steps)
    storage.put(RunLayout(run).metrics_part(attempt, seq), body.encode())


def test_metrics_parts_are_named_by_attempt_and_number_and_sort_in_a_listing():
    layout = RunLayout("s3://b/runs/r1")
    assert layout.metrics_part(2, 7) == "s3://b/runs/r1/metrics/part-000002-00000007.jsonl"
    assert metrics_part_key(layout.metrics_part(2, 7)) == (2, 7)
    assert metrics_part_key("s3://b/runs/r1/metrics/notes.txt") is None
    names = [metrics_part_name(a, n) for a, n in ((1, 10), (1, 9), (10, 1), (2, 1))]
    assert [metrics_part_key(n) for n in sorted(names)] == [(1, 9), (1, 10), (2, 1), (10, 1)]
    with pytest.raises(ValueError, match="numbered from 1"):
        metrics_part_name(0, 1)
    # stored trigger arguments name the legacy file: it still leads to the run
    assert metrics_run_uri(layout.metrics) == metrics_run_uri(layout.metrics_parts) == layout.run_uri


def test_merge_replaces_an_attempts_tail_from_a_later_objects_first_step_only():
    legacy = metrics_records(TEXT)  # the previous version's file: (1,1) (2,1) (2,2) (3,2)
    rerun_of_2 = [{"step": 3, "attempt": 2, "loss": 0.3}]  # a rerun of attempt 2 from step 2
    third = [{"step": 3, "attempt": 3, "loss": 0.2}, {"step": 4, "attempt": 3, "loss": 0.1}]
    late_first = [{"step": 9, "attempt": 1, "loss": 9.0}]  # a stale gang, flushing last
    merged = merge_metrics([legacy, rerun_of_2, third, late_first])
    assert [(r["step"], r["attempt"]) for r in merged] == [
        (1, 1),
        (2, 1),
        (9, 1),
        (2, 2),
        (3, 2),
        (3, 3),
        (4, 3),
    ]
    assert [r["loss"] for r in merged if r["attempt"] == 2] == [3.9, 0.3]
    assert merge_metrics([third, third]) == third  # a part read twice counts once
    assert last_record(merged) == {"step": 9, "attempt": 1, "loss": 9.0}
    assert last_record([{"step": 4, "attempt": 2}, {"step": 4, "attempt": 3}]) == {"step": 4, "attempt": 3}
    assert last_record([]) is None


def test_the_reader_merges_parts_with_the_legacy_file_and_reads_each_part_once(tmp_path):
    run = (tmp_path / "run").as_uri()
    store = open_storage(run)
    store.put(RunLayout(run).metrics, TEXT.encode())  # written by the previous version
    storage = Counting(store)
    reader = MetricsReader(storage, run)
    assert [(r["step"], r["attempt"]) for r in reader.records()] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    put_part(store, run, 3, 1, 3, 4)
    put_part(store, run, 3, 2, 5)
    assert max(metrics_by_step(reader.records())) == 5
    assert storage.gets == ["metrics.jsonl", "part-000003-00000001.jsonl", "part-000003-00000002.jsonl"]
    put_part(store, run, 3, 3, 6)
    assert [r["step"] for r in reader.records() if r["attempt"] == 3] == [3, 4, 5, 6]
    assert storage.gets[3:] == ["part-000003-00000003.jsonl"]  # only what is new, no legacy re-read
    assert reader.records() and storage.gets[4:] == []
    assert reader.found and not MetricsReader(storage, (tmp_path / "none").as_uri()).found


def test_latest_reads_only_each_attempts_newest_part(s3_root):
    run = f"{s3_root}/run"
    store = open_storage(run)
    for seq in range(1, 6):
        put_part(store, run, 1, seq, seq * 10)
    put_part(store, run, 2, 1, 30, 31)
    storage = Counting(store)
    reader = MetricsReader(storage, run)
    latest = reader.latest()
    assert {a: r["step"] for a, r in latest.items()} == {1: 50, 2: 31}
    assert sorted(storage.gets) == ["part-000001-00000005.jsonl", "part-000002-00000001.jsonl"]
    assert last_record(latest.values())["step"] == 50
    put_part(store, run, 2, 2, 32)
    follow = MetricsReader(storage, run, attempt=2)  # the trigger's: one attempt only
    assert follow.latest()[2]["step"] == 32 and 1 not in follow.latest()
    assert storage.gets[2:] == ["part-000002-00000002.jsonl"]


def test_the_readers_byte_cap_and_check_hold_for_parts_and_the_legacy_file(tmp_path):
    run = (tmp_path / "run").as_uri()
    store = open_storage(run)
    for seq in range(1, 4):
        put_part(store, run, 1, seq, seq)
    size = len(store.get(RunLayout(run).metrics_part(1, 1)))
    assert len(MetricsReader(store, run, max_bytes=3 * size).records()) == 3
    with pytest.raises(MetricsTooLarge, match="more than the"):
        MetricsReader(store, run, max_bytes=3 * size - 1).records()
    legacy_only = (tmp_path / "old").as_uri()
    store.put(RunLayout(legacy_only).metrics, TEXT.encode())
    with pytest.raises(MetricsTooLarge, match=f"{len(TEXT) - 1} bytes"):
        MetricsReader(store, legacy_only, max_bytes=len(TEXT) - 1).records()
    store.put(RunLayout(run).metrics, TEXT.encode())
    seen = []
    MetricsReader(store, run, check=seen.append).records()
    assert [u.rsplit("/", 1)[-1] for u in seen] == [
        "metrics.jsonl",
        *(metrics_part_name(1, n) for n in (1, 2, 3)),
    ]
