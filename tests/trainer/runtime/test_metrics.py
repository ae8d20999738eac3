"""Metrics as rank 0 writes them: one immutable part per flush, every attempt's records kept,
on ``file://`` and on S3 (moto over HTTP)."""

import json
import logging

import pytest

from tests.trainer.helpers import ForwardingStorage
from trainer.contract import MetricsReader, RunLayout, metrics_by_step, metrics_part_key
from trainer.runtime.metrics import MetricsLog
from trainer.storage import StorageUnavailable, open_storage


@pytest.fixture(params=["file", "s3"])
def run_uri(request, tmp_path):
    """A run prefix on ``file://`` and on a fresh moto bucket."""
    if request.param == "file":
        return (tmp_path / "run").as_uri()
    return request.getfixturevalue("s3_root") + "/run"


def add(log, step, loss=1.0, **extra):
    log.add(step=step, loss=loss, lr=1e-3, tokens_per_s=10.0, time=0.0, **extra)


def steps_in(storage, run_uri):
    """(step, attempt) of every record the one reader merges, in its order."""
    return [(r["step"], r["attempt"]) for r in MetricsReader(storage, run_uri).records()]


def parts_of(storage, run_uri):
    return [metrics_part_key(u) for u in storage.list(RunLayout(run_uri).metrics_parts)]


def test_each_flush_writes_one_new_part_and_readers_take_the_last_attempt(run_uri):
    storage = open_storage(run_uri)
    first = MetricsLog(storage, RunLayout(run_uri).metrics, attempt=1, flush_every=2)
    for step in (1, 2, 3):
        add(first, step, loss=5.0 - step, checkpoint_blocked_s=0.25)
    assert steps_in(storage, run_uri) == [(1, 1), (2, 1)]  # step 3 not flushed
    first.flush()
    second = MetricsLog(storage, run_uri, attempt=2, flush_every=1)  # resumed from step 2
    add(second, 3, loss=0.5)
    assert parts_of(storage, run_uri) == [(1, 1), (1, 2), (2, 1)]
    assert steps_in(storage, run_uri) == [(1, 1), (2, 1), (3, 1), (3, 2)]
    by_step = metrics_by_step(MetricsReader(storage, run_uri).records())
    assert (by_step[3]["attempt"], by_step[3]["loss"], by_step[2]["attempt"]) == (2, 0.5, 1)
    assert by_step[1] == {  # unknown fields travel through
        "step": 1,
        "loss": 4.0,
        "lr": 1e-3,
        "tokens_per_s": 10.0,
        "attempt": 1,
        "time": 0.0,
        "checkpoint_blocked_s": 0.25,
    }
    part = storage.get(RunLayout(run_uri).metrics_part(1, 2)).decode()
    assert [json.loads(line)["step"] for line in part.splitlines()] == [3]  # only what was new


def test_bytes_written_grow_with_the_steps_not_with_their_square(tmp_path):
    storage = open_storage(tmp_path.as_uri())

    def written(steps):
        log = MetricsLog(storage, (tmp_path / f"run{steps}").as_uri(), attempt=1, flush_every=10)
        for step in range(1, steps + 1):
            add(log, step)
        return log.bytes_written

    assert 1.9 < written(400) / written(200) < 2.1  # the whole-file rewrite gave about 4


class Outage(ForwardingStorage):
    """Storage that refuses every call while ``down`` is set, as after the client's retries;
    with ``lose_reply`` set, a write is stored first, then refused (its reply lost)."""

    down = False
    lose_reply = False
    calls = 0

    def before(self, action, uri):
        self.calls += 1
        if self.down:
            raise StorageUnavailable(f"storage: {action} {uri} kept failing (last: refused (503 SlowDown))")

    def put(self, uri, data, **conditions):
        etag = super().put(uri, data, **conditions)
        if self.lose_reply:
            raise StorageUnavailable(f"storage: write {uri} kept failing (last: connection reset)")
        return etag


