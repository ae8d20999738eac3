"""KubernetesCluster against an in-memory API at the hook boundary (no cluster runs here).
``fake_k8s.FakeKubernetes`` answers with recorded objects, for what the backend parses out of
a real cluster's answers; ``control_plane.ControlPlane`` simulates one, for how the backend
behaves over time and under API faults (retries, lost replies, 409s)."""

import json
import re
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from tests.trainops.cluster.test_torchrun_log import PREEMPTED_NODE_0
from tests.trainops.operators.helpers import staged_dataset
from trainops.cluster import get_cluster
from trainops.cluster.base import JobAlreadyExists
from trainops.cluster.kubernetes.api_retry import ApiUnavailable
from trainops.cluster.kubernetes.backend import KubernetesCluster
from trainops.cluster.kubernetes.names import label_value
from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec, JobSpecError
from trainops.cluster.torchrun_log import MAX_BLOCK_LINES
from trainops.operators import EvaluateModelOperator, FSDPTrainingOperator
from trainops.operators.fail_fast import fail_fast
from trainops.recovery.classify import PREEMPTED, classify_attempt

from .control_plane import COMPLETION_INDEX, ControlPlane
from .fake_k8s import EKS_NODE, GKE_NODE, LONG_RUN, NODE0, RECORDED, T0, FakeKubernetes, load


@pytest.fixture
def api():
    return FakeKubernetes()


def spec(**kw):
    return JobSpec(
        **{
            "name": "train-0a1b2c3d-a1",
            "args": ["python", "-m", "trainer", "train"],
            "nodes": 2,
            "namespace": "ml",
            "labels": {"trainops/dag": "retrain", "trainops/run": LONG_RUN, "trainops/attempt": "1"},
            **kw,
        }
    )


def relaunched_node0(name, phase="Running", created="2026-01-01T11:00:05Z"):
    """pod-running as a later pod of the same index (a retry or a relaunch)."""
    pod = load("pod-running")
    pod["metadata"].update(name=name, creationTimestamp=created)
    pod["status"]["phase"] = phase
    return pod


def handle_of_recorded(kind="indexed-job"):
    return {
        "cluster": "kubernetes",
        "job_id": RECORDED,
        "kind": kind,
        "namespace": "ml",
        "labels": {},
        "manifests": [{"kind": "Service", "name": RECORDED}, {"kind": "Job", "name": RECORDED}],
    }


def test_launch_creates_the_rendered_objects_labelled_for_reattachment(api):
    handle = KubernetesCluster(hook=api).launch(spec())
    assert [c[:2] for c in api.calls] == [("create", "Service"), ("create", "Job")]
    assert sorted(k[:2] for k in api.objects) == [("Job", "ml"), ("Service", "ml")]
    for obj in api.objects.values():
        labels = obj["metadata"]["labels"]
        assert labels["trainops/dag"] == "retrain" and labels["trainops/job"] == handle["job_id"]
        assert len(labels["trainops/run"]) <= 63  # fitted, so selectors use label_value too
    pod_labels = api.objects[("Job", "ml", handle["job_id"])]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["trainops/job"] == handle["job_id"]
    assert json.loads(json.dumps(handle)) == handle  # XCom and trigger safe
    assert handle["kind"] == "indexed-job" and handle["labels"]["trainops/run"] == LONG_RUN
    assert [m["kind"] for m in handle["manifests"]] == ["Service", "Job"]


def test_launch_volcano_and_pytorchjob_use_the_custom_objects_api(api):
    cluster = KubernetesCluster(hook=api)
    cluster.launch(spec(scheduler="volcano:gpu"))
    cluster.launch(spec(name="train-0a1b2c3d-a2", kind="pytorchjob"))
    assert sorted(k[0] for k in api.objects) == ["Job", "PodGroup", "PyTorchJob", "Service"]


def test_a_failed_launch_leaves_nothing_behind(api):
    api.fail["Job"] = 403
    with pytest.raises(ApiException):
        KubernetesCluster(hook=api).launch(spec())
    assert api.objects == {}  # the Service created first was deleted again


def test_launch_errors_name_the_existing_job_and_the_namespace_mismatch(api):
    with pytest.raises(ValueError, match="'ml' differs from the backend's namespace 'prod'"):
        KubernetesCluster(namespace="prod", hook=api).launch(spec())
    assert api.calls == []
    api.fail["Job"] = 409
    with pytest.raises(RuntimeError, match=r"Job 'train-0a1b2c3d-a1' already exists in namespace 'ml'"):
        KubernetesCluster(hook=api).launch(spec())


def test_status_of_a_preempted_gang_from_recorded_objects(api):
    api.add(
        load("job-failed-podfailurepolicy"),
        load("pod-succeeded"),
        load("pod-disruption-preemption-by-scheduler"),
    )
    state = KubernetesCluster(hook=api).status(handle_of_recorded())
    assert state["phase"] == "failed"
    assert [n["index"] for n in state["nodes"]] == [0, 1]
    assert state["disruptions"][0]["reason"] == "PreemptionByScheduler"
    assert classify_attempt(state, None)["classification"] == PREEMPTED


def test_status_sees_a_vanished_node_and_copes_without_node_rbac(api):
    api.add(load("job-running"), load("pod-running"))
    cluster = KubernetesCluster(hook=api)
    assert cluster.status(handle_of_recorded())["phase"] == "lost"  # node not in api.nodes
    api.nodes.add("gke-ml-spot-a100-pool-7c1d9e2b-x2lq")
    assert cluster.status(handle_of_recorded())["phase"] == "running"
    pod = load("pod-running")
    pod["spec"]["nodeName"] = "forbidden"  # read_node answers 403 for it
    api.add(pod)
    assert cluster.status(handle_of_recorded())["phase"] == "running"
    assert cluster._read_nodes is False  # asked once, not at every poll


def test_status_of_a_pytorchjob_and_of_a_deleted_job(api):
    api.nodes.update({"gke-ml-spot-a100-pool-7c1d9e2b-x2lq", "ip-10-0-12-34.ec2.internal"})
    api.add(
        load("pytorchjob-running"),
        load("pod-pytorchjob-master-running"),
        load("pod-pytorchjob-worker-running"),
    )
    state = KubernetesCluster(hook=api).status(handle_of_recorded("pytorchjob"))
    assert (state["phase"], [n["index"] for n in state["nodes"]]) == ("running", [0, 2])
    assert KubernetesCluster(hook=api).status(handle_of_recorded())["phase"] == "lost"  # no Job


