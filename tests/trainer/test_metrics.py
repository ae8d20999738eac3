"""``metrics.jsonl`` as rank 0 writes it: every attempt's records kept, rewritten at flush points."""

import json
import logging

from tests.trainer.helpers import ForwardingStorage
from trainer.contract import metrics_by_step, metrics_records
from trainer.metrics import MetricsLog
from trainer.storage import StorageUnavailable, open_storage


def test_metrics_keep_earlier_attempts_and_readers_take_the_last(tmp_path):
    uri = (tmp_path / "metrics.jsonl").as_uri()
    storage = open_storage(uri)
    first = MetricsLog(storage, uri, attempt=1, flush_every=2)
    for step in (1, 2, 3):
        first.add(step=step, loss=5.0 - step, lr=1e-3, tokens_per_s=10.0, time=0.0)
    assert [r["step"] for r in metrics_records((tmp_path / "metrics.jsonl").read_text())] == [
        1,
        2,
    ]  # step 3 not flushed
    first.flush()
    second = MetricsLog(storage, uri, attempt=2, flush_every=1)  # resumed from step 2
    second.add(step=3, loss=0.5, lr=1e-3, tokens_per_s=10.0, time=0.0)
    records = metrics_records(
        (tmp_path / "metrics.jsonl").read_text() + '{"step": 9, "lo'
    )  # a torn tail is skipped
    assert [(r["step"], r["attempt"]) for r in records] == [(1, 1), (2, 1), (3, 1), (3, 2)]
    by_step = metrics_by_step(records)
    assert (by_step[3]["attempt"], by_step[3]["loss"], by_step[2]["attempt"]) == (2, 0.5, 1)
    assert set(json.loads(json.dumps(records[0]))) == {
        "step",
        "loss",
        "lr",
        "tokens_per_s",
        "attempt",
        "time",
    }


class Outage(ForwardingStorage):
    """Storage that refuses every call while ``down`` is set, as after the client's retries."""

    down = False
    calls = 0

    def before(self, action, uri):
        self.calls += 1
        if self.down:
            raise StorageUnavailable(f"storage: {action} {uri} kept failing (last: refused (503 SlowDown))")


def add(log, step, loss=1.0):
    log.add(step=step, loss=loss, lr=1e-3, tokens_per_s=10.0, time=0.0)


def steps_in(path):
    return [(r["step"], r["attempt"]) for r in metrics_records(path.read_text())]


def test_an_outage_never_stops_training_the_records_wait_and_are_written_after_it(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    storage = Outage(open_storage(path.as_uri()))
    now = [0.0]
    log = MetricsLog(storage, path.as_uri(), attempt=1, flush_every=1, retry_after_s=60, clock=lambda: now[0])
    add(log, 1)
    storage.down = True
    with caplog.at_level(logging.INFO, logger="trainer.metrics"):
        for step in (2, 3, 4):
            add(log, step)  # every add flushes; none raises
            now[0] += 30.0  # the second one is skipped, the third tries again
        assert log.unwritten == 3 and steps_in(path) == [(1, 1)]
        storage.down = False
        now[0] += 60.0
        add(log, 5)
    assert steps_in(path) == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per outage, with the count waiting
    assert warnings[0].startswith(f"metrics: could not write {path.as_uri()} (StorageUnavailable: storage:")
    assert warnings[0].endswith("1 records wait for the next flush, training goes on")
    assert "written again after 2 failed flushes; nothing was lost" in caplog.text
    assert log.unwritten == 0 and log.flush(final=True) == 0


def test_the_final_flush_reports_what_an_outage_kept_from_the_file(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    storage = Outage(open_storage(path.as_uri()))
    log = MetricsLog(storage, path.as_uri(), attempt=2, flush_every=10)
    for step in (1, 2, 3):
        add(log, step)
    storage.down = True
    with caplog.at_level(logging.ERROR, logger="trainer.metrics"):
        assert log.flush(final=True) == 3
    assert "metrics: 3 records of attempt 2 could not be written" in caplog.text
    assert not path.exists()


def test_a_stale_gangs_flush_never_erases_a_newer_attempts_records(tmp_path):
    path = tmp_path / "metrics.jsonl"
    storage = open_storage(path.as_uri())
    zombie = MetricsLog(storage, path.as_uri(), attempt=1, flush_every=1)
    for step in (1, 2, 3):
        add(zombie, step)
    resumed = MetricsLog(storage, path.as_uri(), attempt=2, flush_every=1)  # from the step-2 checkpoint
    add(resumed, 3, loss=0.5)
    add(zombie, 4)  # the zombie goes on writing
    add(resumed, 4, loss=0.4)
    assert steps_in(path) == [(1, 1), (2, 1), (3, 1), (4, 1), (3, 2), (4, 2)]
    by_step = metrics_by_step(metrics_records(path.read_text()))
    assert [by_step[s]["attempt"] for s in (1, 2, 3, 4)] == [1, 1, 2, 2]


class WriterInBetween(ForwardingStorage):
    """Another process writes the file between this one's read and its write, once."""

    def __init__(self, inner, rival):
        super().__init__(inner)
        self.rival = rival

    def before(self, action, uri):
        if action == "write" and self.rival is not None:
            rival, self.rival = self.rival, None
            rival()


def test_a_flush_that_loses_the_race_merges_with_what_the_other_writer_wrote(tmp_path):
    path = tmp_path / "metrics.jsonl"
    storage = open_storage(path.as_uri())
    other = MetricsLog(storage, path.as_uri(), attempt=1, flush_every=1)
    add(other, 1)
    mine = MetricsLog(
        WriterInBetween(storage, lambda: add(other, 2)), path.as_uri(), attempt=2, flush_every=1
    )
    add(mine, 2, loss=0.5)
    assert steps_in(path) == [(1, 1), (2, 1), (2, 2)]


def test_a_rerun_under_the_same_attempt_number_keeps_the_steps_it_does_not_replay(tmp_path):
    path = tmp_path / "metrics.jsonl"
    storage = open_storage(path.as_uri())
    crashed = MetricsLog(storage, path.as_uri(), attempt=1, flush_every=1)
    for step in (1, 2, 3):
        add(crashed, step)
    rerun = MetricsLog(storage, path.as_uri(), attempt=1, flush_every=1)  # resumed from step 2
    add(rerun, 3, loss=0.25)
    assert steps_in(path) == [(1, 1), (2, 1), (3, 1)]
    assert metrics_by_step(metrics_records(path.read_text()))[3]["loss"] == 0.25


def test_after_a_failed_flush_the_next_ones_wait_instead_of_stalling_the_loop(tmp_path):
    """Each flush during an outage would wait out the client's tolerance; after one failed, the
    flushes within ``retry_after_s`` touch no storage at all, and the final one always tries."""
    path = tmp_path / "metrics.jsonl"
    storage = Outage(open_storage(path.as_uri()))
    now = [0.0]
    log = MetricsLog(storage, path.as_uri(), attempt=1, flush_every=1, retry_after_s=60, clock=lambda: now[0])
    storage.down = True
    add(log, 1)  # fails: storage was asked
    asked = storage.calls
    for step in range(2, 50):
        now[0] += 1.0
        add(log, step)
    assert storage.calls == asked and log.unwritten == 49  # 48 flushes skipped, nothing asked
    storage.down = False
    assert log.flush(final=True) == 0 and steps_in(path) == [(s, 1) for s in range(1, 50)]