def test_an_outage_never_stops_training_the_records_wait_and_are_written_after_it(run_uri, caplog):
    storage = Outage(open_storage(run_uri))
    now = [0.0]
    log = MetricsLog(storage, run_uri, attempt=1, flush_every=1, retry_after_s=60, clock=lambda: now[0])
    add(log, 1)
    storage.down = True
    with caplog.at_level(logging.INFO, logger="trainer.metrics"):
        for step in (2, 3, 4):
            add(log, step)  # every add flushes; none raises
            now[0] += 30.0  # the second one is skipped, the third tries again
        assert log.unwritten == 3
        storage.down = False
        assert steps_in(storage, run_uri) == [(1, 1)]
        now[0] += 60.0
        add(log, 5)
    assert steps_in(storage, run_uri) == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    # the part fixed at the first failed flush (step 2), then the rest as the next one
    assert parts_of(storage, run_uri) == [(1, 1), (1, 2), (1, 3)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per outage, with the count waiting
    uri = RunLayout(run_uri).metrics_parts
    assert warnings[0].startswith(f"metrics: could not write {uri} (StorageUnavailable: storage:")
    assert warnings[0].endswith("1 records wait for the next flush, training goes on")
    assert "written again after 2 failed flushes; nothing was lost" in caplog.text
    assert log.unwritten == 0 and log.flush(final=True) == 0


def test_a_part_whose_reply_was_lost_counts_once_when_the_retry_finds_it(run_uri):
    """The server stored the part, the client saw a failure: the retry's If-None-Match gets 412,
    reads the part back, finds its own bytes and moves on; no record is lost or doubled."""
    storage = Outage(open_storage(run_uri))
    log = MetricsLog(storage, run_uri, attempt=1, flush_every=2, retry_after_s=0)
    add(log, 1)
    storage.lose_reply = True
    add(log, 2)  # stored as part 1, reported failed
    assert log.unwritten == 2 and parts_of(storage, run_uri) == [(1, 1)]
    storage.lose_reply = False
    add(log, 3)
    add(log, 4)  # retries part 1 (412: its own), then writes steps 3-4 as part 2
    assert log.unwritten == 0 and parts_of(storage, run_uri) == [(1, 1), (1, 2)]
    records = MetricsReader(storage, run_uri).records()
    assert [r["step"] for r in records] == [1, 2, 3, 4]


def test_a_part_write_that_failed_before_storing_is_retried_under_its_name(tmp_path):
    root = tmp_path.as_uri()
    storage = Outage(open_storage(root))
    log = MetricsLog(storage, root, attempt=3, flush_every=1, retry_after_s=0)
    add(log, 1)
    storage.down = True
    add(log, 2)  # part 2 fixed as [step 2], not stored
    storage.down = False
    add(log, 3)  # part 2 as it was, then part 3
    assert parts_of(storage, root) == [(3, 1), (3, 2), (3, 3)]
    assert storage.get(RunLayout(root).metrics_part(3, 2)).decode().count("\n") == 1
    assert steps_in(storage, root) == [(1, 3), (2, 3), (3, 3)]


def test_the_final_flush_reports_what_an_outage_kept_from_storage(tmp_path, caplog):
    storage = Outage(open_storage(tmp_path.as_uri()))
    log = MetricsLog(storage, tmp_path.as_uri(), attempt=2, flush_every=10)
    for step in (1, 2, 3):
        add(log, step)
    storage.down = True
    with caplog.at_level(logging.ERROR, logger="trainer.metrics"):
        assert log.flush(final=True) == 3
    assert "metrics: 3 records of attempt 2 could not be written" in caplog.text
    assert not (tmp_path / "metrics").exists()


def test_a_stale_gangs_flush_never_erases_a_newer_attempts_records(run_uri):
    storage = open_storage(run_uri)
    zombie = MetricsLog(storage, run_uri, attempt=1, flush_every=1)
    for step in (1, 2, 3):
        add(zombie, step)
    resumed = MetricsLog(storage, run_uri, attempt=2, flush_every=1)  # from the step-2 checkpoint
    add(resumed, 3, loss=0.5)
    add(zombie, 4)  # the zombie goes on writing after the newer attempt did
    add(resumed, 4, loss=0.4)
    assert steps_in(storage, run_uri) == [(1, 1), (2, 1), (3, 1), (4, 1), (3, 2), (4, 2)]
    by_step = metrics_by_step(MetricsReader(storage, run_uri).records())
    assert [by_step[s]["attempt"] for s in (1, 2, 3, 4)] == [1, 1, 2, 2]


def test_a_rerun_under_the_same_attempt_number_keeps_the_steps_it_does_not_replay(run_uri):
    storage = open_storage(run_uri)
    crashed = MetricsLog(storage, run_uri, attempt=1, flush_every=1)
    for step in (1, 2, 3, 4):
        add(crashed, step)
    rerun = MetricsLog(storage, run_uri, attempt=1, flush_every=1)  # resumed from step 2
    add(rerun, 3, loss=0.25)
    assert parts_of(storage, run_uri) == [(1, n) for n in range(1, 6)]  # after the crashed run's
    assert steps_in(storage, run_uri) == [(1, 1), (2, 1), (3, 1)]  # its step 4 is replaced too
    assert metrics_by_step(MetricsReader(storage, run_uri).records())[3]["loss"] == 0.25


class RivalInBetween(ForwardingStorage):
    """Another writer of the same attempt takes the next part number between this writer's
    listing and its write, once."""

    def __init__(self, inner, rival):
        super().__init__(inner)
        self.rival = rival

    def before(self, action, uri):
        if action == "write" and self.rival is not None:
            rival, self.rival = self.rival, None
            rival()


def test_a_part_number_taken_by_another_writer_of_the_attempt_moves_to_the_next(tmp_path):
    root = tmp_path.as_uri()
    storage = open_storage(root)
    other = MetricsLog(storage, root, attempt=1, flush_every=1)
    mine = MetricsLog(
        RivalInBetween(storage, lambda: add(other, 7, loss=0.7)), root, attempt=1, flush_every=1
    )
    add(mine, 7, loss=0.5)  # both listed nothing, both want part 1; the rival wins it
    assert parts_of(storage, root) == [(1, 1), (1, 2)]
    assert [(r["step"], r["loss"]) for r in MetricsReader(storage, root).records()] == [(7, 0.5)]


def test_after_a_failed_flush_the_next_ones_wait_instead_of_stalling_the_loop(tmp_path):
    """Each flush during an outage would wait out the client's tolerance; after one failed, the
    flushes within ``retry_after_s`` touch no storage at all, and the final one always tries."""
    storage = Outage(open_storage(tmp_path.as_uri()))
    now = [0.0]
    log = MetricsLog(
        storage, tmp_path.as_uri(), attempt=1, flush_every=1, retry_after_s=60, clock=lambda: now[0]
    )
    storage.down = True
    add(log, 1)  # fails: storage was asked
    asked = storage.calls
    for step in range(2, 50):
        now[0] += 1.0
        add(log, step)
    assert storage.calls == asked and log.unwritten == 49  # 48 flushes skipped, nothing asked
    storage.down = False
    assert log.flush(final=True) == 0
    assert steps_in(storage, tmp_path.as_uri()) == [(s, 1) for s in range(1, 50)]


def test_steps_added_together_make_one_part_however_many_flush_points_they_cross(tmp_path):
    # The loop reads losses every train.log_every steps (here 25) and adds those steps at once;
    # with flush_every 10 that batch crosses two flush points, and writes one part, not two.
    storage = open_storage(tmp_path.as_uri())
    log = MetricsLog(storage, RunLayout(tmp_path.as_uri()).metrics, attempt=1, flush_every=10)
    for step in range(1, 26):
        log.add(step=step, loss=1.0, lr=1e-3, tokens_per_s=1.0, time=float(step), flush=False)
    assert parts_of(storage, tmp_path.as_uri()) == [] and log.due
    assert log.flush_if_due() == 0
    assert len(parts_of(storage, tmp_path.as_uri())) == 1 and not log.due
    assert [s for s, _ in steps_in(storage, tmp_path.as_uri())] == list(range(1, 26))
    for step in range(26, 30):  # no flush point among them: nothing is due
        log.add(step=step, loss=1.0, lr=1e-3, tokens_per_s=1.0, time=float(step), flush=False)
    assert not log.due  # so the loop marks no busy spell (and starts no timer) for it
    assert log.flush_if_due() == 4 and len(parts_of(storage, tmp_path.as_uri())) == 1
