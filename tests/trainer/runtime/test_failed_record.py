"""Which failed record an attempt keeps when several ranks fail (``trainer.runtime.failed_record``):
the root cause, whichever rank writes last, and rank 0's figures; a record of an earlier
incarnation is history and is replaced, a later incarnation's is left alone."""

from __future__ import annotations

from tests.trainer.helpers import ForwardingStorage
from trainer.contract import RunLayout, attempt_record
from trainer.runtime.failed_record import TRIES, incarnation, store_failure, to_store
from trainer.runtime.restarts import PROGRAM_EXIT_CODE, decide
from trainer.storage import open_storage

EARLIER = [{"restart": 0, "outcome": "failed", "cause": "network"}]


def failed(cause, *, last_step=7, error="", restarts=None):
    return attempt_record(
        attempt=1,
        outcome="failed",
        last_step=last_step,
        checkpoint_step=5,
        world_size=4,
        cause=cause,
        error=error or f"{cause} error",
        hint=f"{cause} hint",
        restarts=restarts,
    )


RANK0_NETWORK = failed("network", last_step=7, error="DistBackendError: Connection closed by peer")
RANK3_PROGRAM = failed("program", last_step=0, error="KeyError: 'label'")


def test_a_record_names_its_incarnation_by_the_incarnations_before_it():
    assert incarnation(RANK0_NETWORK) == 0 and incarnation(failed("node", restarts=EARLIER)) == 1
    assert incarnation(None) == incarnation("torn") == 0


def test_rank_0_keeps_its_figures_but_takes_a_peers_root_cause_over_its_network_error():
    kept = to_store(RANK0_NETWORK, RANK3_PROGRAM, is_main=True)
    assert (kept["cause"], kept["error"], kept["hint"]) == ("program", "KeyError: 'label'", "program hint")
    assert kept["last_step"] == 7  # rank 0's: only it counts the steps and the metrics
    # its own program error, node or storage failure is a cause: it stands
    for cause in ("program", "node", "storage"):
        assert to_store(failed(cause), RANK3_PROGRAM, is_main=True)["cause"] == cause
    assert to_store(RANK0_NETWORK, failed("network"), is_main=True) == RANK0_NETWORK


def test_another_rank_writes_first_or_puts_its_cause_into_rank_0s_network_record():
    assert to_store(RANK3_PROGRAM, None, is_main=False) == RANK3_PROGRAM  # none yet: its own
    fixed = to_store(RANK3_PROGRAM, RANK0_NETWORK, is_main=False)
    assert (fixed["cause"], fixed["error"], fixed["last_step"]) == ("program", "KeyError: 'label'", 7)
    assert to_store(failed("network"), RANK0_NETWORK, is_main=False) is None  # a consequence too
    assert to_store(RANK3_PROGRAM, failed("node"), is_main=False) is None  # the first cause stands


def test_an_earlier_incarnations_record_is_replaced_and_a_later_ones_left_alone():
    newer = failed("network", restarts=EARLIER)
    # incarnation 1's ranks replace incarnation 0's record, rank 0 or not (history is in restarts)
    assert to_store(newer, RANK0_NETWORK, is_main=False) == newer
    assert to_store(newer, RANK3_PROGRAM, is_main=True) == newer
    # a straggler of incarnation 0 never overwrites incarnation 1's record
    assert to_store(RANK3_PROGRAM, newer, is_main=False) is None
    assert to_store(RANK0_NETWORK, newer, is_main=True) is None


def test_whichever_rank_writes_last_the_stored_cause_is_the_program_error_and_no_restart_retries_it(tmp_path):
    for order in (
        ((RANK3_PROGRAM, False), (RANK0_NETWORK, True)),
        ((RANK0_NETWORK, True), (RANK3_PROGRAM, False)),
    ):
        layout = RunLayout((tmp_path / str(order[0][1]) / "run").as_uri())
        storage = open_storage(layout.run_uri)
        for record, is_main in order:
            store_failure(storage, layout, record, is_main=is_main)
        stored = storage.get_json(layout.attempt(1))
        assert (stored["cause"], stored["error"], stored["last_step"]) == ("program", "KeyError: 'label'", 7)
        # before, rank 0's network record replaced it: each restart trained into the same error
        assert decide(stored, 1).exit_code == PROGRAM_EXIT_CODE


class Racing(ForwardingStorage):
    """Another rank writes its record (each time another error) just before each of this
    rank's first ``n`` writes."""

    def __init__(self, inner, rival, n):
        super().__init__(inner)
        self.rival, self.left, self.writes = rival, n, 0

    def before(self, action, uri):
        if action == "write":
            self.writes += 1
            if self.left:
                self.left -= 1
                self.inner.put_json(uri, {**self.rival, "error": f"{self.rival['error']} ({self.left})"})


def test_a_write_that_loses_a_race_reads_again_and_decides_again(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    racing = Racing(open_storage(layout.run_uri), RANK3_PROGRAM, 1)
    kept = store_failure(racing, layout, RANK0_NETWORK, is_main=True)
    assert kept["cause"] == "program" and racing.get_json(layout.attempt(1))["cause"] == "program"
    assert racing.writes == 2  # the lost write, then the one that read the rival's
    # past every try, rank 0 writes its own: an attempt always ends with rank 0's record
    layout = RunLayout((tmp_path / "again").as_uri())
    racing = Racing(open_storage(layout.run_uri), failed("network"), TRIES)
    store_failure(racing, layout, RANK0_NETWORK, is_main=True)
    assert racing.get_json(layout.attempt(1)) == RANK0_NETWORK and racing.writes == TRIES + 1
    # another rank gives up instead: the rival's record stands
    layout = RunLayout((tmp_path / "third").as_uri())
    racing = Racing(open_storage(layout.run_uri), failed("network"), TRIES)
    store_failure(racing, layout, RANK3_PROGRAM, is_main=False)
    assert racing.get_json(layout.attempt(1))["error"] == "network error (0)" and racing.writes == TRIES


def test_a_record_that_is_not_json_is_replaced(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    storage = open_storage(layout.run_uri)
    storage.put(layout.attempt(1), b'{"outcome": "fa')  # a torn write from another version
    store_failure(storage, layout, RANK3_PROGRAM, is_main=False)
    assert storage.get_json(layout.attempt(1)) == RANK3_PROGRAM
