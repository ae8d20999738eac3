"""Classification over recorded job states and attempt records."""

from trainer.contract import attempt_record, attempt_record_line
from trainops.recovery.classify import INFRA, SUCCEEDED, attempt_record_of, classify_attempt

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
