"""The gate's verdict in words: one text for the skip message and the notes."""

from trainops.gate.verdict import NOTE_LIMIT, fit_note, rejection_note, rejection_reason

GATE = {
    "approved": False,
    "model_name": "demo-lm",
    "production_version": 2,
    "gate_uri": "file:///r/runs/x/train/eval/gate.json",
    "checks": [
        {"name": "eval loss under 3.5", "observed": 3.912345678, "expected": "<= 3.5", "passed": False},
        {"name": "no regression vs production", "observed": 3.91, "expected": "<= 3.2", "passed": False},
        {"name": "perplexity", "observed": None, "expected": None, "passed": False, "note": "missing metric"},
        {"name": "fine", "observed": 1.0, "expected": "<= 2", "passed": True},
    ],
}


def test_the_note_names_model_production_each_failed_check_and_the_decision():
    assert rejection_note(GATE) == (
        "REJECTED: demo-lm failed 3 of 4 gate checks (against production v2); promote skipped, "
        "production unchanged.\n"
        "- eval loss under 3.5 (observed 3.91235, expected <= 3.5)\n"
        "- no regression vs production (observed 3.91, expected <= 3.2)\n"
        "- perplexity (observed missing metric, expected -)\n"
        "Decision: file:///r/runs/x/train/eval/gate.json"
    )


def test_the_skip_message_is_one_line_with_the_same_checks():
    assert rejection_reason(GATE) == (
        "the gate rejected it: eval loss under 3.5 (observed 3.91235, expected <= 3.5); "
        "no regression vs production (observed 3.91, expected <= 3.2); "
        "perplexity (observed missing metric, expected -); decision in file:///r/runs/x/train/eval/gate.json"
    )
    assert rejection_reason({"checks": []}) == "the gate rejected it"


def test_a_note_with_many_failed_checks_fits_airflows_limit():
    many = {
        **GATE,
        "checks": [
            {"name": f"slice {i}", "observed": 9.0, "expected": "<= 1", "passed": False} for i in range(200)
        ],
    }
    note = rejection_note(many)
    assert len(note) == NOTE_LIMIT and note.endswith(" [...]")
    assert note.startswith("REJECTED: demo-lm failed 200 of 200 gate checks")
    assert fit_note("short") == "short"
