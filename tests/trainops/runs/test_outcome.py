"""The outcome vocabulary: one text for each thing a run can come to."""

import pytest

from trainops.runs.outcome import RunFacts, about, outcome

from .stored import GATE_APPROVED, GATE_REJECTED

RUN = RunFacts("s3://b/r/runs/d/x/train", "d", "x")


def facts(**kw) -> RunFacts:
    return RunFacts(**{**RUN.__dict__, **kw})


@pytest.mark.parametrize(
    "kw,kind,text",
    [
        ({"promoted_version": 3, "status": "succeeded"}, "promoted", "promoted v3"),
        (
            {"status": "succeeded", "gate": GATE_REJECTED},
            "rejected",
            "rejected: eval loss under max_eval_loss: eval_loss (observed 3.2, expected <= 2.5) (+1 more)",
        ),
        (
            {
                "status": "succeeded",
                "gate": GATE_APPROVED,
                "promotion": {"outcome": "identical", "version": 2},
            },
            "identical",
            "identical to production v2",
        ),
        (
            {"status": "failed", "failure": "program error: ValueError"},
            "failed",
            "failed at train: program error: ValueError",
        ),
        ({"status": "failed"}, "failed", "failed at train: see its log"),
        (
            {"status": "running", "step": 40, "max_steps": 100, "eta_s": 125},
            "running",
            "running: step 40/100, about 2 min left",
        ),
        ({"status": "running"}, "running", "running: no step logged yet"),
        ({"status": "succeeded", "gate": GATE_APPROVED}, "approved", "approved, not promoted"),
        ({"status": "succeeded"}, "trained", "trained, not evaluated"),
        ({"problem": "no readable job.json"}, "unknown", "unreadable: no readable job.json"),
        (
            {"status": "succeeded", "gate": GATE_APPROVED, "promotion": {"outcome": "regate_rejected"}},
            "rejected",
            "rejected on re-gate: production moved on and the candidate no longer passed",
        ),
    ],
)
def test_each_outcome_reads_as_the_vocabulary_says(kw, kind, text):
    found = outcome(facts(**kw))
    assert (found.kind, found.text) == (kind, text)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (3.0, "3 s"),
        (59.0, "59 s"),
        (61.0, "1 min"),
        (125, "2 min"),
        (3000.0, "50 min"),
        (11_100.0, "3 h 5 min"),
    ],
)
def test_a_span_reads_as_a_person_says_it(seconds, shown):
    assert about(seconds) == shown
