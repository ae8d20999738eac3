"""Classification over recorded job states and attempt records."""

from trainer.contract import attempt_record, attempt_record_line
from trainops.recovery.classify import INFRA, SUCCEEDED, attempt_record_of, classify_attempt, restart_note

RUNNING_NODES = [{"index": 0, "exit_code": 0}, {"index": 1, "exit_code": 1}]
SPOT = {"node": 1, "reason": "SpotInterruption", "message": "SIGTERM to node 1's torchrun at step 50"}


def record(outcome, **kw):
    base = {"attempt": 1, "outcome": outcome, "last_step": 50, "checkpoint_step": 50, "world_size": 2}
    return attempt_record(**{**base, **kw})


def test_completed_record_is_success_even_if_torchrun_exit_barrier_failed():
    state = {"phase": "failed", "nodes": RUNNING_NODES, "disruptions": []}
    assert classify_attempt(state, record("completed"))["classification"] == "succeeded"


def test_preempted_record_with_cluster_disruption_names_both():
    state = {"phase": "failed", "nodes": RUNNING_NODES, "disruptions": [SPOT]}
    verdict = classify_attempt(state, record("preempted", signal="SIGTERM"))
    assert verdict["classification"] == "preempted"
    assert "step 50" in verdict["reason"] and "emergency checkpoint at step 50" in verdict["reason"]


def test_sigkill_without_record_but_with_disruption_is_preemption():
    state = {"phase": "failed", "nodes": [{"exit_code": -9}, {"exit_code": -9}], "disruptions": [SPOT]}
    verdict = classify_attempt(state, None)
    assert verdict["classification"] == "preempted"
    assert "no attempt record" in verdict["reason"]


def test_lost_node_is_preemption():
    assert (
        classify_attempt({"phase": "lost", "reason": "gone", "nodes": []}, None)["classification"]
        == "preempted"
    )


def test_failed_record_is_error_with_hint():
    rec = record("failed", error="FloatingPointError: loss is nan", hint="lower train.lr")
    verdict = classify_attempt({"phase": "failed", "nodes": RUNNING_NODES, "disruptions": []}, rec)
    assert verdict["classification"] == "error"
    assert "loss is nan" in verdict["reason"] and "lower train.lr" in verdict["reason"]


def test_nonzero_exit_without_record_is_error_naming_exit_codes():
    verdict = classify_attempt({"phase": "failed", "nodes": [{"exit_code": 1}, {"exit_code": 0}]}, None)
    assert verdict["classification"] == "error" and "[1, 0]" in verdict["reason"]


def test_infra_reason_is_infra():
    state = {"phase": "failed", "nodes": [], "infra_reason": "ImagePullBackOff"}
    assert classify_attempt(state, None)["classification"] == "infra"


def test_a_failure_on_storage_the_network_or_the_nodes_gpus_is_the_infrastructures():
    for cause, error, named in [
        ("storage", "CheckpointError: 503 SlowDown", "storage"),
        ("network", "DistBackendError: gloo connection reset", "the network"),
        ("node", "GPUsMissing: TRAINOPS_GPUS_PER_NODE=1: ...", "its node (GPUs missing)"),
    ]:
        rec = record("failed", error=error, cause=cause, checkpoint_step=20)
        verdict = classify_attempt({"phase": "failed", "nodes": RUNNING_NODES, "disruptions": []}, rec)
        assert verdict == {
            "classification": "infra",
            "reason": f"the trainer failed on {named} ({error}); its last committed checkpoint is step 20",
        }
    program = record("failed", error="ValueError: bad shapes", cause="program")
    assert classify_attempt({"phase": "failed", "nodes": RUNNING_NODES}, program)["classification"] == "error"


def test_a_failed_record_from_before_causes_is_still_the_programs_error():
    old = {k: v for k, v in record("failed", error="RuntimeError: x").items() if k != "cause"}
    assert classify_attempt({"phase": "failed", "nodes": RUNNING_NODES}, old)["classification"] == "error"


def test_a_record_that_storage_refused_is_taken_from_the_log_tail():
    stored = record("completed")
    printed = record("failed", attempt=2, error="StorageError: 503", cause="storage")
    tail = f"[node-0] trainer: failed at step 50: ...\n[node-0] {attempt_record_line(printed)}\n[node-1] done"
    assert attempt_record_of(stored, tail, 1) is stored  # storage's record wins
    assert attempt_record_of(None, tail, 2) == printed
    assert attempt_record_of(None, tail, 3) is None and attempt_record_of(None, None, 2) is None
    verdict = classify_attempt({"phase": "failed", "nodes": RUNNING_NODES}, attempt_record_of(None, tail, 2))
    assert verdict["classification"] == "infra"


def test_an_evicted_node_is_infrastructure_even_with_a_preempted_record():
    """The kubelet's SIGTERM made the trainer save and say preempted; the node's disk was
    full all the same, and a preemption budget would be spent refilling it."""
    state = {
        "phase": "failed",
        "reason": "PodFailurePolicy",
        "nodes": [{"index": 0, "reason": "Evicted", "message": "The node was low on resource: memory. "}],
        "disruptions": [],
    }
    rec = attempt_record(attempt=1, outcome="preempted", last_step=9, checkpoint_step=9, world_size=2)
    verdict = classify_attempt(state, rec)
    assert verdict == {"classification": INFRA, "reason": "Evicted: The node was low on resource: memory. "}
    completed = attempt_record(attempt=1, outcome="completed", last_step=9, checkpoint_step=9, world_size=2)
    assert classify_attempt(state, completed)["classification"] == SUCCEEDED