def test_delete_is_foreground_and_removes_the_service(api):
    cluster = KubernetesCluster(hook=api)
    api.add(
        load("job-running"),
        load("pod-running"),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": RECORDED, "namespace": "ml"}},
    )
    assert cluster.all_gone(handle_of_recorded()) is False
    cluster.delete(handle_of_recorded())
    assert ("delete", "Job", RECORDED, "Foreground") in api.calls
    assert api.objects == {}
    assert cluster.all_gone(handle_of_recorded()) is True
    cluster.delete(handle_of_recorded())  # twice is harmless (on_kill after a failure)


def test_find_reattaches_to_the_live_job_only(api):
    cluster = KubernetesCluster(namespace="ml", hook=api)
    handle = cluster.launch(spec())
    finished = load("job-complete")
    finished["metadata"]["labels"].update({"trainops/dag": "retrain", "trainops/run": label_value(LONG_RUN)})
    api.add(finished)
    found = cluster.find({"trainops/dag": "retrain", "trainops/run": LONG_RUN})
    assert [(h["job_id"], h["kind"]) for h in found] == [(handle["job_id"], "indexed-job")]
    assert found[0]["labels"]["trainops/attempt"] == "1"
    cluster.delete(found[0])
    assert api.objects == {("Job", "ml", RECORDED): finished}  # the reattached handle deletes all
    api.crds.clear()  # no Training Operator installed: no PyTorchJobs, no error
    api.add(load("job-running"))
    assert [h["job_id"] for h in cluster.find({"trainops/dag": "retrain"})] == [RECORDED]


def test_logs_tail_reads_each_pods_trainer_container(api):
    api.add(load("job-failed-exitcode"), load("pod-oomkilled"), load("pod-running"))
    api.write_log(NODE0, *(f"step {i}" for i in range(100)), at=T0)
    out = KubernetesCluster(hook=api).logs_tail(handle_of_recorded(), lines=2)
    assert out.splitlines() == [
        "[node-0] step 98",
        "[node-0] step 99",
        f"[node-1] (no log for pod {RECORDED}-1-k7q2m: Bad Request)",
    ]
    # with room for the start of a torchrun traceback, which is folded
    assert ("log", f"{RECORDED}-0-k7q2m", "trainer", 2 + MAX_BLOCK_LINES) in api.calls


def test_get_cluster_builds_the_backend_from_an_airflow_connection(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_K8S_ML", json.dumps({"conn_type": "kubernetes", "extra": {"namespace": "ml-team"}})
    )
    cluster = get_cluster("kubernetes", kubernetes_conn_id="k8s_ml", namespace=None)
    assert isinstance(cluster, KubernetesCluster) and cluster._hook is None  # lazy: no I/O yet
    assert cluster.namespace == "ml-team"
    assert type(cluster.hook).__name__ == "KubernetesHook" and cluster.hook.conn_id == "k8s_ml"
    assert get_cluster("kubernetes", namespace="ml").namespace == "ml"


def test_the_operators_hand_conn_id_and_namespace_to_backend_and_trigger(file_root, api, monkeypatch):
    seen = []  # get_cluster's options as the operators pass them; the API is the fake's
    monkeypatch.setattr(
        "trainops.cluster.get_cluster",
        lambda name, **options: seen.append((name, options)) or KubernetesCluster(**options, hook=api),
    )
    ti = SimpleNamespace(dag_id="retrain", run_id="manual__1", task_id="train", map_index=-1)
    options = {"kubernetes_conn_id": "k8s_ml", "namespace": "ml"}
    train = FSDPTrainingOperator(
        task_id="train",
        dataset=staged_dataset(f"{file_root}/datasets/d/v1"),
        storage_root=file_root,
        cluster="kubernetes",
        trainer_config={"train.max_steps": 10},
        **options,
    )
    evaluate = EvaluateModelOperator(
        task_id="evaluate",
        model_name="m",
        storage_root=file_root,
        cluster="kubernetes",
        training={"run_uri": f"{file_root}/runs/r", "config_uri": "c", "export_uri": "e"},
        **options,
    )
    for op in (train, evaluate):
        with pytest.raises(TaskDeferred) as deferred:
            op.execute({"ti": ti})
        sent = deferred.value.trigger.serialize()[1]["cluster_options"]
        assert sent.items() >= options.items()  # (train adds its unschedulable deadline)
        assert seen[-1] == ("kubernetes", sent)  # the trigger polls the backend that launched
    assert seen and all(s[0] == "kubernetes" and s[1].items() >= options.items() for s in seen)
    assert sorted((k[0], k[1], k[2][:5]) for k in api.objects) == [
        ("Job", "ml", "eval-"),
        ("Job", "ml", "train"),
        ("Service", "ml", "train"),
    ]


def test_the_unschedulable_deadline_reads_times_through_the_client_models(api):
    api.add(load("job-running"), load("pod-unschedulable"))  # unschedulable since 2026-01-01
    late = KubernetesCluster(hook=api, unschedulable_deadline_s=60).status(handle_of_recorded())
    assert late["phase"] == "failed" and "Insufficient nvidia.com/gpu" in late["infra_reason"]
    patient = KubernetesCluster(hook=api, unschedulable_deadline_s=10**9)
    assert patient.status(handle_of_recorded())["phase"] == "pending"


# -- node 0's log, a few lines at a time ---------------------------------------------------
def stream(api, **kw):
    """A backend whose clock is the fake API server's."""
    return KubernetesCluster(hook=api, clock=lambda: api.now, **kw)


