"""KubernetesCluster against an in-memory API at the hook boundary (no cluster runs here;
``fake_k8s.FakeKubernetes`` stands in for the hook and its clients)."""

import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred
from kubernetes.client.exceptions import ApiException

from tests.trainops.operators.helpers import staged_dataset
from trainops.cluster import get_cluster
from trainops.cluster.kubernetes.backend import KubernetesCluster
from trainops.cluster.kubernetes.names import label_value
from trainops.cluster.spec import JobSpec
from trainops.operators import EvaluateModelOperator, FSDPTrainingOperator
from trainops.recovery.classify import PREEMPTED, classify_attempt

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
    assert ("log", f"{RECORDED}-0-k7q2m", "trainer", 2) in api.calls


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
    api.fail[("log", NODE0)] = 500  # anything else is the caller's to handle
    with pytest.raises(ApiException):
        cluster.log_lines(handle_of_recorded(), cursor)


def test_log_lines_of_a_finished_pod_keep_its_unterminated_last_line(api):
    api.add(load("job-complete"), load("pod-succeeded"))
    api.write_log(NODE0, "final words", at=T0)
    api.write_log(NODE0, "no newline", at=T0 + 1, newline=False)
    assert stream(api).log_lines(handle_of_recorded(), None)[0] == ["final words", "no newline"]
    api.objects[("Pod", "ml", NODE0)]["status"]["phase"] = "Running"  # may still be written
    assert stream(api).log_lines(handle_of_recorded(), None)[0] == ["final words"]


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
