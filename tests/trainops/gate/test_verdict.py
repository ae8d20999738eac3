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


def test_an_approval_note_names_the_metrics_that_decided_and_a_paired_interval():
    from trainops.gate.verdict import approval_note

    approved = {
        "approved": True,
        "model_name": "support-intent",
        "production_version": 4,
        "gate_uri": "file:///r/runs/x/train/eval/gate.json",
        "checks": [
            {
                "name": "accuracy >= 0.9",
                "metric": "accuracy",
                "observed": 0.93,
                "expected": ">= 0.9",
                "passed": True,
            },
            {
                "name": "no regression vs production",
                "metric": "f1_macro",
                "observed": 0.9,
                "expected": ">= 0.9016 unless the 95% interval reaches it",
                "passed": True,
                "interval": [-0.031, 0.004],
                "confidence": 0.95,
            },
        ],
    }
    assert approval_note(approved) == (
        "APPROVED: support-intent passed 2 of 2 gate checks (against production v4), decided on "
        "accuracy, f1_macro.\n"
        "- accuracy >= 0.9 (observed 0.93, expected >= 0.9)\n"
        "- no regression vs production: f1_macro (observed 0.9, expected >= 0.9016 unless the 95% "
        "interval reaches it; 95% interval of the difference [-0.031, +0.004])\n"
        "Decision: file:///r/runs/x/train/eval/gate.json"
    )
    # a rejection names the metric of each failed check the same way
    rejected = {**approved, "approved": False, "checks": [{**approved["checks"][1], "passed": False}]}
    assert "- no regression vs production: f1_macro (observed 0.9" in rejection_note(rejected)


def test_a_notes_lines_name_the_metric_a_check_name_does_not_spell_out():
    from trainops.gate.verdict import approval_note

    gate = {
        "approved": True,
        "model_name": "m",
        "production_version": None,
        "checks": [
            {"name": "f1 floor", "metric": "f1_macro", "observed": 0.9, "expected": ">= 0.8", "passed": True},
            {
                "name": "f1_macro floor",
                "metric": "f1_macro",
                "observed": 0.9,
                "expected": ">= 0.8",
                "passed": True,
            },
            {"name": "every slice", "metric": "slices", "observed": 1.0, "expected": "<= 3", "passed": True},
        ],
    }
    assert approval_note(gate).splitlines() == [
        "APPROVED: m passed 3 of 3 gate checks (no production yet), decided on f1_macro, per-slice expectations.",
        "- f1 floor: f1_macro (observed 0.9, expected >= 0.8)",
        "- f1_macro floor (observed 0.9, expected >= 0.8)",
        "- every slice (observed 1, expected <= 3)",
    ]