def test_log_lines_reads_node0_then_only_what_is_new(api):
    api.add(load("job-running"), load("pod-running"), load("pod-oomkilled"))
    api.write_log(f"{RECORDED}-1-k7q2m", "node 1 says", at=T0)  # not node 0: never returned
    api.write_log(NODE0, "start", at=T0 + 1)
    api.write_log(NODE0, "step 1", "step 2", at=T0 + 2, every=0)  # the same timestamp
    api.now = T0 + 3
    cluster = stream(api)
    lines, cursor = cluster.log_lines(handle_of_recorded(), None)
    assert lines == ["start", "step 1", "step 2"]  # timestamps stripped
    assert cursor == {"pod": NODE0, "ts": "2026-01-01T10:00:02Z", "n": 2}
    assert json.loads(json.dumps(cursor)) == cursor  # it travels in a trigger's kwargs
    assert api.log_reads[-1] == {
        "pod": NODE0,
        "tail_lines": 201,
        "since_seconds": None,
        "limit_bytes": 1 << 20,
        "timestamps": True,
    }

    api.write_log(NODE0, "step 3", at=T0 + 2)  # a third line of that very nanosecond
    api.write_log(NODE0, "step 4", at=T0 + 2.5)  # "…:02.5Z" sorts before "…:02Z" as a string
    api.now = T0 + 9.5
    lines, cursor = cluster.log_lines(handle_of_recorded(), cursor)
    assert lines == ["step 3", "step 4"]
    assert api.log_reads[-1]["since_seconds"] == 9  # ceil(9.5 - 2) + 1: re-reads "step 1"..
    assert cursor == {"pod": NODE0, "ts": "2026-01-01T10:00:02.5Z", "n": 1}
    assert cluster.log_lines(handle_of_recorded(), cursor) == ([], cursor)


def test_log_lines_caps_a_backlog_with_a_notice_of_what_was_skipped(api):
    api.add(load("job-running"), load("pod-running"))
    api.write_log(NODE0, *(f"step {i}" for i in range(250)), at=T0, every=0.01)
    api.now = T0 + 3
    cluster = stream(api)
    lines, cursor = cluster.log_lines(handle_of_recorded(), None)  # the last 201 were read
    assert lines == ["(… earlier lines skipped)"] + [f"step {i}" for i in range(51, 250)]
    api.write_log(NODE0, *(f"step {i}" for i in range(250, 550)), at=T0 + 3, every=0.01)
    api.now = T0 + 7
    lines, cursor = cluster.log_lines(handle_of_recorded(), cursor, max_lines=100)
    assert lines == ["(… 201 earlier lines skipped)"] + [f"step {i}" for i in range(451, 550)]
    assert cluster.log_lines(handle_of_recorded(), cursor, max_lines=100)[0] == []


def test_log_lines_byte_cap_never_loses_or_repeats_a_line(api):
    api.add(load("job-running"), load("pod-running"))
    api.write_log(NODE0, "start", at=T0)
    api.now = T0 + 1
    cluster = stream(api)
    cluster.log_limit_bytes = 120  # under three lines per read, one of them seen before
    seen, cursor = cluster.log_lines(handle_of_recorded(), None)
    api.write_log(NODE0, *(f"step {i:02d} loss 0.{i:02d}" for i in range(40)), at=T0 + 1, every=2)
    api.now = T0 + 82
    for _ in range(100):
        lines, cursor = cluster.log_lines(handle_of_recorded(), cursor)
        if not lines:
            break
        seen += lines
    assert seen == ["start"] + [f"step {i:02d} loss 0.{i:02d}" for i in range(40)]
    assert all(r["limit_bytes"] == 120 for r in api.log_reads)


def test_log_lines_skips_ahead_when_the_byte_cap_holds_only_seen_lines(api):
    api.add(load("job-running"), load("pod-running"))
    api.write_log(NODE0, *(f"burst {i}" for i in range(20)), at=T0, every=0.001)
    api.now = T0 + 1
    cluster = stream(api)
    cluster.log_limit_bytes = 150
    _, cursor = cluster.log_lines(handle_of_recorded(), None, max_lines=3)
    api.write_log(NODE0, *(f"after {i}" for i in range(5)), at=T0 + 1, every=0.25)
    api.now = T0 + 3
    lines, cursor = cluster.log_lines(handle_of_recorded(), cursor, max_lines=3)
    # the since read holds only burst lines seen before; the tail (4 lines) reaches none of them
    assert lines == ["(… earlier lines skipped)", "after 3", "after 4"]
    assert cursor == {"pod": NODE0, "ts": "2026-01-01T10:00:02Z", "n": 1}
    assert [r["tail_lines"] for r in api.log_reads] == [4, None, 4]


def test_log_lines_follows_node0_to_its_new_pod(api):
    api.add(load("job-running"), load("pod-running"))
    api.write_log(NODE0, "old pod", at=T0 + 50)
    _, cursor = stream(api).log_lines(handle_of_recorded(), None)
    api.objects[("Pod", "ml", NODE0)]["status"]["phase"] = "Failed"
    api.add(relaunched_node0(f"{RECORDED}-0-p4x8z"))  # index 0 retried: a newer pod
    api.write_log(f"{RECORDED}-0-p4x8z", "new pod line 1", "new pod line 2", at=T0 + 40)
    lines, cursor = stream(api).log_lines(handle_of_recorded(), cursor)
    assert lines == ["new pod line 1", "new pod line 2"]  # not dropped as older than the cursor
    assert cursor == {"pod": f"{RECORDED}-0-p4x8z", "ts": "2026-01-01T10:00:40.5Z", "n": 1}
    assert api.log_reads[-1]["tail_lines"] == 201  # a first read of that pod


def test_log_lines_of_a_pod_not_started_or_gone_is_empty_and_keeps_the_cursor(api):
    cluster, cursor = stream(api), {"pod": NODE0, "ts": "2026-01-01T10:00:02Z", "n": 1}
    assert cluster.log_lines(handle_of_recorded(), None) == ([], None)  # no pod yet
    api.add(load("job-running"), load("pod-createcontainerconfigerror"))  # Pending
    assert cluster.log_lines(handle_of_recorded(), cursor) == ([], cursor)
    assert api.log_reads == []  # a Pending pod's log is not asked for
    api.add(load("pod-running"))  # Running, but the API says it is still waiting to start
    assert cluster.log_lines(handle_of_recorded(), None) == ([], None)
    api.write_log(NODE0, "hello", at=T0)
    api.fail[("log", NODE0)] = 404  # deleted between the list and the read
    assert cluster.log_lines(handle_of_recorded(), cursor) == ([], cursor)
    api.fail[("log", NODE0)] = 403  # anything else but a blip (retried) is the caller's to handle
    with pytest.raises(ApiException):
        cluster.log_lines(handle_of_recorded(), cursor)


