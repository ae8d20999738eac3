"""In-place restarts: what a restarted worker does with what the incarnation before it left."""

import pytest

from tests.trainer.helpers import ForwardingStorage
from trainer.contract import RunLayout, attempt_record
from trainer.runtime.preemption import PREEMPTED_EXIT_CODE
from trainer.runtime.restarts import decide, read_earlier, restart_count
from trainer.storage import StorageUnavailable, open_storage


def record(outcome: str, cause: str | None = None, restarts: list | None = None, last_step: int = 23) -> dict:
    return attempt_record(
        attempt=2,
        outcome=outcome,
        last_step=last_step,
        checkpoint_step=20,
        world_size=2,
        cause=cause,
        error="RuntimeError: Connection reset by peer" if outcome == "failed" else None,
        started_at="2026-12-06T08:00:00+00:00",
        ended_at="2026-12-06T08:00:09+00:00",
        first_step_time=1796544000.5,
        restarts=restarts,
    )


def test_the_restart_count_is_torchruns_and_zero_when_unset_or_bad():
    assert restart_count({}) == 0
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "x"}) == 0


def test_a_peer_gone_trains_again_and_carries_the_incarnation_before():
    earlier = decide(record("failed", "network"), 1)
    assert earlier.exit_code is None
    assert earlier.restarts == [
        {
            "restart": 0,
            "outcome": "failed",
            "cause": "network",
            "error": "RuntimeError: Connection reset by peer",
            "last_step": 23,
            "checkpoint_step": 20,
            "steps_lost": 3,
            "resumed_from_step": None,  # it started fresh: the cost accounting reads an unknown one's by it
            "started_at": "2026-12-06T08:00:00+00:00",
            "ended_at": "2026-12-06T08:00:09+00:00",
            "first_step_time": 1796544000.5,
        }
    ]


def test_each_restart_adds_the_one_before_to_the_chain():
    first = decide(record("failed", "network"), 1).restarts
    second = decide(record("failed", "storage", restarts=first, last_step=31), 2)
    assert [(e["restart"], e.get("cause"), e.get("last_step")) for e in second.restarts] == [
        (0, "network", 23),
        (1, "storage", 31),
    ]


def test_an_incarnation_that_left_no_record_shows_as_unknown():
    # the killed worker wrote none, and its peers were stopped before they could
    assert decide(None, 1).restarts == [
        {
            "restart": 0,
            "outcome": "unknown",
            "error": "no attempt record: its processes were killed before any rank wrote one",
        }
    ]
    # incarnation 0 wrote one, incarnation 1 none: the record read is 0's, and 1 is unknown
    chain = decide(record("failed", "network"), 2)
    assert [(e["restart"], e["outcome"]) for e in chain.restarts] == [(0, "failed"), (1, "unknown")]
    assert chain.exit_code is None


def test_a_preempted_record_stops_every_later_incarnation_not_only_the_next():
    # incarnation 1 read it and exited at once, writing nothing: incarnation 2 reads the same
    # record, and must exit too (a spot notice that torchrun took for a failure twice)
    assert decide(record("preempted"), 2).exit_code == PREEMPTED_EXIT_CODE
    assert decide(record("failed", "program"), 3).exit_code == 1


@pytest.mark.parametrize(
    ("outcome", "cause", "code", "why"),
    [
        ("preempted", None, PREEMPTED_EXIT_CODE, "preempted and saved"),
        ("completed", None, 0, "completed"),
        ("failed", "program", 1, "failed in the program"),
        ("failed", "node", 1, "a restart in the same pods would meet it again"),  # its GPUs are gone
    ],
)
def test_a_stop_a_completion_or_a_program_error_is_not_restarted(outcome, cause, code, why):
    # torchrun restarts workers whatever their exit code: a preempted gang exits 143 on purpose
    earlier = decide(record(outcome, cause), 1)
    assert earlier.exit_code == code and why in earlier.why


