"""An in-memory Kubernetes API at the hook boundary, for tests of what the backend reads out of
a real cluster's answers (recorded objects are the truth for parsing). Behaviour over time
(a Job controller, pod phases, graceful deletion, faults) is ``control_plane.ControlPlane``'s.

``FakeKubernetes`` stands in for the hook and its three clients. It stores what is created
(409 for a name already there, as the API server answers), answers with the recorded objects
of tests/data/k8s, and returns what the real client does:
model objects (``V1PodList``) from core/batch, dicts from custom objects, ``ApiException``.
As the API server does, the items of a core/batch list carry no ``kind`` or ``apiVersion``
(kubernetes/kubernetes#3030); custom objects keep theirs.
"""

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from . import crds as crd_files

DATA = Path(__file__).resolve().parents[3] / "data" / "k8s"
RECORDED = "train-5f1c2a9e-a1"  # the job the recorded objects belong to, in namespace ml
LONG_RUN = "scheduled__2026-01-01T00:00:00+00:00-" + "x" * 60
NODE0 = f"{RECORDED}-0-k7q2m"  # pod-running's name
T0 = 1767261600  # 2026-01-01T10:00:00Z in epoch seconds
GKE_NODE, EKS_NODE = "gke-ml-spot-a100-pool-7c1d9e2b-x2lq", "ip-10-0-12-34.ec2.internal"


def load(name):
    return json.loads((DATA / f"{name}.json").read_text())


def rfc3339nano(ns):
    """A timestamp as the kubelet writes it (Go's RFC3339Nano: trailing zeros dropped)."""
    text = datetime.fromtimestamp(ns // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{ns % 10**9:09d}".rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


def api_error(status, reason, message):
    """An ``ApiException`` with the Status body the API server sends."""
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "code": status,
        }
    )
    return exc