def test_log_lines_of_a_finished_pod_keep_its_unterminated_last_line(api):
    api.add(load("job-complete"), load("pod-succeeded"))
    api.write_log(NODE0, "final words", at=T0)
    api.write_log(NODE0, "no newline", at=T0 + 1, newline=False)
    assert stream(api).log_lines(handle_of_recorded(), None)[0] == ["final words", "no newline"]
    api.objects[("Pod", "ml", NODE0)]["status"]["phase"] = "Running"  # may still be written
    assert stream(api).log_lines(handle_of_recorded(), None)[0] == ["final words"]


TORCHRUN_FOLDED = "torchrun: worker rank 0 exited with code 143 (SIGTERM); torchrun's traceback is left out"


def test_a_preempted_pods_torchrun_traceback_reaches_the_task_log_as_one_line(api):
    """The agent writes its ChildFailedError block over a moment: while the pod runs, a block
    read half-way waits (the cursor stops before it); read whole, it is one line."""
    preempted = PREEMPTED_NODE_0.splitlines()
    block = next(i for i, line in enumerate(preempted) if line.startswith("Traceback"))
    api.add(load("job-running"), load("pod-running"))
    api.write_log(NODE0, "step 55", *preempted[: block + 8], at=T0, every=0.001)  # cut mid-block
    api.now = T0 + 1
    cluster = stream(api)
    lines, cursor = cluster.log_lines(handle_of_recorded(), None)
    assert lines == ["step 55", *preempted[:block]]  # the trainer's own lines, not the block yet
    api.write_log(NODE0, *preempted[block + 8 :], at=T0 + 1, every=0.001)
    api.objects[("Pod", "ml", NODE0)]["status"]["phase"] = "Failed"
    api.now = T0 + 2
    lines, _ = cluster.log_lines(handle_of_recorded(), cursor)
    assert lines == [TORCHRUN_FOLDED]
    assert not any("Traceback" in line or "ChildFailedError" in line for line in lines)


def test_logs_tail_folds_torchruns_traceback_and_keeps_the_trainers(api):
    api.add(load("job-failed-exitcode"), load("pod-oomkilled"), load("pod-running"))
    api.write_log(NODE0, *(f"step {i}" for i in range(50)), *PREEMPTED_NODE_0.splitlines(), at=T0)
    out = KubernetesCluster(hook=api).logs_tail(handle_of_recorded(), lines=3).splitlines()
    assert out[:3] == [
        "[node-0] [trainer] preempted by SIGTERM: committed step 56, exiting",
        f"[node-0] {PREEMPTED_NODE_0.splitlines()[1]}",
        f"[node-0] {TORCHRUN_FOLDED}",
    ]


def test_log_reads_bypass_the_clients_bytes_repr(api):
    api.add(load("job-running"), load("pod-running"))
    api.write_log(NODE0, '{"step": 1, "loss": "é"}', at=T0)  # JSON and non-ASCII, verbatim
    assert stream(api).log_lines(handle_of_recorded(), None)[0] == ['{"step": 1, "loss": "é"}']
    assert stream(api).logs_tail(handle_of_recorded(), lines=1) == '[node-0] {"step": 1, "loss": "é"}'


# -- node types for the cost report -----------------------------------------------------
def test_status_nodes_carry_instance_and_capacity_type(api):
    api.add(
        load("node-gke-spot-a2"),
        load("node-karpenter-spot-p4d"),
        load("pytorchjob-running"),
        load("pod-pytorchjob-master-running"),
        load("pod-pytorchjob-worker-running"),
    )
    state = KubernetesCluster(hook=api).status(handle_of_recorded("pytorchjob"))
    assert [(n["index"], n["node_name"], n["instance_type"], n["capacity_type"]) for n in state["nodes"]] == [
        (0, GKE_NODE, "a2-highgpu-8g", "spot"),
        (2, EKS_NODE, "p4d.24xlarge", "spot"),
    ]


def test_node_labels_are_read_once_but_a_vanished_node_is_seen_at_each_poll(api):
    api.add(
        load("node-gke-spot-a2"), load("job-running"), load("pod-running"), load("pod-error-exit1")
    )  # node 1 failed on a node that is long gone
    cluster = KubernetesCluster(hook=api)
    for _ in range(3):
        state = cluster.status(handle_of_recorded())
    assert state["phase"] == "running"
    reads = [c[1] for c in api.calls if c[0] == "read_node"]
    assert reads.count(GKE_NODE) == 3  # running pod's node: is it still there?
    node1 = state["nodes"][1]
    assert node1["node_name"] == GKE_NODE  # pod-error-exit1 ran there too
    api.nodes.discard(GKE_NODE)  # the spot VM is reclaimed
    state = cluster.status(handle_of_recorded())
    assert state["phase"] == "lost"
    assert state["nodes"][0]["instance_type"] == "a2-highgpu-8g"  # remembered for the report


def test_labels_of_a_finished_pods_node_are_read_once(api):
    api.add(load("node-karpenter-spot-p4d"), load("job-failed-exitcode"))
    pod = load("pod-error-exit1")
    pod["spec"]["nodeName"] = EKS_NODE
    gone = load("pod-succeeded")
    gone["spec"]["nodeName"] = "ip-10-0-99-99.ec2.internal"  # scaled down since: 404
    api.add(pod, gone)
    cluster = KubernetesCluster(hook=api)
    for _ in range(3):
        state = cluster.status(handle_of_recorded())
    assert [c[1] for c in api.calls if c[0] == "read_node"] == [
        EKS_NODE,
        "ip-10-0-99-99.ec2.internal",
    ]  # once each, not at every poll
    assert [(n["instance_type"], n["capacity_type"]) for n in state["nodes"]] == [
        (None, None),
        ("p4d.24xlarge", "spot"),
    ]


def test_node_types_are_none_without_node_rbac_or_a_node(api):
    pod = load("pod-running")
    pod["spec"]["nodeName"] = "forbidden"  # read_node answers 403
    api.add(load("job-running"), pod, load("pod-unschedulable"))  # node 1: not scheduled
    cluster = KubernetesCluster(hook=api)
    for _ in range(2):
        state = cluster.status(handle_of_recorded())
    assert [(n["instance_type"], n["capacity_type"]) for n in state["nodes"]] == [(None, None), (None, None)]
    assert [c for c in api.calls if c[0] == "read_node"] == [("read_node", "forbidden")]


