"""The quiet demo's lines, from the records it reads."""

from __future__ import annotations

from trainops.cli.quiet import attempt_line, bar, error_lines, progress_due, progress_text, task_line

PREEMPTED = {
    "attempt": 1,
    "status": "ended",
    "classification": "preempted",
    "decision": {"action": "relaunch", "reason": "preemption 1 of at most 2: relaunching to resume"},
    "reason": "injected spot preemption: SIGTERM to node 1's torchrun at step 50",
    "record": {"outcome": "preempted", "last_step": 55, "checkpoint_step": 55, "signal": "SIGTERM"},
    "state": {
        "phase": "failed",
        "disruptions": [{"reason": "SpotInterruption", "message": "injected spot preemption: SIGTERM"}],
    },
    "logs_tail": "[node-0] step 50/120\n[node-0] torchrun: worker rank 0 exited with code 143 (SIGTERM)",
}


def test_a_task_line_names_the_task_its_state_duration_and_try():
    row = {"task_id": "train", "state": "success", "try_number": 1, "duration": 38.94}
    assert task_line(row) == "train        success            38.9s  (try 1)"
    assert task_line({**row, "state": None, "duration": None}).split() == ["train", "-", "(try", "1)"]


def test_an_expected_preemption_is_one_explained_line():
    assert attempt_line(PREEMPTED) == (
        "attempt 1 preempted at step 55 (injected SIGTERM); resuming from checkpoint step 55"
    )


def test_a_real_spot_interruption_and_a_spent_budget_say_so():
    spot = {
        **PREEMPTED,
        "state": {"disruptions": [{"reason": "SpotInterruption", "message": "node drained"}]},
    }
    assert attempt_line(spot) == (
        "attempt 1 preempted at step 55 (SpotInterruption); resuming from checkpoint step 55"
    )
    spent = {**PREEMPTED, "decision": {"action": "fail", "reason": "preemption 3 of at most 2: giving up"}}
    assert attempt_line(spent).endswith("(injected SIGTERM); preemption 3 of at most 2: giving up")


def test_a_failed_attempt_names_its_reason_and_the_decision_and_shows_the_trainers_last_lines():
    failed = {
        "attempt": 2,
        "status": "ended",
        "classification": "error",
        "decision": {"action": "fail", "reason": "an error a relaunch cannot fix"},
        "reason": "ValueError: train.lr must be positive",
        "record": {"outcome": "failed", "last_step": 3},
        "logs_tail": "\n".join(f"line {i}" for i in range(20)),
    }
    assert attempt_line(failed) == (
        "attempt 2 error at step 3: ValueError: train.lr must be positive; an error a relaunch cannot fix"
    )
    assert error_lines(failed, 3) == ["    line 17", "    line 18", "    line 19"]


def test_completed_and_unfinished_attempts():
    done = {"attempt": 2, "status": "ended", "classification": "succeeded", "record": {"last_step": 120}}
    assert attempt_line(done, 120) == "attempt 2 completed at step 120/120"
    assert attempt_line({"attempt": 3, "status": "running"}) is None
    assert attempt_line({"attempt": 3, "status": "ended"}) is None  # not classified yet


def test_progress_text_bar_and_when_a_plain_output_prints_a_line():
    record = {"step": 70, "loss": 2.12812, "tokens_per_s": 13634.2}
    assert progress_text(2, record, 120, 10.0) == "attempt 2: step 70/120  loss 2.128  13,634 tok/s  ETA 5s"
    assert progress_text(1, {"step": 3}, None, None) == "attempt 1: step 3"
    assert progress_text(1, {"step": 0}, 1000, 0.5).endswith("ETA 33m20s")
    assert bar(60, 120, width=10) == "[#####-----] "
    assert bar(5, None) == ""
    printed = [s for s in range(1, 121) if progress_due(s, None, 120)]
    assert printed == list(range(1, 121))  # nothing printed yet: any step is due
    last, lines = None, []
    for step in (1, 10, 23, 24, 30, 47, 50, 55, 101, 119, 120, 120):
        if progress_due(step, last, 120):
            last = step
            lines.append(step)
    assert lines == [1, 24, 50, 101, 120]  # every 24 steps (a fifth), and the last


def test_a_failed_attempt_shows_the_trainers_traceback_not_torchruns_notes_or_other_nodes():
    tail = [
        "[node-0] step 3/120 loss 4.9",
        "[node-0] Traceback (most recent call last):",
        '[node-0]   File "/app/trainer/train.py", line 88, in main',
        "[node-0] ValueError: train.lr must be positive",
        "[node-0] E1201 20:59:43.616000 5005 /venv/torch/distributed/elastic/multiprocessing/api.py:1002] failed",
        "[node-0] torchrun: worker rank 0 exited with code 1; torchrun's traceback is left out",
        "[node-1] W1201 20:59:41.931000 5006 /venv/torch/distributed/elastic/agent/server/api.py:753] Received 15",
        "[node-1] torchrun: stopped by SIGTERM; its traceback is left out",
    ]
    assert error_lines({"logs_tail": "\n".join(tail)}) == [
        "    [node-0] Traceback (most recent call last):",
        '    [node-0]   File "/app/trainer/train.py", line 88, in main',
        "    [node-0] ValueError: train.lr must be positive",
    ]


def test_a_preemption_by_the_clouds_notice_says_which_notice():
    noticed = {
        **PREEMPTED,
        "state": {"phase": "failed", "disruptions": []},
        "record": {
            **PREEMPTED["record"],
            "signal": "notice",
            "notice": {"provider": "gce", "event": "instance/preempted: TRUE"},
        },
    }
    assert attempt_line(noticed) == (
        "attempt 1 preempted at step 55 (spot notice: gce instance/preempted: TRUE); resuming from checkpoint step 55"
    )


def test_an_attempt_restarted_in_place_says_so_on_its_line():
    restarts = [{"restart": 0, "outcome": "failed", "cause": "network", "error": "NCCL timeout"}]
    done = {
        "attempt": 1,
        "status": "ended",
        "classification": "succeeded",
        "record": {"last_step": 120, "restarts": restarts, "restore_files": {"local": 2, "storage": 0}},
    }
    assert attempt_line(done, 120) == (
        "attempt 1 completed at step 120/120; restarted in place 1× (network: NCCL timeout); "
        "resumed from the node-local tier: 2 of 2 files"
    )
    preempted = {**PREEMPTED, "record": {**PREEMPTED["record"], "restarts": restarts}}
    assert attempt_line(preempted) == (
        "attempt 1 preempted at step 55 (injected SIGTERM); restarted in place 1× (network: NCCL timeout); "
        "resuming from checkpoint step 55"
    )