def test_an_nccl_watchdog_abort_without_a_record_is_infrastructure():
    # The watchdog aborts the rank (SIGABRT): no record; torch's own line is the witness.
    state = {"phase": "failed", "nodes": [{"exit_code": -6}, {"exit_code": 1}], "disruptions": []}
    tail = (
        "[node-1] step 120 loss 2.31\n"
        "[node-1] [rank1]:[E1201 14:02:11.000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE) ran for 600000 milliseconds"
    )
    verdict = classify_attempt(state, None, tail)
    assert verdict["classification"] == INFRA
    assert "NCCL watchdog aborted the rank" in verdict["reason"] and "SeqNum=812" in verdict["reason"]
    # without those words it stays the program's error; a record, when there is one, decides
    assert classify_attempt(state, None, "[node-1] Segmentation fault")["classification"] == "error"
    assert classify_attempt(state, record("failed", error="ValueError: x"), tail)["classification"] == "error"


def test_a_preemption_by_the_clouds_notice_names_the_notice_its_lead_and_the_save():
    notice = {
        "provider": "aws",
        "event": "spot/instance-action: terminate",
        "noticed_at": 1000.0,
        "deadline": 1120.0,
        "lead_s": 120.0,
        "saved_at": 1003.4,
        "saved_after_s": 3.4,
    }
    state = {"phase": "failed", "nodes": RUNNING_NODES, "disruptions": [SPOT]}
    verdict = classify_attempt(state, record("preempted", signal="notice", notice=notice))
    assert verdict == {
        "classification": "preempted",
        "reason": "the cloud's notice (aws spot/instance-action: terminate, 120 s ahead), saved 3.4 s after it; "
        "emergency checkpoint at step 50",
    }


def restart(n, cause="network", error="DistBackendError: NCCL timeout in all_reduce", **kw):
    """One earlier incarnation of the attempt, as the trainer lists it in ``restarts``."""
    return {
        "restart": n,
        "outcome": "failed",
        "cause": cause,
        "error": error,
        "last_step": 47,
        "checkpoint_step": 40,
        "steps_lost": 7,
        "started_at": "2026-01-01T00:00:00+00:00",
        "ended_at": "2026-01-01T00:05:00+00:00",
        "first_step_time": 1767225610.0,
        "restore_s": None,
        **kw,
    }


def test_an_attempt_restarted_in_place_says_so_and_where_its_resume_came_from():
    state = {"phase": "succeeded", "nodes": RUNNING_NODES, "disruptions": []}
    rec = record(
        "completed",
        last_step=100,
        checkpoint_step=100,
        resumed_from_step=40,
        restarts=[restart(0)],
        restore_files={"local": 3, "storage": 0},
    )
    assert classify_attempt(state, rec) == {
        "classification": SUCCEEDED,
        "reason": "the trainer completed every step; restarted in place 1× (network: DistBackendError: NCCL "
        "timeout in all_reduce); resumed from the node-local tier: 3 of 3 files",
    }


def test_restarts_that_ran_out_end_the_infrastructure_failures_reason():
    rec = record(
        "failed",
        cause="network",
        error="DistBackendError: NCCL timeout",
        restarts=[
            restart(0),
            restart(1, cause="program", error="x" * 300 + "\nTraceback ..."),
            restart(2, outcome="unknown"),
        ],
        restore_files={"local": 2, "storage": 1},
    )
    verdict = classify_attempt({"phase": "failed", "nodes": RUNNING_NODES, "disruptions": []}, rec)
    assert verdict["classification"] == INFRA
    assert verdict["reason"].startswith("the trainer failed on the network (DistBackendError: NCCL timeout)")
    note = verdict["reason"].split("; ", 2)[2]
    assert note.startswith(
        "restarted in place 3× (network: DistBackendError: NCCL timeout in all_reduce, then program: xxx"
    )
    assert "x" * 118 not in note and "Traceback" not in note  # a long error: its first line, cut short
    assert note.endswith(", then no record); resumed from the node-local tier: 2 of 3 files (1 from storage)")


def test_the_resume_source_is_said_when_it_matters_only():
    assert restart_note(None) is None and restart_note({}) is None  # an older record
    # a relaunched gang reads everything from storage: nothing to say
    assert restart_note(record("completed", restore_files={"local": 0, "storage": 4})) is None
    # after a restart, a resume that found nothing on the node is worth knowing
    assert restart_note(
        record("completed", restarts=[restart(0)], restore_files={"local": 0, "storage": 4})
    ) == (
        "restarted in place 1× (network: DistBackendError: NCCL timeout in all_reduce); resumed from storage: "
        "4 of 4 files (none on the node-local tier)"
    )
    # damaged or partial entries say what they can, never raise
    assert restart_note(
        {"restarts": [{"restart": 0, "cause": None, "error": ""}, "x"], "restore_files": "3"}
    ) == ("restarted in place 1× (failed)")