# -- Kubeflow Trainer v2 TrainJob ----------------------------------------------------------
def test_trainjob_is_created_read_found_and_deleted_through_the_custom_objects_api(api):
    api.crds.add("trainjobs")
    cluster = KubernetesCluster(hook=api, namespace="ml")
    handle = cluster.launch(spec(kind="trainjob", spot_flavour="karpenter", termination_grace_seconds=30))
    assert handle["kind"] == "trainjob" and [m["kind"] for m in handle["manifests"]] == ["TrainJob"]
    assert [c[:2] for c in api.calls] == [("create", "TrainJob")]
    found = cluster.find({"trainops/dag": "retrain", "trainops/run": LONG_RUN})
    assert [(h["job_id"], h["kind"]) for h in found] == [(handle["job_id"], "trainjob")]
    cluster.delete(handle)
    assert api.calls[-1] == ("delete", "TrainJob", handle["job_id"], "Foreground")
    assert cluster.find({"trainops/dag": "retrain"}) == []


def test_trainjob_pods_are_found_by_their_jobset_labels(api):
    api.crds.add("trainjobs")
    api.add(load("trainjob-failed"), load("pod-trainjob-running"), load("pod-trainjob-failed"))
    handle = {
        "cluster": "kubernetes",
        "job_id": RECORDED,
        "kind": "trainjob",
        "namespace": "ml",
        "labels": {},
        "manifests": [{"kind": "TrainJob", "name": RECORDED}],
    }
    state = KubernetesCluster(hook=api).status(handle)
    assert state["phase"] == "failed"
    assert [n["index"] for n in state["nodes"]] == [0, 1]
    assert not KubernetesCluster(hook=api).all_gone(handle)


def test_without_the_trainer_crd_there_are_simply_no_trainjobs(api):
    assert "trainjobs" not in api.crds  # the fake answers 404, as a cluster without Trainer v2
    assert KubernetesCluster(hook=api, namespace="ml").find({"trainops/dag": "retrain"}) == []


# -- API blips, on the simulated control plane ---------------------------------------------


@pytest.fixture
def plane():
    simulated = ControlPlane()
    simulated.sigterm_exit_s = 5
    for name in ("node-a", "node-b"):
        simulated.add_node(name, recorded=load("node-gke-spot-a2"))
    return simulated


def on(plane, **kw):
    return KubernetesCluster(hook=plane, clock=plane.clock, sleep=plane.sleep, **kw)


def test_a_blip_on_every_kind_of_call_is_retried_and_logged_once_with_a_count(plane, caplog):
    for verb, resource, fault in [
        ("create", "services", {"status": 503}),
        ("create", "jobs", {"reset": True}),
        ("get", "jobs", {"status": 500}),
        ("list", "pods", {"status": 504}),
        ("get", "nodes", {"timeout": True}),
        ("get", "pods/log", {"reset": True}),
        ("delete", "jobs", {"status": 502}),
        ("delete", "services", {"status": 503}),
    ]:
        plane.inject(verb, resource, times=1, **fault)
    cluster = on(plane)
    caplog.set_level("WARNING")
    handle = cluster.launch(spec())
    plane.tick(3)
    plane.write_log(plane.pod(handle["job_id"], 0)["metadata"]["name"], "step 1 loss 2.5")
    assert cluster.status(handle)["phase"] == "running"
    assert cluster.log_lines(handle, None)[0] == ["step 1 loss 2.5"]
    cluster.delete(handle)
    assert cluster.api.retries == 8 and plane.faults_injected() == 8
    retries = [r.getMessage() for r in caplog.records if r.name.endswith("api_retry")]
    assert len(retries) == 8 and retries[-1].endswith("(8 API retries so far)")
    assert (
        "list pods ml/trainops/job=train-0a1b2c3d-a1 failed (504 Gateway Timeout); retry 1 in" in retries[3]
    )
    assert "ConnectionResetError(104, 'Connection reset by peer')" in retries[1]
    plane.tick(6)
    assert plane.objects == {}


def test_a_429_waits_at_least_its_retry_after(plane, caplog):
    cluster = on(plane)
    handle = cluster.launch(spec())
    plane.inject("list", "pods", status=429, retry_after=7, times=1)
    before = plane.now
    caplog.set_level("WARNING")
    assert cluster.all_gone(handle) is False
    assert plane.now - before >= 7 and "(429 Too Many Requests); retry 1 in 7.0 s" in caplog.text


def test_answers_are_not_retried(plane):
    cluster = on(plane)
    plane.inject("create", "jobs", status=403, times=1)  # no RBAC to create jobs
    with pytest.raises(ApiException) as denied:
        cluster.launch(spec())
    assert denied.value.status == 403 and cluster.api.retries == 0
    assert [(c.verb, c.resource) for c in plane.calls] == [
        ("list", "nodes"),  # can a node pool hold a pod (they can)
        ("create", "services"),
        ("create", "jobs"),
        ("delete", "services"),  # what the failed launch created is deleted again
    ]
    gone = {**cluster.launch(spec()), "job_id": "train-0a1b2c3d-a9"}
    assert cluster.status(gone)["phase"] == "lost" and cluster.api.retries == 0  # 404: an answer


def test_an_outage_past_the_retry_budget_raises_naming_the_call_and_the_budget(plane):
    cluster = on(plane, api_retry_s=30)
    handle = cluster.launch(spec())
    plane.inject("list", "pods", status=503)  # until further notice
    before = plane.now
    with pytest.raises(ApiUnavailable) as outage:
        cluster.status(handle)
    assert 25 < plane.now - before <= 30 and outage.value.status == 503
    message = str(outage.value)
    assert message.startswith("kubernetes API: list pods ml/trainops/job=train-0a1b2c3d-a1 kept failing for")
    assert "(last: 503 Service Unavailable), beyond the retry budget of 30 s" in message
    assert message.endswith("or raise api_retry_s")
    assert plane.deletions() == []
    with pytest.raises(ApiUnavailable, match="over 1 try"):
        on(plane, api_retry_s=0).status(handle)  # 0: no retries