def test_read_earlier_reads_the_attempts_record(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = open_storage(layout.run_uri)
    restarted = {"TRAINOPS_ATTEMPT": "2", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "1"}
    first = {**restarted, "TORCHELASTIC_RESTART_COUNT": "0"}
    assert read_earlier(storage, layout, first) is None  # a first incarnation: no record, no heartbeat
    assert (
        read_earlier(storage, layout, {**restarted, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None
    )  # none possible
    assert read_earlier(storage, layout, {**restarted, "TRAINOPS_ATTEMPT": ""}) is None  # no attempt number
    assert read_earlier(storage, layout, restarted).restarts[0]["outcome"] == "unknown"  # no record yet
    storage.put_json(layout.attempt(2), record("preempted"))
    assert read_earlier(storage, layout, restarted).exit_code == PREEMPTED_EXIT_CODE
    storage.put(layout.attempt(2), b"{torn")
    assert read_earlier(storage, layout, restarted).exit_code is None  # damaged: trains on


def test_a_worker_restarted_for_another_nodes_sake_still_knows_it_is_a_restart(tmp_path):
    # torchrun's agent restarts its healthy workers when another node rejoins, without counting
    # it: TORCHELASTIC_RESTART_COUNT stays 0 there, and the record or heartbeat must tell
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = open_storage(layout.run_uri)
    uncounted = {"TRAINOPS_ATTEMPT": "2", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "0"}
    storage.put(layout.heartbeat(2), b"{}")  # an incarnation trained, and left no record
    assert [e["outcome"] for e in read_earlier(storage, layout, uncounted).restarts] == ["unknown"]
    storage.put_json(layout.attempt(2), record("failed", "network"))
    earlier = read_earlier(storage, layout, uncounted)
    assert [(e["restart"], e["cause"]) for e in earlier.restarts] == [(0, "network")]
    assert earlier.exit_code is None
    once_more = record("failed", "network", restarts=earlier.restarts, last_step=31)
    storage.put_json(layout.attempt(2), once_more)
    assert [e["restart"] for e in read_earlier(storage, layout, uncounted).restarts] == [0, 1]


def test_read_earlier_exits_at_once_while_storage_is_down(tmp_path):
    # the restart would meet the same outage; its failure's lines would push the record rank 0
    # printed (storage refused it) out of the log tail the operator reads
    class Down:
        def get_json(self, uri):
            raise StorageUnavailable(f"storage: read {uri} kept failing (503 SlowDown)")

        head = get_json

    layout = RunLayout((tmp_path / "run").as_uri())
    environ = {"TRAINOPS_ATTEMPT": "1", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "1"}
    earlier = read_earlier(Down(), layout, environ)
    assert earlier is not None and earlier.exit_code == 1
    assert earlier.why.startswith("storage is unreachable (storage: read ")


def test_read_earlier_trains_on_over_a_damaged_record(tmp_path, caplog):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = open_storage(layout.run_uri)
    storage.put(layout.attempt(1), b"{torn")
    environ = {"TRAINOPS_ATTEMPT": "1", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "1"}
    earlier = read_earlier(storage, layout, environ)
    assert earlier is not None and earlier.exit_code is None
    assert "could not read the attempt's record" in caplog.text


def test_a_disks_error_reading_the_record_on_file_storage_is_no_traceback(tmp_path, caplog):
    """FileStorage hands a disk's error (EIO, ESTALE on NFS, EACCES) up as the OSError it is."""
    import errno

    class Failing(ForwardingStorage):
        def before(self, action, uri):
            raise OSError(errno.EIO, "Input/output error", uri)

    layout = RunLayout((tmp_path / "run").as_uri())
    environ = {"TRAINOPS_ATTEMPT": "1", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RESTART_COUNT": "1"}
    earlier = read_earlier(Failing(open_storage(layout.run_uri)), layout, environ)
    assert earlier is not None and earlier.exit_code is None  # trains on, and meets it itself
    assert "could not read the attempt's record ([Errno 5] Input/output error" in caplog.text
    # a first incarnation (count 0) whose heartbeat cannot be read either: no restart known
    assert (
        read_earlier(
            Failing(open_storage(layout.run_uri)), layout, {**environ, "TORCHELASTIC_RESTART_COUNT": "0"}
        )
        is None
    )
