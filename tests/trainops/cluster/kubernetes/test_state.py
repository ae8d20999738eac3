"""Recorded Job, PyTorchJob, TrainJob and Pod objects -> backend state -> the policy's
classification.

Each row feeds real-world-shaped API objects (tests/data/k8s) to ``job_state`` and then the
state, with each kind of attempt record, to ``policy.classify_attempt``: what the operator
would decide after that attempt.
"""

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from trainer.contract import attempt_record
from trainops.cluster.kubernetes.state import job_state, node_index, trainer_container
from trainops.recovery.classify import ERROR, INFRA, PREEMPTED, SUCCEEDED, classify_attempt

DATA = Path(__file__).resolve().parents[3] / "data" / "k8s"
NOW = datetime(2026, 1, 1, 11, 45, tzinfo=UTC)
CREATED = datetime(2026, 1, 1, 10, 0, 5, tzinfo=UTC)  # pod-unschedulable's transition


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def record(outcome: str | None):
    if outcome is None:
        return None
    return attempt_record(
        attempt=1,
        outcome=outcome,
        world_size=16,
        last_step=120,
        checkpoint_step=100 if outcome != "failed" else 50,
        error="ValueError: loss is NaN" if outcome == "failed" else None,
    )


def state_of(job, pods, present=None, now=NOW, deadline=900):
    return job_state(
        load(job) if isinstance(job, str) else job,
        [load(p) if isinstance(p, str) else p for p in pods],
        now=now,
        unschedulable_deadline_s=deadline,
        node_names_present=present,
    )


DISRUPTED = [
    ("pod-disruption-preemption-by-scheduler", "PreemptionByScheduler"),
    ("pod-disruption-taint-manager", "DeletionByTaintManager"),
    ("pod-disruption-eviction-api", "EvictionByEvictionAPI"),
    ("pod-disruption-podgc", "DeletionByPodGC"),
    ("pod-disruption-kubelet-shutdown", "TerminationByKubelet"),
    ("pod-gke-node-shutdown-terminated", "Terminated"),
    ("pod-gke-node-shutdown-legacy", "Shutdown"),
]