def test_a_lost_create_reply_then_409_is_job_already_exists_and_deletes_nothing(plane):
    cluster = on(plane)
    plane.inject("create", "jobs", status=504, lost_reply=True, times=1)
    with pytest.raises(JobAlreadyExists, match="this launch created it, and the reply was lost") as exists:
        cluster.launch(spec())
    assert (
        exists.value.handle["job_id"] == "train-0a1b2c3d-a1" and exists.value.handle["kind"] == "indexed-job"
    )
    assert [m["kind"] for m in exists.value.handle["manifests"]] == ["Service", "Job"]
    assert plane.deletions() == [] and plane.jobs() == ["train-0a1b2c3d-a1"]
    assert ("Service", "ml", "train-0a1b2c3d-a1") in plane.objects  # the job's, kept
    with pytest.raises(JobAlreadyExists, match="an earlier launch of this attempt created it"):
        cluster.launch(spec())  # a retried task launching the same attempt again
    assert len([c for c in plane.calls if c.verb == "create" and c.resource == "jobs" and c.acted]) == 1


def test_a_lost_service_create_reply_then_409_is_fine(plane):
    plane.inject("create", "services", status=500, lost_reply=True, times=1)
    handle = on(plane).launch(spec())
    assert plane.jobs() == [handle["job_id"]] and len(plane.pods()) == 2


def test_a_lost_delete_reply_then_404_is_success(plane):
    cluster = on(plane)
    handle = cluster.launch(spec())
    plane.inject("delete", "jobs", status=503, lost_reply=True, times=1)
    cluster.delete(handle)  # the retry finds the Job gone: done, not an error
    assert [c.fault for c in plane.deletions()] == ["503 after acting", None]  # Job, then Service
    plane.tick(6)
    assert plane.objects == {}


def test_a_job_create_whose_reply_was_lost_then_an_outage_leaves_nothing_behind(plane):
    plane.inject("create", "jobs", status=503, lost_reply=True, times=1)  # created, reply lost
    plane.inject("create", "jobs", status=503)  # then the API is down for the retries
    cluster = on(plane, api_retry_s=5)
    with pytest.raises(ApiUnavailable):
        cluster.launch(spec())
    plane.tick(6)
    assert plane.objects == {}  # the Job it may have created (it had) and the Service: deleted


# -- the simulated control plane itself ---------------------------------------------------
# It behaves as the real one does where trainops depends on it: the Job controller on the Job
# trainops renders, graceful deletion, 409s and injected faults. (A wrong simulation would make
# every behaviour test built on it pass for the wrong reason.)

JOB = "train-0a1b2c3d-a1"


@pytest.fixture
def sim():
    """A control plane with three bare nodes, as the tests of the simulation itself use."""
    simulated = ControlPlane()
    for name in ("node-a", "node-b", "node-c"):
        simulated.add_node(name)
    return simulated


def create_rendered(sim, **kw):
    manifests = render_manifests(spec(**kw))
    for manifest in manifests:
        if manifest["kind"] == "Service":
            sim.create_namespaced_service("ml", manifest)
        else:
            sim.create_namespaced_job("ml", manifest)
    return manifests[-1]


def phases(sim):
    return [p["status"]["phase"] for p in sim.pods(JOB)]


