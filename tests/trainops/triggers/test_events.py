"""The check an operator runs on a trigger event before it trusts it: a malformed event is a
bug to report (RuntimeError naming it), never a job state to act on."""

import json

import pytest

from trainops.triggers.events import STATUSES, check_event

HANDLE = {"cluster": "local", "job_id": "train-a1-x", "job_dir": "/tmp/j", "labels": {}}
STATE = {"phase": "succeeded", "reason": None, "nodes": [], "disruptions": []}


@pytest.mark.parametrize(
    "event",
    [
        {"status": "finished", "handle": HANDLE, "state": STATE},
        {"status": "timeout", "handle": HANDLE, "state": STATE, "message": "still running after 60s"},
        {"status": "error", "handle": HANDLE, "message": "ApiException: (500)"},
        {"status": "gone", "handle": HANDLE},
    ],
    ids=lambda e: e["status"],
)
def test_a_well_formed_event_is_returned_unchanged(event):
    assert check_event(json.loads(json.dumps(event))) == event  # as it comes back from the triggerer


@pytest.mark.parametrize(
    "event,needle",
    [
        (None, "malformed trigger event None; expected a dict with status 'finished', 'timeout'"),
        ({"status": "done", "handle": HANDLE}, "malformed trigger event"),
        ({"status": "gone"}, "trigger event without a job handle"),
        ({"status": "gone", "handle": "train-a1-x"}, "trigger event without a job handle"),
        ({"status": "finished", "handle": HANDLE}, "'finished' trigger event without the job's state"),
    ],
)
def test_a_malformed_event_is_named(event, needle):
    with pytest.raises(RuntimeError, match=needle):
        check_event(event)


def test_an_event_this_operator_does_not_wait_for_is_refused():
    gone = {"status": "gone", "handle": HANDLE}
    with pytest.raises(
        RuntimeError, match=r"unexpected trigger event .* expected status 'finished', 'timeout'"
    ):
        check_event(gone, expected=("finished", "timeout", "error"))
    assert check_event(gone, expected=("gone", "error")) == gone
    assert STATUSES == ("finished", "timeout", "error", "gone", "hung", "deadline")
