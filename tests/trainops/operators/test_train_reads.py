"""What the training operator reads of an attempt: its log tail, the trainer's record (from
storage, else from its log), its progress, and the task's result."""

from tests.task_log import RecordingLog
from trainer.contract import RunLayout, attempt_record, attempt_record_line
from trainer.storage import open_storage
from trainops.operators import train_reads
from trainops.operators.cleanup import LOGS_TAIL_CHARS

HANDLE = {"cluster": "local", "job_id": "train-1234abcd-a1", "labels": {}}
STATE = {"phase": "failed", "reason": None, "nodes": [], "disruptions": []}


class Backend:
    """A backend whose logs are ``text`` (None: reading them fails); it notes what it is asked."""

    def __init__(self, text):
        self.text, self.asked = text, []

    def logs_tail(self, handle, lines=30):
        self.asked.append(lines)
        if self.text is None:
            raise ConnectionError("the API server is down")
        return self.text


def job_of(attempt=1):
    return {"attempts": [{"attempt": attempt, "job": HANDLE}]}


def run(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    return open_storage(layout.run_uri), layout


def test_a_log_that_cannot_be_read_is_no_tail_and_a_warning():
    log = RecordingLog()
    assert train_reads.log_tail(Backend(None), HANDLE, log) is None
    assert log.lines == [
        (
            "warning",
            "could not read the logs of train-1234abcd-a1 for its attempt record: the API server is down",
        )
    ]


def test_a_malformed_stored_record_is_ignored_with_a_warning(tmp_path):
    store, layout = run(tmp_path)
    log = RecordingLog()
    assert train_reads.stored_record(store, layout, 1, log) is None and log.lines == []  # none written
    store.put_json(layout.attempt(1), {"attempt": "one"})
    assert train_reads.stored_record(store, layout, 1, log) is None
    assert log.lines[0][0] == "warning" and "ignoring a malformed attempt record" in log.lines[0][1]


def test_a_finished_attempt_whose_record_storage_refused_is_read_from_its_log(tmp_path):
    store, layout = run(tmp_path)
    record = attempt_record(attempt=1, outcome="preempted", last_step=7, checkpoint_step=7, world_size=1)
    text = "x" * (LOGS_TAIL_CHARS + 10) + "\n[node-0] " + attempt_record_line(record)
    backend = Backend(text)
    event = {"status": "finished", "handle": HANDLE, "state": STATE}
    ended = train_reads.wait_ended(
        event, job_of(), store=store, layout=layout, backend=backend, log=RecordingLog()
    )
    assert ended.record == record and ended.progress is None  # a record: no progress to read
    assert ended.logs_tail == text and len(ended.kept_tail) <= LOGS_TAIL_CHARS
    assert backend.asked == [200]


def test_a_hung_attempt_is_read_for_its_tail_and_progress_never_its_record(tmp_path):
    store, layout = run(tmp_path)
    backend = Backend("[node-0] step 3")
    event = {"status": "hung", "handle": HANDLE, "state": STATE, "message": "no new step for 700s"}
    ended = train_reads.wait_ended(
        event, job_of(), store=store, layout=layout, backend=backend, log=RecordingLog()
    )
    assert (ended.record, ended.progress, ended.logs_tail) == (None, None, "[node-0] step 3")
    assert backend.asked == [50]


def test_nothing_is_read_for_a_deadline_or_without_a_record(tmp_path):
    store, layout = run(tmp_path)
    backend = Backend(None)
    deadline = {"status": "deadline", "handle": HANDLE, "message": "execution_timeout"}
    finished = {"status": "finished", "handle": HANDLE, "state": STATE}
    for event, job in ((deadline, job_of()), (finished, None)):
        ended = train_reads.wait_ended(
            event, job, store=store, layout=layout, backend=backend, log=RecordingLog()
        )
        assert ended.event == event and ended.logs_tail is None and ended.record is None
    assert backend.asked == []