class RawResponse:
    """What the client returns with ``_preload_content=False``: urllib3's response."""

    def __init__(self, data):
        self.data, self.released = data, False

    def release_conn(self):
        self.released = True


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
        self.node_objects = {}  # name -> a recorded Node; other nodes in ``nodes`` are bare
        self.log_reads = []  # the query of each log read
        self.now = T0 + 60.0  # the API server's clock (epoch s), for since_seconds
        self.crds, self._api = {"pytorchjobs", "podgroups"}, ApiClient()

    def get_namespace(self):  # the connection names no namespace
        return None

    def add(self, *objs):
        for obj in objs:
            if obj["kind"] == "Node":
                self.nodes.add(obj["metadata"]["name"])
                self.node_objects[obj["metadata"]["name"]] = obj
                continue
            self.objects[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    def write_log(self, pod, *lines, at, every=0.5, container="trainer", newline=True):
        """Append ``lines`` to a container's log, stamped ``at``, ``at + every``, ... (epoch s)."""
        entries = self.logs.setdefault((pod, container), [])
        for i, line in enumerate(lines):
            entries.append((round((at + i * every) * 10**9), line + ("\n" if newline else "")))

    def _model(self, obj, klass):  # model objects, as the real core and batch clients return
        return self._api.deserialize(SimpleNamespace(data=json.dumps(obj)), klass)

    def _create(self, kind, namespace, body):
        self.calls.append(("create", kind, body["metadata"]["name"]))
        if kind in self.fail:
            raise ApiException(status=self.fail[kind])
        if (kind, namespace, body["metadata"]["name"]) in self.objects:
            raise api_error(409, "Conflict", f'{kind.lower()}s "{body["metadata"]["name"]}" already exists')
        self.add({**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def _get(self, kind, namespace, name):
        if (kind, namespace, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects[(kind, namespace, name)]

    def _list(self, kind, namespace, selector):
        return [
            o
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind and ns == namespace and _matches(o, selector)
        ]

    def _list_items(self, kind, namespace, selector):
        """A core/batch list's items: without their type (kind, apiVersion)."""
        return [
            {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
            for o in self._list(kind, namespace, selector)
        ]

    def _delete(self, kind, namespace, name, **kw):
        self.calls.append(("delete", kind, name, kw.get("propagation_policy")))
        self._get(kind, namespace, name)
        del self.objects[(kind, namespace, name)]
        for key, obj in list(self.objects.items()):  # the garbage collector takes the pods
            if key[0] == "Pod" and any(
                r["name"] == name and r["kind"] == kind for r in obj["metadata"].get("ownerReferences", [])
            ):
                del self.objects[key]

    def _plural(self, plural):
        if plural not in self.crds:
            raise ApiException(status=404, reason="Not Found")
        return {"pytorchjobs": "PyTorchJob", "podgroups": "PodGroup", "trainjobs": "TrainJob"}[plural]

    def create_namespaced_service(self, namespace, body, field_validation=None):
        self._create("Service", namespace, body)

    def delete_namespaced_service(self, name, namespace):
        self._delete("Service", namespace, name)

    def list_namespaced_pod(self, namespace, label_selector=""):
        return self._model(
            {
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {},
                "items": self._list_items("Pod", namespace, label_selector),
            },
            "V1PodList",
        )

    def read_node(self, name):
        self.calls.append(("read_node", name))
        if name not in self.nodes:
            raise ApiException(status=403 if name == "forbidden" else 404)
        return self._model(
            self.node_objects.get(name) or {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
            "V1Node",
        )

    def read_namespaced_pod_log(
        self,
        name,
        namespace,
        container=None,
        tail_lines=None,
        timestamps=False,
        since_seconds=None,
        limit_bytes=None,
        _preload_content=True,
    ):
        """As the kubelet answers: the last ``tail_lines`` lines, then those since
        ``since_seconds`` before now, each with its timestamp, then ``limit_bytes`` of that."""
        self.calls.append(("log", name, container, tail_lines))
        self.log_reads.append(
            {
                "pod": name,
                "tail_lines": tail_lines,
                "limit_bytes": limit_bytes,
                "since_seconds": since_seconds,
                "timestamps": timestamps,
            }
        )
        if ("log", name) in self.fail:
            raise api_error(self.fail[("log", name)], "Not Found", f'pods "{name}" not found')
        if (name, container) not in self.logs:
            raise api_error(
                400,
                "Bad Request",
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        entries = self.logs[(name, container)]
        if tail_lines is not None:
            entries = entries[len(entries) - tail_lines :] if tail_lines else []
        if since_seconds is not None:
            entries = [e for e in entries if e[0] >= round(self.now * 10**9) - since_seconds * 10**9]
        body = "".join(f"{rfc3339nano(ns)} {line}" if timestamps else line for ns, line in entries).encode()[
            :limit_bytes
        ]
        if not _preload_content:
            return RawResponse(body)
        return str(body)  # what kubernetes client 36 returns (kubernetes-client/python#2596)

    def create_namespaced_job(self, namespace, body, field_validation=None):
        self._create("Job", namespace, body)

    def read_namespaced_job(self, name, namespace):
        return self._model(self._get("Job", namespace, name), "V1Job")

    def list_namespaced_job(self, namespace, label_selector=""):
        return self._model(
            {
                "apiVersion": "batch/v1",
                "kind": "JobList",
                "metadata": {},
                "items": self._list_items("Job", namespace, label_selector),
            },
            "V1JobList",
        )

    def delete_namespaced_job(self, name, namespace, propagation_policy=None):
        self._delete("Job", namespace, name, propagation_policy=propagation_policy)

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, field_validation=None):
        self._create(self._plural(plural), namespace, body)

    def list_node(self, _request_timeout=None):
        """The recorded nodes (bare ones say nothing of their size: no pool check)."""
        return {"items": list(self.node_objects.values())}

    def get_cluster_custom_object(self, group, version, plural, name):
        """A CRD: the pinned newest release's (a PodGroup's without a schema)."""
        return crd_files.served(self._plural(name.split(".", 1)[0]) and name.split(".", 1)[0])

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        return self._get(self._plural(plural), namespace, name)

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=""):
        return {"items": self._list(self._plural(plural), namespace, label_selector)}

    def delete_namespaced_custom_object(
        self, group, version, namespace, plural, name, propagation_policy=None
    ):
        self._delete(self._plural(plural), namespace, name, propagation_policy=propagation_policy)