# (job, pods, node names present, phase, reason part, disruption reasons,
#  classification with record None / preempted / failed)
ROWS = {
    **{
        f"disrupted-{reason}": (
            "job-failed-podfailurepolicy",
            [pod],
            None,
            "failed",
            "PodFailurePolicy",
            [reason],
            (PREEMPTED, PREEMPTED, PREEMPTED),
        )
        for pod, reason in DISRUPTED
    },
    "succeeded": ("job-complete", ["pod-succeeded"], None, "succeeded", None, [], (ERROR, PREEMPTED, ERROR)),
    "succeeded-node-since-removed": (
        "job-complete",
        ["pod-succeeded"],
        set(),
        "succeeded",
        None,
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "oomkilled": (
        "job-failed-exitcode",
        ["pod-oomkilled"],
        None,
        "failed",
        "OOMKilled",
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "exit-1": (
        "job-failed-exitcode",
        ["pod-error-exit1"],
        None,
        "failed",
        "exit code 137",
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "backoff-limit": (
        "job-failed-backofflimit",
        ["pod-error-exit1"],
        None,
        "failed",
        "BackoffLimitExceeded",
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "image-pull-backoff": (
        "job-running",
        ["pod-imagepullbackoff"],
        None,
        "failed",
        "ImagePullBackOff",
        [],
        (INFRA, PREEMPTED, ERROR),
    ),
    "err-image-pull": (
        "job-running",
        ["pod-errimagepull"],
        None,
        "failed",
        "not found",
        [],
        (INFRA, PREEMPTED, ERROR),
    ),
    "missing-secret": (
        "job-running",
        ["pod-createcontainerconfigerror"],
        None,
        "failed",
        'secret "s3-credentials" not found',
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "unschedulable-past-deadline": (
        "job-running",
        ["pod-running", "pod-unschedulable"],
        None,
        "failed",
        "Insufficient nvidia.com/gpu",
        [],
        (INFRA, PREEMPTED, ERROR),
    ),
    "node-vanished": (
        "job-running",
        ["pod-running"],
        {"gke-ml-spot-a100-pool-7c1d9e2b-m9vd"},
        "lost",
        "gke-ml-spot-a100-pool-7c1d9e2b-x2lq",
        ["NodeLost"],
        (PREEMPTED, PREEMPTED, PREEMPTED),
    ),
    "job-deleted": (None, [], None, "lost", "no longer exists", [], (PREEMPTED, PREEMPTED, PREEMPTED)),
    "pytorchjob-failed": (
        "pytorchjob-failed",
        ["pod-pytorchjob-master-running"],
        None,
        "failed",
        "1 Worker replica(s) failed",
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "pytorchjob-succeeded": (
        "pytorchjob-succeeded",
        [],
        None,
        "succeeded",
        None,
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "trainjob-succeeded": (
        "trainjob-succeeded",
        ["pod-trainjob-succeeded"],
        None,
        "succeeded",
        "AllJobsCompleted",
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "trainjob-failed": (
        "trainjob-failed",
        ["pod-trainjob-running", "pod-trainjob-failed"],
        None,
        "failed",
        "FailedJobs: jobset failed",
        [],
        (ERROR, PREEMPTED, ERROR),
    ),
    "trainjob-failed-disrupted": (
        "trainjob-failed",
        ["pod-disruption-preemption-by-scheduler"],
        None,
        "failed",
        "FailedJobs",
        ["PreemptionByScheduler"],
        (PREEMPTED, PREEMPTED, PREEMPTED),
    ),
    # the kubelet's evictions: TerminationByKubelet like a node shutdown, but infrastructure
    "evicted-node-pressure": (
        "job-failed-podfailurepolicy",
        ["pod-evicted-node-pressure"],
        None,
        "failed",
        "PodFailurePolicy",
        [],
        (INFRA, INFRA, INFRA),
    ),
    "evicted-cache-over-its-size-limit": (
        "job-failed-evicted-cache",
        ["pod-evicted-cache-sizelimit"],
        None,
        "failed",
        "PodFailurePolicy",
        [],
        (INFRA, INFRA, INFRA),
    ),
    "trainjob-running-node-vanished": (
        "trainjob-running",
        ["pod-trainjob-running"],
        set(),
        "lost",
        "gke-ml-spot-a100-pool-7c1d9e2b-x2lq",
        ["NodeLost"],
        (PREEMPTED, PREEMPTED, PREEMPTED),
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_final_states_and_their_classification(row):
    job, pods, present, phase, reason, disruptions, verdicts = row
    state = state_of(job, pods, present)
    assert state["phase"] == phase
    if reason:
        assert reason in state["reason"]
    assert [d["reason"] for d in state["disruptions"]] == disruptions
    assert bool(state.get("infra_reason")) == (verdicts[0] == INFRA)
    json.dumps(state)  # travels in a TriggerEvent and job.json
    got = tuple(classify_attempt(state, record(o))["classification"] for o in (None, "preempted", "failed"))
    assert got == verdicts


@pytest.mark.parametrize("name", ROWS)
def test_only_pods_finding_no_node_mark_the_state_unschedulable(name):
    """The operator falls back from spot to on-demand on ``unschedulable``; no other failure
    (image pull, disruption, OOM, a failed job) carries it."""
    job, pods, present, *_ = ROWS[name]
    state = state_of(job, pods, present)
    if name == "unschedulable-past-deadline":
        assert state["unschedulable"] is True and state["phase"] == "failed"
        assert state["infra_reason"].startswith("Unschedulable: pod ")
    else:
        assert "unschedulable" not in state


def test_a_completed_record_with_a_complete_job_is_success():
    state = state_of("job-complete", ["pod-succeeded"])
    assert classify_attempt(state, record("completed"))["classification"] == SUCCEEDED


def test_disruption_names_the_pod_index_and_the_clusters_message():
    state = state_of("job-failed-podfailurepolicy", ["pod-running", "pod-disruption-taint-manager"])
    assert state["disruptions"] == [
        {
            "node": 1,
            "pod": "train-5f1c2a9e-a1-1-k7q2m",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
        }
    ]
    verdict = classify_attempt(state, None)
    assert "DeletionByTaintManager" in verdict["reason"]


def test_a_disrupted_pod_already_gone_shows_in_the_jobs_failed_condition():
    # The preempted pod and the ones the controller deleted have left the API: only the Job's
    # podFailurePolicy condition says DisruptionTarget, and that is a preemption, not an error.
    state = state_of("job-failed-podfailurepolicy", [])
    assert state["phase"] == "failed" and state["nodes"] == []
    (disruption,) = state["disruptions"]
    assert (disruption["pod"], disruption["reason"]) == ("train-5f1c2a9e-a1-1-k7q2m", "DisruptionTarget")
    assert classify_attempt(state, None)["classification"] == PREEMPTED
    assert state_of("job-failed-exitcode", [])["disruptions"] == []  # an exit-code rule is no disruption


def test_oom_is_reported_on_the_node_and_in_the_reason():
    state = state_of("job-failed-exitcode", ["pod-running", "pod-oomkilled"])
    node = state["nodes"][1]
    assert (node["index"], node["exit_code"], node["reason"]) == (1, 137, "OOMKilled")
    assert state["reason"].startswith("OOMKilled: pod train-5f1c2a9e-a1-1-k7q2m (node 1)")
    assert "OOMKilled" in classify_attempt(state, None)["reason"]


@pytest.mark.parametrize("code", [1, 137, 143])
def test_an_exit_code_alone_is_never_a_preemption(code):
    pod = load("pod-error-exit1")
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = code
    state = state_of("job-failed-exitcode", [pod])
    assert state["disruptions"] == [] and state["nodes"][0]["exit_code"] == code
    assert classify_attempt(state, None)["classification"] == ERROR


def test_unschedulable_within_the_deadline_is_still_pending():
    state = state_of("job-running", ["pod-unschedulable"], now=CREATED + timedelta(seconds=899))
    assert (state["phase"], state.get("infra_reason")) == ("pending", None)
    state = state_of("job-running", ["pod-unschedulable"], now=CREATED + timedelta(seconds=901))
    assert state["phase"] == "failed" and "901s (deadline 900s)" in state["infra_reason"]
    assert state["unschedulable"] is True


def test_kueue_suspended_job_is_queued_not_stuck_whatever_the_time():
    state = state_of("job-kueue-suspended", ["pod-unschedulable"], now=CREATED + timedelta(days=2))
    assert state["phase"] == "pending" and "Kueue" in state["reason"]
    assert "infra_reason" not in state
    suspended = load("pytorchjob-running")
    suspended["spec"]["runPolicy"]["suspend"] = True
    assert state_of(suspended, [])["phase"] == "pending"


def test_running_and_pending_gangs():
    assert state_of("job-running", ["pod-running"])["phase"] == "running"
    assert state_of("job-running", [], present=set())["phase"] == "pending"
    live = state_of("job-running", ["pod-running"], present={"gke-ml-spot-a100-pool-7c1d9e2b-x2lq"})
    assert (live["phase"], live["disruptions"]) == ("running", [])


def test_pytorchjob_pods_are_indexed_master_first():
    state = state_of("pytorchjob-running", ["pod-pytorchjob-worker-running", "pod-pytorchjob-master-running"])
    assert state["phase"] == "running"
    assert [(n["index"], n["pod"]) for n in state["nodes"]] == [
        (0, "train-5f1c2a9e-a1-master-0"),
        (2, "train-5f1c2a9e-a1-worker-1"),
    ]


def test_the_trainer_container_is_found_next_to_a_sidecar():
    pod = load("pod-oomkilled")
    sidecar = copy.deepcopy(pod["status"]["containerStatuses"][0])
    sidecar.update(name="istio-proxy", state={"running": {"startedAt": "2026-01-01T10:00:50Z"}})
    pod["spec"]["containers"].insert(0, {"name": "istio-proxy", "image": "istio/proxyv2:1.22.0"})
    pod["status"]["containerStatuses"].insert(0, sidecar)
    assert trainer_container(pod) == "trainer" and node_index(pod) == 1
    state = state_of("job-failed-exitcode", [pod])
    assert (state["nodes"][0]["exit_code"], state["nodes"][0]["reason"]) == (137, "OOMKilled")


def test_trainjob_pods_are_indexed_by_completion_index_in_container_node():
    second = load("pod-trainjob-running")
    second["metadata"]["name"] = "train-5f1c2a9e-a1-node-0-1-x7k2m"
    for meta in (second["metadata"]["labels"], second["metadata"]["annotations"]):
        meta["batch.kubernetes.io/job-completion-index"] = "1"  # jobset job-index stays 0
    state = state_of("trainjob-running", [second, "pod-trainjob-running"])
    assert state["phase"] == "running"
    assert [(n["index"], n["pod"]) for n in state["nodes"]] == [
        (0, "train-5f1c2a9e-a1-node-0-0-p4w8z"),
        (1, "train-5f1c2a9e-a1-node-0-1-x7k2m"),
    ]
    failed = load("pod-trainjob-failed")
    assert trainer_container(failed) == "node" and node_index(failed) == 1
    node = state_of("trainjob-failed", [failed])["nodes"][0]
    assert (node["exit_code"], node["reason"]) == (1, "Error")


def test_trainjob_suspended_by_kueue_is_queued_and_resumed_is_not():
    suspended = load("trainjob-running")
    suspended["spec"]["suspend"] = True
    suspended["status"]["conditions"].append(
        {
            "type": "Suspended",
            "status": "True",
            "reason": "Suspended",
            "message": "TrainJob is suspended",
            "lastTransitionTime": "2026-01-01T10:00:04Z",
        }
    )
    state = state_of(suspended, ["pod-unschedulable"], now=CREATED + timedelta(days=2))
    assert state["phase"] == "pending" and "Kueue" in state["reason"]
    resumed = load("trainjob-running")
    resumed["status"]["conditions"].append(
        {
            "type": "Suspended",
            "status": "False",
            "reason": "Resumed",
            "message": "TrainJob is resumed",
            "lastTransitionTime": "2026-01-01T10:00:09Z",
        }
    )
    assert state_of(resumed, ["pod-trainjob-running"])["phase"] == "running"


def test_trainjob_whose_runtime_cannot_build_a_jobset_fails_at_once():
    broken = load("trainjob-running")
    broken["status"] = {
        "conditions": [
            {
                "type": "Created",
                "status": "False",
                "reason": "JobsBuildFailed",
                "message": "Failed to build Jobs",
                "lastTransitionTime": "2026-01-01T10:00:04Z",
            }
        ]
    }
    state = state_of(broken, [])
    assert state["phase"] == "failed"
    assert state["reason"].startswith("JobsBuildFailed: Failed to build Jobs")
    assert classify_attempt(state, None)["classification"] == ERROR
    creating = load("trainjob-running")
    creating["status"]["conditions"][0].update(status="False", reason="JobsCreationFailed")
    assert state_of(creating, [])["phase"] == "pending"  # the controller retries that one


def test_a_node_pressure_eviction_is_infrastructure_naming_pod_node_and_resource():
    """The kubelet evicted the pod for disk: a relaunch must not spend the preemption budget
    (the trainer got SIGTERM and saved, so its record says preempted), and the report says
    which resource ran out and what to change."""
    state = state_of("job-failed-podfailurepolicy", ["pod-evicted-node-pressure", "pod-running"])
    verdict = classify_attempt(state, record("preempted"))
    assert verdict["classification"] == INFRA
    assert state["disruptions"] == []
    reason = verdict["reason"]
    assert "pod train-5f1c2a9e-a1-1-k7q2m (node 1)" in reason
    assert "gke-ml-spot-a100-pool-7c1d9e2b-x2lq" in reason
    assert "The node was low on resource: ephemeral-storage" in reason
    assert "cache_size" in reason
    assert state["nodes"][1]["reason"] == "Evicted"


def test_a_cache_over_its_size_limit_names_the_volume():
    state = state_of("job-failed-evicted-cache", ["pod-evicted-cache-sizelimit"])
    assert 'Usage of EmptyDir volume "cache" exceeds the limit "180Gi"' in state["infra_reason"]


def test_an_eviction_whose_pod_reason_was_overwritten_is_still_told_by_its_condition():
    pod = load("pod-evicted-node-pressure")
    pod["status"].pop("reason")
    state = state_of("job-failed-podfailurepolicy", [pod])
    assert classify_attempt(state, record("preempted"))["classification"] == INFRA


def test_graceful_node_shutdown_also_terminates_by_the_kubelet_and_stays_a_preemption():
    state = state_of("job-failed-podfailurepolicy", ["pod-disruption-kubelet-shutdown"])
    assert [d["reason"] for d in state["disruptions"]] == ["TerminationByKubelet"]
    assert "infra_reason" not in state
    assert classify_attempt(state, record("preempted"))["classification"] == PREEMPTED


def test_an_eviction_spends_the_infrastructure_budget_not_the_preemption_budget():
    """Folded into job.json as the operator does: the attempt is relaunched after a back-off
    against ``max_infra_retries``, and the preemption count stays 0."""
    from trainops.recovery.record import fold_finished, start_record

    job = start_record(
        run_uri="s3://b/r", config_uri="s3://b/r/config.yaml", cluster="kubernetes", capacity="spot"
    )
    job["attempts"] = [{"attempt": 1, "job": {"cluster": "kubernetes", "job_id": "j", "labels": {}}}]
    state = state_of("job-failed-podfailurepolicy", ["pod-evicted-node-pressure"])
    budgets = {"max_preemptions": 0, "max_infra_retries": 2, "fallback_after": None}
    folded, decision = fold_finished(
        job,
        state=state,
        record=record("preempted"),
        progress=None,
        budgets=budgets,
        at="2026-01-01T11:43:00Z",
    )
    assert (folded["preemptions"], folded["infra_failures"]) == (0, 1)
    assert decision["action"] == "relaunch" and decision.get("delay_s")  # with a preemption budget of 0
    entry = folded["attempts"][0]
    assert entry["classification"] == "infra" and "low on resource: ephemeral-storage" in entry["reason"]


def test_the_billed_window_is_first_pod_start_to_last_trainer_exit():
    start = datetime(2026, 1, 1, 10, 0, 41, tzinfo=UTC).timestamp()
    done = state_of("job-complete", ["pod-succeeded"])
    assert (done["start_time"], done["end_time"]) == (
        start,
        datetime(2026, 1, 1, 11, 42, 17, tzinfo=UTC).timestamp(),
    )
    late = load("pod-oomkilled")
    late["status"]["startTime"] = "2026-01-01T10:05:00Z"
    late["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "2026-01-01T11:50:00Z"
    both = state_of("job-failed-exitcode", ["pod-succeeded", late])
    assert (both["start_time"], both["end_time"]) == (
        start,
        datetime(2026, 1, 1, 11, 50, tzinfo=UTC).timestamp(),
    )
    # a pod still running: started, not ended; no pod yet: neither
    running = state_of("job-running", ["pod-running", "pod-succeeded"])
    assert running["start_time"] == start and "end_time" not in running
    assert "start_time" not in state_of("job-running", [], present=set())


def at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_the_cluster_clocks_times_are_read_as_the_api_server_wrote_them():
    """What the cost accounting holds the trainer's clock against: the last trainer container's
    start (the gang assembles then), the Job's creation, and when the backend read the state."""
    late = load("pod-running")
    late["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = "2026-01-01T10:06:30Z"
    state = state_of("job-running", ["pod-succeeded", late])
    assert state["start_time"] == at("2026-01-01T10:00:41Z")  # the kubelet took the pods
    assert state["gang_start_time"] == at("2026-01-01T10:06:30Z")  # the later container
    assert state["launch_time"] == at("2026-01-01T10:00:04Z")  # the Job's creationTimestamp
    assert state["observed_time"] == NOW.timestamp() and "end_time" not in state
    assert "launch_time" not in state_of(None, ["pod-running"])  # the Job is gone: lost


def test_a_finished_job_whose_pods_are_gone_is_timed_by_the_job_itself():
    complete = state_of("job-complete", [])
    assert (complete["start_time"], complete["end_time"]) == (
        at("2026-01-01T10:00:04Z"),
        at("2026-01-01T12:10:40Z"),  # completionTime
    )
    failed = state_of("job-failed-podfailurepolicy", [])
    assert failed["end_time"] == at("2026-01-01T11:42:19Z")  # its Failed condition: no pod left running
    running = state_of("job-running", [])  # no pod yet: nothing started, nothing billed
    assert "start_time" not in running and "end_time" not in running
