"""KubernetesCluster against an in-memory API at the hook boundary (no cluster runs here).

``FakeKubernetes`` stands in for the hook and its three clients. It stores what is created,
answers with the recorded objects of tests/data/k8s, and returns what the real client does:
model objects (``V1PodList``) from core/batch, dicts from custom objects, ``ApiException``.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from trainops.cluster import get_cluster
from trainops.cluster.k8s_backend import KubernetesCluster
from trainops.cluster.k8s_names import label_value
from trainops.cluster.spec import JobSpec
from trainops.operators import EvaluateModelOperator, FSDPTrainingOperator
from trainops.policy import PREEMPTED, classify_attempt

DATA = Path(__file__).resolve().parents[2] / "data" / "k8s"
RECORDED = "train-5f1c2a9e-a1"  # the job the recorded objects belong to, in namespace ml
LONG_RUN = "scheduled__2026-01-01T00:00:00+00:00-" + "x" * 60


def load(name):
    return json.loads((DATA / f"{name}.json").read_text())


def _matches(obj, selector):
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (p.split("=", 1) for p in selector.split(",") if p))


class FakeKubernetes:
    """The hook (``core_v1_client``, ``batch_v1_client``, ``custom_object_client``,
    ``get_namespace``) and the clients' methods that the backend calls, in one object."""

    def __init__(self):
        self.core_v1_client = self.batch_v1_client = self.custom_object_client = self
        self.objects = {}  # (kind, namespace, name) -> API JSON
        self.nodes, self.logs, self.calls, self.fail = set(), {}, [], {}
        self.crds, self._api = {"pytorchjobs", "podgroups"}, ApiClient()

    def get_namespace(self):  # the connection names no namespace
        return None

    def add(self, *objs):
        for obj in objs:
            self.objects[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    def _model(self, obj, klass):  # model objects, as the real core and batch clients return
        return self._api.deserialize(SimpleNamespace(data=json.dumps(obj)), klass)

    def _create(self, kind, namespace, body):
        self.calls.append(("create", kind, body["metadata"]["name"]))
        if kind in self.fail:
            raise ApiException(status=self.fail[kind])
        self.add({**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def _get(self, kind, namespace, name):
        if (kind, namespace, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects[(kind, namespace, name)]

    def _list(self, kind, namespace, selector):
        return [o for (k, ns, _), o in sorted(self.objects.items())
                if k == kind and ns == namespace and _matches(o, selector)]

    def _delete(self, kind, namespace, name, **kw):
        self.calls.append(("delete", kind, name, kw.get("propagation_policy")))
        self._get(kind, namespace, name)
        del self.objects[(kind, namespace, name)]
        for key, obj in list(self.objects.items()):  # the garbage collector takes the pods
            if key[0] == "Pod" and any(r["name"] == name and r["kind"] == kind
                                       for r in obj["metadata"].get("ownerReferences", [])):
                del self.objects[key]

    def _plural(self, plural):
        if plural not in self.crds:
            raise ApiException(status=404, reason="Not Found")
        return {"pytorchjobs": "PyTorchJob", "podgroups": "PodGroup"}[plural]

    def create_namespaced_service(self, namespace, body):
        self._create("Service", namespace, body)

    def delete_namespaced_service(self, name, namespace):
        self._delete("Service", namespace, name)

    def list_namespaced_pod(self, namespace, label_selector=""):
        return self._model({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                            "items": self._list("Pod", namespace, label_selector)}, "V1PodList")

    def read_node(self, name):
        if name not in self.nodes:
            raise ApiException(status=403 if name == "forbidden" else 404)
        return self._model({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}, "V1Node")

    def read_namespaced_pod_log(self, name, namespace, container=None, tail_lines=None):
        self.calls.append(("log", name, container, tail_lines))
        if (name, container) not in self.logs:
            raise ApiException(status=400, reason="Bad Request")
        return "\n".join(self.logs[(name, container)].splitlines()[-tail_lines:]) + "\n"

    def create_namespaced_job(self, namespace, body):
        self._create("Job", namespace, body)

    def read_namespaced_job(self, name, namespace):
        return self._model(self._get("Job", namespace, name), "V1Job")

    def list_namespaced_job(self, namespace, label_selector=""):
        return self._model({"apiVersion": "batch/v1", "kind": "JobList", "metadata": {},
                            "items": self._list("Job", namespace, label_selector)}, "V1JobList")

    def delete_namespaced_job(self, name, namespace, propagation_policy=None):
        self._delete("Job", namespace, name, propagation_policy=propagation_policy)

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self._create(self._plural(plural), namespace, body)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        return self._get(self._plural(plural), namespace, name)

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=""):
        return {"items": self._list(self._plural(plural), namespace, label_selector)}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name,
                                        propagation_policy=None):
        self._delete(self._plural(plural), namespace, name, propagation_policy=propagation_policy)


@pytest.fixture
def api():
    return FakeKubernetes()


def spec(**kw):
    return JobSpec(**{"name": "train-0a1b2c3d-a1", "args": ["python", "-m", "trainer", "train"],
                      "nodes": 2, "namespace": "ml",
                      "labels": {"trainops/dag": "retrain", "trainops/run": LONG_RUN,
                                 "trainops/attempt": "1"}, **kw})


def handle_of_recorded(kind="indexed-job"):
    return {"cluster": "kubernetes", "job_id": RECORDED, "kind": kind, "namespace": "ml",
            "labels": {}, "manifests": [{"kind": "Service", "name": RECORDED},
                                        {"kind": "Job", "name": RECORDED}]}


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
    api.add(load("job-failed-podfailurepolicy"), load("pod-succeeded"),
            load("pod-disruption-preemption-by-scheduler"))
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
    api.add(load("pytorchjob-running"), load("pod-pytorchjob-master-running"),
            load("pod-pytorchjob-worker-running"))
    state = KubernetesCluster(hook=api).status(handle_of_recorded("pytorchjob"))
    assert (state["phase"], [n["index"] for n in state["nodes"]]) == ("running", [0, 2])
    assert KubernetesCluster(hook=api).status(handle_of_recorded())["phase"] == "lost"  # no Job


def test_delete_is_foreground_and_removes_the_service(api):
    cluster = KubernetesCluster(hook=api)
    api.add(load("job-running"), load("pod-running"),
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": RECORDED, "namespace": "ml"}})
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
    finished["metadata"]["labels"].update({"trainops/dag": "retrain",
                                           "trainops/run": label_value(LONG_RUN)})
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
    api.logs[(f"{RECORDED}-0-k7q2m", "trainer")] = "".join(f"step {i}\n" for i in range(100))
    out = KubernetesCluster(hook=api).logs_tail(handle_of_recorded(), lines=2)
    assert out.splitlines() == ["[node-0] step 98", "[node-0] step 99",
                                f"[node-1] (no log for pod {RECORDED}-1-k7q2m: Bad Request)"]
    assert ("log", f"{RECORDED}-0-k7q2m", "trainer", 2) in api.calls


def test_get_cluster_builds_the_backend_from_an_airflow_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_K8S_ML", json.dumps(
        {"conn_type": "kubernetes", "extra": {"namespace": "ml-team"}}))
    cluster = get_cluster("kubernetes", kubernetes_conn_id="k8s_ml", namespace=None)
    assert isinstance(cluster, KubernetesCluster) and cluster._hook is None  # lazy: no I/O yet
    assert cluster.namespace == "ml-team"
    assert type(cluster.hook).__name__ == "KubernetesHook" and cluster.hook.conn_id == "k8s_ml"
    assert get_cluster("kubernetes", namespace="ml").namespace == "ml"


def test_the_operators_hand_conn_id_and_namespace_to_backend_and_trigger(file_root, api,
                                                                           monkeypatch):
    seen = []  # get_cluster's options as the operators pass them; the API is the fake's
    monkeypatch.setattr("trainops.cluster.get_cluster", lambda name, **options: seen.append(
        (name, options)) or KubernetesCluster(**options, hook=api))
    ti = SimpleNamespace(dag_id="retrain", run_id="manual__1", task_id="train", map_index=-1)
    options = {"kubernetes_conn_id": "k8s_ml", "namespace": "ml"}
    train = FSDPTrainingOperator(task_id="train", dataset="file:///data/v1", storage_root=file_root,
                                 cluster="kubernetes", trainer_config={"train.max_steps": 10},
                                 **options)
    evaluate = EvaluateModelOperator(task_id="evaluate", model_name="m", storage_root=file_root,
                                     cluster="kubernetes", training={
                                         "run_uri": f"{file_root}/runs/r", "config_uri": "c",
                                         "export_uri": "e"}, **options)
    for op in (train, evaluate):
        with pytest.raises(TaskDeferred) as deferred:
            op.execute({"ti": ti})
        assert deferred.value.trigger.serialize()[1]["cluster_options"] == options
    assert seen and all(s == ("kubernetes", options) for s in seen)
    assert sorted((k[0], k[1], k[2][:5]) for k in api.objects) == [
        ("Job", "ml", "eval-"), ("Job", "ml", "train"), ("Service", "ml", "train")]


def test_the_unschedulable_deadline_reads_times_through_the_client_models(api):
    api.add(load("job-running"), load("pod-unschedulable"))  # unschedulable since 2026-01-01
    late = KubernetesCluster(hook=api, unschedulable_deadline_s=60).status(handle_of_recorded())
    assert late["phase"] == "failed" and "Insufficient nvidia.com/gpu" in late["infra_reason"]
    patient = KubernetesCluster(hook=api, unschedulable_deadline_s=10**9)
    assert patient.status(handle_of_recorded())["phase"] == "pending"
