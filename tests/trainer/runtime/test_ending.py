"""How an attempt ends (``trainer.runtime.ending``): the failed record, stored or printed as the
log's last marked line, the attempt of a rank without a process group, the emergency checkpoint
of a preempted loop and the final checkpoint and export of a completed one."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests.trainer.helpers import ForwardingStorage, committed_steps, metrics_of, read_json
from tests.trainer.test_train import start
from trainer.contract import ATTEMPT_LINE_MARK, EARLY_ATTEMPT_LINE_MARK, RunLayout, attempt_record_in_log
from trainer.runtime.attempts import STORAGE_HINT, Attempt, now_iso
from trainer.runtime.ending import FAILED_SAVE_WAIT_S, attempt_without_group, record_failure
from trainer.runtime.preemption import StopFlag
from trainer.storage import StorageUnavailable, open_storage
from trainer.train import train_loop


class Refusing(ForwardingStorage):
    """A storage whose writes fail as the client's do once an outage outlasts its retries."""

    def before(self, action: str, uri: str) -> None:
        if action == "write":
            raise StorageUnavailable(f"storage: PUT {uri} kept failing, beyond the outage tolerance (test)")


def attempt_of(tmp_path, storage=None) -> Attempt:
    run_uri = (tmp_path / "run").as_uri()
    storage = storage or open_storage(run_uri)
    attempt = Attempt(storage, RunLayout(run_uri), 1, 2, started_at=now_iso())
    attempt.last_step = 7
    return attempt


def test_a_programs_failure_is_stored_and_said_in_one_line(tmp_path, capsys):
    record_failure(KeyError("x"), True, attempt_of(tmp_path), None)
    record = read_json(tmp_path / "run" / "attempts" / "1.json")
    assert (record["outcome"], record["cause"], record["error"], record["last_step"]) == (
        "failed",
        "program",
        "KeyError: 'x'",
        7,
    )
    assert capsys.readouterr().err == "trainer: failed at step 7: KeyError: 'x'\n"  # no marked line


def test_a_record_storage_refuses_is_printed_at_once_and_as_rank_0s_last_line(tmp_path, capsys):
    run_uri = (tmp_path / "run").as_uri()
    outage = StorageUnavailable("storage: PUT kept failing, beyond the outage tolerance (test)")
    record_failure(outage, True, attempt_of(tmp_path, Refusing(open_storage(run_uri))), None)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0].startswith(EARLY_ATTEMPT_LINE_MARK)  # before the slow clean-up
    assert "trainer: could not write the attempt record: storage: PUT" in err
    assert lines[-2] == f"trainer: failed at step 7: {STORAGE_HINT}"
    assert lines[-1].startswith(ATTEMPT_LINE_MARK)
    record = attempt_record_in_log(err, 1)
    assert record is not None and (record["outcome"], record["cause"], record["last_step"]) == (
        "failed",
        "storage",
        7,
    )
    assert not (tmp_path / "run" / "attempts").exists()

    record_failure(outage, False, attempt_of(tmp_path, Refusing(open_storage(run_uri))), None)
    other = capsys.readouterr().err  # another rank: the early line only (rank 0's is complete)
    assert other.startswith(EARLY_ATTEMPT_LINE_MARK) and ATTEMPT_LINE_MARK not in other


def test_a_failure_waits_a_while_for_the_save_in_flight_and_counts_the_unwritten_metrics(tmp_path, capsys):
    waits: list[float] = []

    def never_done(timeout: float) -> bool:
        waits.append(timeout)
        return False

    training = SimpleNamespace(
        checkpointer=SimpleNamespace(wait=never_done),
        metrics=SimpleNamespace(flush=lambda final: 3 if final else 0),
    )
    record_failure(KeyError("x"), True, attempt_of(tmp_path), training)
    assert waits == [FAILED_SAVE_WAIT_S]
    assert "trainer: gave up waiting for the checkpoint in flight" in capsys.readouterr().err
    assert read_json(tmp_path / "run" / "attempts" / "1.json")["metrics_unwritten"] == 3


def test_a_rank_without_a_process_group_takes_its_attempt_from_the_environment(tmp_path, monkeypatch, capsys):
    run_uri = (tmp_path / "run").as_uri()
    storage, layout = open_storage(run_uri), RunLayout(run_uri)
    monkeypatch.setenv("TRAINOPS_ATTEMPT", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    alone = attempt_without_group(storage, layout, "2026-01-02T03:04:05Z")
    assert alone is not None
    assert (alone.number, alone.world_size, alone.started_at) == (3, 4, "2026-01-02T03:04:05Z")
    monkeypatch.setenv("TRAINOPS_ATTEMPT", "zero")
    assert attempt_without_group(storage, layout, "2026-01-02T03:04:05Z") is None
    assert "trainer: could not tell the attempt's number: TRAINOPS_ATTEMPT='zero'" in capsys.readouterr().err


def test_a_signalled_loop_stops_after_the_step_with_an_emergency_checkpoint(
    world_of_one, tmp_path, dataset_uri
):
    run = tmp_path / "run"
    training, _ = start(
        tmp_path, dataset_uri, world_of_one, 1, "train.max_steps=10", "checkpoint.every_steps=5"
    )
    flag = StopFlag()
    before = time.time()
    flag.signal_name, flag.at = "SIGINT", time.monotonic() - 5.0  # as its handler sets them, 5 s ago
    assert train_loop(training, flag) == "preempted"
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["signal"], record["last_step"], record["checkpoint_step"]) == (
        "preempted",
        "SIGINT",
        1,
        1,
    )
    assert committed_steps(run) == [1] and not (run / "export").exists()
    # what the notice window must hold, from the signal to the commit (the operator compares it
    # with the grace period)
    assert 5.0 <= record["emergency_save_s"] < 65
    # the cost accounting's split, in epoch seconds: the signal 5 s before the loop began, and
    # the first step's start, before that step's own record
    assert before - 5.5 < record["signal_time"] < before - 4.5
    assert before <= record["first_step_time"] <= metrics_of(run)[1]["time"]


@pytest.mark.slow
def test_the_loop_completes_with_a_final_checkpoint_export_and_record_and_a_relaunch_only_re_exports(
    world_of_one, tmp_path, dataset_uri
):
    run = tmp_path / "run"
    training, _ = start(tmp_path, dataset_uri, world_of_one, 1)
    assert train_loop(training, StopFlag()) == "completed"
    record = read_json(run / "attempts" / "1.json")
    assert (record["outcome"], record["last_step"], record["checkpoint_step"]) == ("completed", 3, 3)
    assert committed_steps(run) == [2, 3]  # every_steps=2, then the final one
    assert read_json(run / "export" / "export.json")["step"] == 3
    assert sorted(metrics_of(run)) == [1, 2, 3]

    relaunched, attempt = start(tmp_path, dataset_uri, world_of_one, 2)
    assert (attempt.resumed_from_step, relaunched.state.step, relaunched.state.cursor) == (3, 3, 12)
    assert train_loop(relaunched, StopFlag()) == "completed"
    second = read_json(run / "attempts" / "2.json")
    assert (second["outcome"], second["resumed_from_step"], second["last_step"]) == ("completed", 3, 3)
    assert {r["attempt"] for r in metrics_of(run).values()} == {1}  # it trained no step
    assert committed_steps(run) == [2, 3]