def test_the_job_controller_makes_one_pod_per_index_from_the_rendered_template(sim):
    job = create_rendered(sim)
    pods = sim.pods(JOB)
    assert [p["metadata"]["annotations"][COMPLETION_INDEX] for p in pods] == ["0", "1"]
    template = job["spec"]["template"]
    for index, pod in enumerate(pods):
        assert pod["spec"]["containers"][0]["command"] == template["spec"]["containers"][0]["command"]
        assert template["metadata"]["labels"].items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["hostname"] == f"{JOB}-{index}" and pod["spec"]["subdomain"] == JOB
        assert {"name": "JOB_COMPLETION_INDEX", "value": str(index)} in pod["spec"]["containers"][0]["env"]
        assert pod["metadata"]["ownerReferences"][0]["name"] == JOB
    assert phases(sim) == ["Pending", "Pending"]
    sim.tick(1)
    assert {p["spec"]["nodeName"] for p in sim.pods(JOB)} == {"node-a", "node-b"}  # one per node
    sim.tick(2)
    assert phases(sim) == ["Running", "Running"]
    for pod in sim.pods(JOB):
        sim.exit(pod, 0)
    sim.tick(1)
    status = sim.job(JOB)["status"]
    assert [c["type"] for c in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert status["completedIndexes"] == "0-1" and status["succeeded"] == 2


RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def test_the_simulation_stamps_times_where_and_as_an_api_server_does(sim):
    """RFC 3339 UTC from the simulated clock: the pod's startTime when the kubelet takes it
    (before its image is pulled), the container's startedAt when it runs, kept in its
    terminated state with the finishedAt of its exit; a pod on a vanished node gets no
    finishedAt, and the node time it held ends with the node. The backend reads them as the
    cluster's clock (``JobState`` times)."""
    t0 = sim.now
    assert t0 == T0  # 2026-01-01T10:00:00Z
    create_rendered(sim)
    sim.tick(1)  # bound: the kubelets take the pods
    pods = sim.pods(JOB)
    assert [p["status"]["startTime"] for p in pods] == ["2026-01-01T10:00:01Z"] * 2
    assert all("containerStatuses" not in p["status"] for p in pods)  # pulling the image
    sim.tick(2)
    running = [p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] for p in pods]
    assert running == ["2026-01-01T10:00:03Z"] * 2
    sim.tick(7)
    sim.exit(sim.pod(JOB, 0), 0)
    sim.remove_node(sim.pod(JOB, 1)["spec"]["nodeName"])  # the VM of node 1 is reclaimed
    done = sim.pod(JOB, 0)["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (done["startedAt"], done["finishedAt"]) == ("2026-01-01T10:00:03Z", "2026-01-01T10:00:10Z")
    stamps = [sim.job(JOB)["metadata"]["creationTimestamp"], sim.job(JOB)["status"]["startTime"]]
    assert all(RFC3339_UTC.fullmatch(t) for t in [*stamps, *running, done["finishedAt"]])
    sim.tick(5)
    assert sim.node_seconds(JOB) == 2 * (10 - 1)  # both held a node from t0 + 1 to t0 + 10

    state = on(sim).status({"cluster": "kubernetes", "job_id": JOB, "kind": "indexed-job", "namespace": "ml"})
    assert state["phase"] == "lost" and "end_time" not in state  # node 1's pod never finished
    times = {k: state[k] - t0 for k in ("launch_time", "start_time", "gang_start_time")}
    assert times == {"launch_time": 0, "start_time": 1, "gang_start_time": 3}
    assert state["observed_time"] == sim.now == t0 + 15  # when the backend read it: the simulated clock


def test_a_failed_pod_fails_the_job_by_its_pod_failure_policy_and_the_rest_are_deleted(sim):
    create_rendered(sim, termination_grace_seconds=60)
    sim.tick(3)
    sim.exit(sim.pod(JOB, 1), 137)
    sim.tick(1)
    job = sim.job(JOB)
    target = [c for c in job["status"]["conditions"] if c["type"] == "FailureTarget"]
    assert target[0]["message"] == (
        f"Container trainer for pod ml/{JOB}-1-00002 failed with exit code 137 matching FailJob rule at index 1"
    )
    assert sim.pod(JOB, 0)["metadata"]["deletionTimestamp"]  # the controller deletes the rest
    assert not any(c["type"] == "Failed" for c in job["status"]["conditions"])  # not while one runs
    sim.tick(60)  # the grace period: node 0 is killed
    assert [c["type"] for c in job["status"]["conditions"]] == ["FailureTarget", "Failed"]
    sim.tick(1)
    # the pod that failed stays (until the Job is deleted), the deleted one is gone, and no
    # replacement came: backoffLimit 0
    assert [(p["metadata"]["name"], p["status"]["phase"]) for p in sim.pods()] == [
        (f"{JOB}-1-00002", "Failed")
    ]
    assert job["status"]["failed"] == 2


def test_a_disruption_target_matches_the_first_rule_and_an_ignore_rule_replaces_the_pod(sim):
    sim.sigterm_exit_s = 5
    job = create_rendered(sim)
    sim.tick(3)
    sim.preempt(sim.pod(JOB, 1))
    sim.tick(5)  # node 1 exits on SIGTERM; the controller fails the Job, deletes node 0's pod
    assert [c["type"] for c in sim.job(JOB)["status"]["conditions"]] == ["FailureTarget"]
    sim.tick(6)  # which exits on SIGTERM too
    failed = [c for c in sim.job(JOB)["status"]["conditions"] if c["type"] == "Failed"]
    assert failed[0]["message"].endswith("has condition DisruptionTarget matching FailJob rule at index 0")

    job["metadata"]["name"] = "ignoring"
    job["spec"]["podFailurePolicy"]["rules"][0]["action"] = "Ignore"
    sim.create_namespaced_job("ml", job)
    sim.tick(3)
    first = sim.pod("ignoring", 1)
    sim.preempt(first)
    sim.tick(6)
    assert sim.pod("ignoring", 1) is not first  # replaced, and the Job goes on
    assert not sim.job("ignoring")["status"].get("conditions")
    assert sim.job("ignoring")["status"].get("failed", 0) == 0


def test_foreground_keeps_the_job_until_its_pods_are_gone_background_does_not_orphan_keeps_pods(sim):
    create_rendered(sim, termination_grace_seconds=30)
    sim.tick(3)
    sim.delete_namespaced_job(JOB, "ml", propagation_policy="Foreground")
    job = sim.job(JOB)
    assert job["metadata"]["finalizers"] == ["foregroundDeletion"] and job["metadata"]["deletionTimestamp"]
    assert all(p["metadata"]["deletionGracePeriodSeconds"] == 30 for p in sim.pods(JOB))
    sim.tick(29)
    assert phases(sim) == ["Running", "Running"] and sim.jobs() == [JOB]  # Terminating
    sim.tick(1)
    assert sim.pods() == [] and sim.jobs() == []

    sim.create_namespaced_job("ml", render_manifests(spec(termination_grace_seconds=30))[-1])
    sim.tick(3)
    sim.delete_namespaced_job(JOB, "ml", propagation_policy="Background")
    assert sim.jobs() == [] and len(sim.pods(JOB)) == 2  # the garbage collector takes them
    assert all(p["metadata"].get("deletionTimestamp") for p in sim.pods(JOB))
    sim.tick(31)  # the grace period, then the kubelet confirms
    assert sim.pods() == []

    sim.create_namespaced_job("ml", render_manifests(spec(termination_grace_seconds=30))[-1])
    sim.tick(3)
    sim.delete_namespaced_job(JOB, "ml")  # batch/v1's default: orphan
    sim.tick(60)
    assert sim.jobs() == [] and phases(sim) == ["Running", "Running"]


def test_a_pod_on_a_not_ready_node_stays_terminating_forever(sim):
    create_rendered(sim)
    sim.tick(3)
    node = sim.pod(JOB, 0)["spec"]["nodeName"]
    sim.set_ready(node, False)
    sim.delete_namespaced_job(JOB, "ml", propagation_policy="Foreground")
    sim.tick(3600)
    assert [p["spec"]["nodeName"] for p in sim.pods(JOB)] == [node] and sim.jobs() == [JOB]
    sim.remove_node(node)  # the node is gone: the pod garbage collector lets go of the pod
    sim.tick(sim.podgc_s)
    assert sim.pods() == [] and sim.jobs() == []


def test_create_never_overwrites_and_missing_objects_are_404(sim):
    job = create_rendered(sim)
    with pytest.raises(ApiException) as conflict:
        sim.create_namespaced_job("ml", {**job, "spec": {**job["spec"], "completions": 9}})
    assert conflict.value.status == 409 and '"reason": "AlreadyExists"' in conflict.value.body
    assert sim.job(JOB)["spec"]["completions"] == 2
    with pytest.raises(ApiException) as missing:
        sim.read_namespaced_job("nope", "ml")
    assert missing.value.status == 404


def test_faults_by_count_probability_window_and_after_the_server_acted(sim):
    sim.inject("list", "pods", status=429, retry_after=3, times=1)
    with pytest.raises(ApiException) as throttled:
        sim.list_namespaced_pod("ml")
    assert throttled.value.status == 429 and throttled.value.headers["Retry-After"] == "3"
    sim.list_namespaced_pod("ml")  # once only

    sim.inject("get", "nodes", reset=True, between=(sim.now + 10, sim.now + 20))
    sim.read_node("node-a")
    sim.tick(10)
    with pytest.raises(ProtocolError):
        sim.read_node("node-a")
    sim.tick(10)
    sim.read_node("node-a")

    sim.inject("create", "jobs", status=504, lost_reply=True, times=1)
    with pytest.raises(ApiException):
        create_rendered(sim)
    assert sim.jobs() == [JOB] and sim.calls[-1].acted and sim.calls[-1].fault == "504 after acting"

    def draws(seed):
        sim = ControlPlane()
        sim.inject("list", "jobs", probability=0.3, seed=seed)
        failed = []
        for _ in range(50):
            try:
                sim.list_namespaced_job("ml")
                failed.append(False)
            except ApiException:
                failed.append(True)
        return failed

    assert draws(1) == draws(1) != draws(2) and 5 < sum(draws(1)) < 25  # seeded: reproducible


def test_a_pytorchjob_runs_its_replicas_from_the_rendered_templates_and_deletes_in_the_foreground(plane):
    cluster = on(plane)
    handle = cluster.launch(spec(kind="pytorchjob", name="train-0a1b2c3d-a2"))
    plane.tick(3)
    state = cluster.status(handle)
    assert state["phase"] == "running" and [n["index"] for n in state["nodes"]] == [0, 1]
    assert [n["pod"] for n in state["nodes"]] == ["train-0a1b2c3d-a2-master-0", "train-0a1b2c3d-a2-worker-0"]
    master = plane.objects[("Pod", "ml", "train-0a1b2c3d-a2-master-0")]
    assert master["spec"]["containers"][0]["name"] == "pytorch"
    plane.exit(master, 0)
    plane.tick(1)
    assert cluster.status(handle)["phase"] == "succeeded"
    cluster.delete(handle)
    assert plane.objects[("PyTorchJob", "ml", "train-0a1b2c3d-a2")]["metadata"]["finalizers"] == [
        "foregroundDeletion"
    ]
    plane.tick(6)  # the worker, still running (cleanPodPolicy None), exits on SIGTERM
    assert plane.objects == {} and cluster.all_gone(handle)


def test_a_preempted_pod_already_gone_when_the_job_fails_still_counts_as_a_preemption(plane):
    """The scheduler deletes the pod it preempts; once the Job controller has counted it, the
    pod leaves the API, and the other pods (deleted by the controller) follow. By the time the
    Job is Failed no pod may be left: only the Job's condition says DisruptionTarget. Without
    the trainer's record (SIGKILLed before it saved) the attempt must still be a preemption."""
    plane.sigterm_exit_s = 5
    cluster = on(plane)
    handle = cluster.launch(spec())
    plane.tick(3)
    plane.preempt(plane.pod(handle["job_id"], 1))
    plane.tick(12)
    state = cluster.status(handle)
    assert state["phase"] == "failed" and "DisruptionTarget" in state["reason"] and state["nodes"] == []
    assert classify_attempt(state, None)["classification"] == PREEMPTED


# -- a request no node pool can hold is refused before launch ----------------------------------

SMALL = {"cpu": "7910m", "memory": "30Gi", "ephemeral-storage": "100Gi", "pods": "110"}
EKS_ON_DEMAND = {"eks.amazonaws.com/nodegroup": "cpu", "eks.amazonaws.com/capacityType": "ON_DEMAND"}


def small_pool(plane):
    for name in ("cpu-a", "cpu-b"):
        plane.add_node(
            name,
            labels={**EKS_ON_DEMAND, "node.kubernetes.io/instance-type": "m5.2xlarge"},
            allocatable=SMALL,
        )
    return plane


def test_a_pod_no_pool_can_hold_is_refused_before_anything_is_created():
    plane = small_pool(ControlPlane())
    cluster = on(plane)
    with pytest.raises(JobSpecError, match=r"One pod asks for 0 GPUs, 16 CPUs, 4Gi memory") as refused:
        cluster.launch(spec(capacity="on-demand", spot_flavour="eks", cpu="16"))
    assert "pool cpu (on-demand, m5.2xlarge; 2 nodes): 0 GPUs, 7.91 CPUs, 30Gi memory" in str(refused.value)
    assert plane.objects == {} and [c.verb for c in plane.calls] == ["list"]  # nodes, once; nothing created
    handle = cluster.launch(spec(capacity="on-demand", spot_flavour="eks", cpu="7"))  # fits: launched
    assert plane.jobs() == [handle["job_id"]]


def test_the_refusal_fails_the_task_at_once_without_a_retry():
    plane = small_pool(ControlPlane())

    @fail_fast  # as the operators' execute and execute_complete are
    def launch():
        return on(plane).launch(spec(capacity="on-demand", spot_flavour="eks", memory="64Gi"))

    with pytest.raises(AirflowFailException, match=r"no node pool can hold one of its pods.*not retried"):
        launch()
    assert plane.objects == {}


def test_without_rbac_to_list_nodes_the_launch_goes_on_and_says_so_once(caplog):
    plane = small_pool(ControlPlane())
    plane.inject("list", "nodes", status=403)
    cluster = on(plane)
    caplog.set_level("INFO", logger="trainops.cluster.kubernetes.backend")
    cluster.launch(spec(capacity="on-demand", spot_flavour="eks", cpu="16"))
    cluster.launch(spec(name="train-0a1b2c3d-a2", capacity="on-demand", spot_flavour="eks", cpu="16"))
    assert len(plane.jobs()) == 2
    said = [r.getMessage() for r in caplog.records if "list nodes" in r.getMessage()]
    assert len(said) == 1 and "docker/deploy/base/rbac.yaml" in said[0]
    assert sum(1 for c in plane.calls if c.resource == "nodes") == 1  # not asked again


def test_a_cluster_with_no_nodes_yet_or_an_api_outage_launches_anyway(caplog):
    empty = ControlPlane()  # autoscaled from zero: nothing to judge by
    on(empty).launch(spec(capacity="on-demand", spot_flavour="eks", cpu="64"))
    assert len(empty.jobs()) == 1
    plane = small_pool(ControlPlane())
    plane.inject("list", "nodes", status=503, times=1000)
    caplog.set_level("WARNING")
    on(plane, api_retry_s=5).launch(spec(capacity="on-demand", spot_flavour="eks", cpu="16"))
    assert len(plane.jobs()) == 1
    assert any("listing nodes failed" in r.getMessage() for r in caplog.records)
