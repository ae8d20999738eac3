"""A simulated Kubernetes control plane at the hook boundary: a small API server with a Job
controller, a scheduler, kubelets, a garbage collector and a simulated clock, for behaviour
tests of the backend and the operators. Recordings (tests/data/k8s) stay the truth for parsing
what a real cluster returns; this is for what happens over time.

``ControlPlane`` stands in for the ``KubernetesHook`` and its three clients, as ``FakeKubernetes``
does, and answers as the real client: model objects from core/batch (list items without
``kind``/``apiVersion``), dicts from custom objects, ``ApiException`` with the Status body.

Simulated:

- **Indexed Jobs** (what ``indexed_job.manifests`` renders): the controller creates one pod per
  completion index *from the Job's pod template* (labels, annotations, command, grace period,
  hostname under the Service's subdomain, ``JOB_COMPLETION_INDEX``), never for a suspended Job.
  A Failed pod is matched against the ``podFailurePolicy`` rules in order (``onPodConditions``,
  ``onExitCodes`` with ``In``/``NotIn``): ``FailJob`` fails the Job, ``Ignore`` replaces the pod,
  ``Count`` or no match counts against ``backoffLimit`` (0: fails the Job). A failing Job gets
  ``FailureTarget`` at once, its other pods are deleted (graceful), and ``Failed`` once none is
  left running (as since Kubernetes 1.31); all indexes succeeded: ``SuccessCriteriaMet`` and
  ``Complete``.
- **Pods**: Pending (unscheduled, ``PodScheduled=False Unschedulable`` when no Ready node is
  free), bound to a Ready node, Running ``start_s`` later (or ``ErrImagePull`` /
  ``ImagePullBackOff`` when ``image_error`` is set), then Succeeded/Failed when ``program`` (the
  trainer's part, called on every tick for each running pod) returns an exit code, or a test
  calls :meth:`exit`. :meth:`preempt` adds ``DisruptionTarget`` and deletes the pod.
- **Deletion**: pods get ``deletionTimestamp`` (now + grace) and stay listed as Terminating
  until the program exits on SIGTERM (``sigterm_exit_s``) or the grace period passes (then
  137), and forever while their node is NotReady. Jobs: ``Foreground`` keeps the Job (with
  ``deletionTimestamp`` and the ``foregroundDeletion`` finalizer) until its pods are gone;
  ``Background`` removes it at once and the garbage collector deletes its pods; no
  propagation policy orphans the pods (the API's default for batch/v1 Jobs).
- **409 AlreadyExists** on creating an existing name (never an overwrite); 404 on a missing one.
- **Faults** per call (:meth:`inject`): 5xx and 429 with ``Retry-After``, connection resets and
  read timeouts as urllib3 raises them, or a reply lost after the server acted; by count, by a
  seeded probability, or for a window of simulated time.
- **Nodes**: Ready/NotReady, labels (recorded nodes keep theirs), ``allocatable`` and taints
  (listed by ``list_node``, for the backend's pool check before a launch), removal (the pods on
  a gone node are left until the pod garbage collector fails them, ``DeletionByPodGC``, after
  ``podgc_s``).

- **PyTorchJobs**, simply: one pod per replica from its template, named and labelled as the
  Training Operator does; ``Succeeded`` when the Master succeeds, ``Failed`` when a replica
  fails; pods kept (``cleanPodPolicy: None``).

Not simulated: the TrainJob (JobSet) controller (TrainJobs are stored and deleted; a test adds
their pods with :meth:`pods_from_template`), affinity by labels and resources in scheduling
(any Ready node fits, one pod per node per job; only a node name ``matchFields`` is honoured), Kueue admission, watches, the PyTorchJob's Services.

Time is simulated: :meth:`clock` and :meth:`sleep` are the backend's, every API call takes
``call_s`` simulated seconds, and :meth:`tick` advances the clock and runs the controllers.
Timestamps are what an API server writes, from that clock: RFC 3339 UTC to the second
(``2026-01-01T10:00:02Z``), where the real components stamp them: ``creationTimestamp`` on
create; a pod's ``status.startTime`` when the kubelet takes it (before its image is pulled), its
container's ``running.startedAt`` when it runs and ``terminated.startedAt``/``finishedAt`` when
it exits (a pod on a vanished node gets none); ``deletionTimestamp`` as now + the grace period;
the Job's ``status.startTime`` and ``completionTime``; each condition's ``lastTransitionTime``.
:meth:`node_seconds` is what the cloud would bill: how long pods held their nodes.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from trainops.cluster.kubernetes.crd_schema import served_schema, unknown_fields

from . import crds as crd_files
from .fake_k8s import T0, RawResponse, api_error, rfc3339nano

REASONS = {
    429: ("Too Many Requests", "Too many requests, please try again later."),
    500: ("Internal Server Error", "Internal error occurred: etcdserver: leader changed"),
    502: ("Bad Gateway", "Bad Gateway"),
    503: ("Service Unavailable", "the server is currently unable to handle the request"),
    504: ("Gateway Timeout", "Timeout: request did not complete within the allotted timeout"),
}
PLURALS = {
    "Pod": "pods",
    "Job": "jobs",
    "Service": "services",
    "PodGroup": "podgroups",
    "PyTorchJob": "pytorchjobs",
    "TrainJob": "trainjobs",
}
KINDS = {plural: kind for kind, plural in PLURALS.items()}
# A bare node's allocatable: an 8-GPU machine (p4d.24xlarge's), room for any pod the tests launch.
BARE_ALLOCATABLE = {
    "cpu": "95690m",
    "memory": "1155916016Ki",
    "ephemeral-storage": "3Ti",
    "nvidia.com/gpu": "8",
    "pods": "110",
}
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABELS = ("job-name", "training.kubeflow.org/job-name")  # Job's, PyTorchJob's pods
TRACKING = "batch.kubernetes.io/job-tracking"  # the Job controller's finalizer on its pods


def iso(t):
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Fault:
    """One injected failure: which calls it hits and how often (see :meth:`ControlPlane.inject`)."""

    verb: str
    resource: str
    status: int | None = 503
    reset: bool = False
    timeout: bool = False
    retry_after: float | None = None
    lost_reply: bool = False
    times: int | None = None
    probability: float | None = None
    between: tuple[float, float] | None = None
    name: str | None = None
    seed: int = 0
    hits: int = 0
    _random: random.Random = field(default_factory=random.Random)

    def __post_init__(self):
        self._random.seed(self.seed)

    def applies(self, verb, resource, name, now):
        if self.verb not in ("*", verb) or self.resource not in ("*", resource):
            return False
        if self.name is not None and self.name != name:
            return False
        if self.times is not None and self.hits >= self.times:
            return False
        if self.between is not None and not self.between[0] <= now < self.between[1]:
            return False
        return self.probability is None or self._random.random() < self.probability

    def error(self, what):
        if self.reset:
            return ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
        if self.timeout:
            return ReadTimeoutError(None, what, "Read timed out. (read timeout=30)")
        reason, message = REASONS.get(self.status, ("Error", "error"))
        exc = api_error(self.status, reason, message)
        exc.headers = {"Content-Type": "application/json"}
        if self.retry_after is not None:
            exc.headers["Retry-After"] = str(self.retry_after)
        return exc


@dataclass(frozen=True)
class Call:
    """One API call as the server saw it."""

    t: float
    verb: str  # create, get, list, delete
    resource: str  # pods, pods/log, jobs, services, nodes, podgroups, ...
    name: str | None
    fault: str | None  # what was injected (None: none)
    acted: bool  # the server did what was asked (also when the reply was then lost)
    live: bool = False  # a delete: the object was a Job that had not finished


class ControlPlane:
    """The hook (``core_v1_client``, ``batch_v1_client``, ``custom_object_client``,
    ``get_namespace``) and the clients' methods the backend calls, over a simulated cluster.

    :param call_s: simulated seconds each API call takes (lets a polling loop move time on).
    :param start_s: seconds from binding a pod to its container running.
    """

    def __init__(self, *, now=T0, call_s=0.0, start_s=2.0, podgc_s=40.0):
        self.core_v1_client = self.batch_v1_client = self.custom_object_client = self
        self.now = float(now)
        self.call_s, self.start_s, self.podgc_s = call_s, start_s, podgc_s
        self.objects = {}  # (kind, namespace, name) -> API JSON
        self.nodes = {}  # name -> Node JSON
        self.gone_nodes = {}  # name -> when it went
        self.held = {}  # pod name -> [job name, node, bound at, released at (None: holds it)]
        self.logs = {}  # (pod, container) -> [(epoch ns, line)]
        self.calls: list[Call] = []
        self.faults: list[Fault] = []
        self.crds = {"pytorchjobs", "podgroups", "trainjobs"}  # the custom kinds installed
        self.crd_objects = {}  # plural -> the CRD it serves, when not the pinned newest one
        self.denied = set()  # (verb, resource) the caller's RBAC does not allow: 403
        self.namespaces = {"default", "ml"}
        self.image_error = None  # e.g. "ImagePullBackOff": containers never start
        self.program = None  # (plane, pod, seconds running) -> exit code or None
        self.sigterm_exit_s = None  # seconds a pod takes to exit on SIGTERM (None: the grace)
        self._api, self._lock = ApiClient(), threading.RLock()
        self._uid, self._rv, self._suffix = itertools.count(1), itertools.count(1000), itertools.count(1)

    # -- time ------------------------------------------------------------------------
    def clock(self):
        return self.now

    def sleep(self, seconds):
        """The backend's back-off: simulated time passes, and the cluster moves on."""
        self.tick(seconds)

    def tick(self, seconds=1.0):
        """Advance the clock by ``seconds`` (in steps of at most 1 s) and run the controllers."""
        with self._lock:
            left = float(seconds)
            while True:
                step = min(1.0, left)
                self.now += step
                left -= step
                self._reconcile()
                if left <= 1e-9:
                    return

    # -- test setup ------------------------------------------------------------------
    def get_namespace(self):  # the connection names no namespace
        return None

    def add_node(self, name, *, ready=True, labels=None, recorded=None, allocatable=None, taints=None):
        """A node: a recorded one (with its labels, allocatable and taints) or a bare one with
        ``labels``. ``allocatable`` (a bare node's default: ``BARE_ALLOCATABLE``, room for any
        pod the tests launch) and ``taints`` replace what the node has when given."""
        node = copy.deepcopy(recorded) if recorded else {"apiVersion": "v1", "kind": "Node", "metadata": {}}
        node["metadata"]["name"] = name
        node["metadata"].setdefault("labels", {}).update(labels or {})
        status = node.setdefault("status", {})
        if allocatable is not None or "allocatable" not in status:
            status["allocatable"] = dict(BARE_ALLOCATABLE if allocatable is None else allocatable)
        if taints is not None:
            node.setdefault("spec", {})["taints"] = copy.deepcopy(taints)
        self.nodes[name] = node
        self.set_ready(name, ready)
        return node

    def set_ready(self, name, ready):
        conditions = [
            c
            for c in self.nodes[name].setdefault("status", {}).get("conditions") or []
            if c["type"] != "Ready"
        ]
        conditions.append(
            {"type": "Ready", "status": "True" if ready else "Unknown", "lastTransitionTime": iso(self.now)}
        )
        self.nodes[name]["status"]["conditions"] = conditions

    def ready(self, name):
        node = self.nodes.get(name)
        return node is not None and any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]
        )

    def remove_node(self, name):
        """The cloud deleted the VM: its Node goes, and no pod holds it any more (the pods stay
        listed, without a ``finishedAt``, until the pod garbage collector takes them)."""
        del self.nodes[name]
        self.gone_nodes[name] = self.now
        for held in self.held.values():
            if held[1] == name and held[3] is None:
                held[3] = self.now

    def inject(self, verb="*", resource="*", **options):
        """Fail matching calls: ``verb`` (create, get, list, delete) on ``resource`` (pods,
        pods/log, jobs, services, nodes, podgroups, ...), ``*`` for any. Options (:class:`Fault`):
        ``status`` (503), ``reset``/``timeout`` (a connection error instead), ``retry_after``,
        ``lost_reply`` (the server acts, then the reply is lost), ``times``, ``probability`` with
        ``seed``, ``between=(t0, t1)`` in simulated epoch seconds, ``name``."""
        fault = Fault(verb, resource, **options)
        self.faults.append(fault)
        return fault

    def write_log(self, pod, *lines, container="trainer"):
        """Append ``lines`` to a container's log, stamped now (0.1 s apart)."""
        entries = self.logs.setdefault((pod, container), [])
        for i, line in enumerate(lines):
            entries.append((round((self.now + i * 0.1) * 10**9), line + "\n"))

    # -- views for assertions --------------------------------------------------------
    def pods(self, job=None):
        return [
            o
            for (k, _, _), o in sorted(self.objects.items())
            if k == "Pod"
            and (job is None or job in {o["metadata"]["labels"].get(label) for label in JOB_NAME_LABELS})
        ]

    def jobs(self):
        return sorted(name for kind, _, name in self.objects if kind == "Job")

    def job(self, name, namespace="ml"):
        return self.objects[("Job", namespace, name)]

    def pod(self, job, index):
        """The live pod of ``job``'s completion ``index`` (the newest)."""
        pods = [p for p in self.pods(job) if p["metadata"]["annotations"].get(COMPLETION_INDEX) == str(index)]
        return pods[-1]

    def deletions(self, *, live_jobs_only=False):
        return [c for c in self.calls if c.verb == "delete" and c.acted and (c.live or not live_jobs_only)]

    def faults_injected(self):
        return sum(1 for c in self.calls if c.fault)

    def node_seconds(self, job=None):
        """Seconds pods (of ``job``, or all) held a node, from the kubelet taking each pod to
        its container's exit, its removal, or its node's disappearance; a pod still holding
        one counts up to now. What the cloud bills, per node."""
        return sum(
            (self.now if end is None else end) - start
            for owner, _, start, end in self.held.values()
            if job is None or owner == job
        )

    # -- pods: the scheduler's and kubelets' part --------------------------------------
    def bind(self, pod, node):
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(self.now)}
        ]
        pod["status"]["hostIP"] = "10.128.0.41"
        # The kubelet takes the pod at once: startTime is then, before its image is pulled
        # (a pod stuck pulling has one too), and its node is held from then.
        pod["status"]["startTime"] = iso(self.now)
        pod["_bound"] = self.now
        self.held[pod["metadata"]["name"]] = [_job_of(pod), node, self.now, None]

    def start(self, pod):
        status = pod["status"]
        status["phase"] = "Running"
        status["conditions"] += [{"type": "Ready", "status": "True", "lastTransitionTime": iso(self.now)}]
        status["containerStatuses"] = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": f"{c['image']}@sha256:{'9b2f' * 16}",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": iso(self.now)}},
            }
            for c in pod["spec"]["containers"]
        ]
        pod["_started"] = self.now

    def exit(self, pod, code, reason=None):
        """The trainer container exits with ``code``: the pod is Succeeded or Failed."""
        if pod["status"]["phase"] in ("Succeeded", "Failed"):
            return
        for status in pod["status"].get("containerStatuses") or []:
            started = (status["state"].get("running") or {}).get("startedAt") or iso(self.now)
            status.update(ready=False, started=False)
            status["state"] = {
                "terminated": {
                    "exitCode": code,
                    "reason": reason or ("Completed" if code == 0 else "Error"),
                    "startedAt": started,
                    "finishedAt": iso(self.now),
                }
            }
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        self._release(pod)
        pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"] + [
            {
                "type": "Ready",
                "status": "False",
                "reason": "PodCompleted" if code == 0 else "PodFailed",
                "lastTransitionTime": iso(self.now),
            }
        ]

    def preempt(
        self,
        pod,
        reason="PreemptionByScheduler",
        message="default-scheduler: preempting to accommodate a higher priority pod",
    ):
        """What the scheduler (or the taint manager, the eviction API) does: ``DisruptionTarget``,
        then a graceful deletion of the pod."""
        with self._lock:
            pod["status"].setdefault("conditions", []).append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": iso(self.now),
                }
            )
            self._delete_pod(pod)

    def pods_from_template(self, owner, template, index, labels=None, annotations=None, namespace="ml"):
        """A pod of ``owner`` (a stored object) made from a rendered pod ``template``."""
        meta = template.get("metadata") or {}
        name = f"{owner['metadata']['name']}-{index}-{next(self._suffix):05d}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{next(self._uid)}",
                "creationTimestamp": iso(self.now),
                "labels": {**(meta.get("labels") or {}), **(labels or {})},
                "annotations": {**(meta.get("annotations") or {}), **(annotations or {})},
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"]),
            "status": {"phase": "Pending", "conditions": []},
        }
        self.objects[("Pod", namespace, name)] = pod
        return pod

    # -- the controllers -----------------------------------------------------------
    def _reconcile(self):
        """One round of every controller: kubelets, the Job controller, garbage collection."""
        for pod in self.pods():
            self._kubelet(pod)
        for (kind, _, _), obj in list(self.objects.items()):
            if kind == "Job":
                self._job_controller(obj)
            elif kind == "PyTorchJob":
                self._pytorchjob_controller(obj)
        self._garbage_collector()

    def _owned(self, owner):
        uid = owner["metadata"]["uid"]
        return [
            p for p in self.pods() if any(r["uid"] == uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    def _count_finished(self, job, pods):
        """Count each finished pod once (its tracking finalizer goes); a failed one through the
        pod failure policy and the backoff limit."""
        spec, status = job["spec"], job["status"]
        counted = status.setdefault("_counted", [])
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["status"]["phase"] not in ("Succeeded", "Failed") or uid in counted:
                continue
            counted.append(uid)
            _drop_finalizer(pod, TRACKING)  # counted: the pod may go now
            if pod["status"]["phase"] == "Succeeded":
                continue
            action, message = self._policy(job, pod)
            if action == "Ignore":
                continue
            status["failed"] = status.get("failed", 0) + 1
            if action == "FailJob":
                self._fail(job, "PodFailurePolicy", message)
            elif status["failed"] > spec.get("backoffLimit", 6):
                self._fail(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")

    def _end_failing(self, job, pods):
        """A job with FailureTarget: its running pods are deleted; Failed once none runs."""
        for pod in pods:
            if pod["status"]["phase"] not in ("Succeeded", "Failed"):
                self._delete_pod(pod)
        if all(p["status"]["phase"] in ("Succeeded", "Failed") for p in pods):
            target = _true(job, "FailureTarget")
            self._condition(job, "Failed", target["reason"], target["message"])

    def _job_controller(self, job):
        spec, status = job["spec"], job.setdefault("status", {})
        pods = self._owned(job)
        if spec.get("suspend") or _true(job, "Complete") or _true(job, "Failed"):
            return
        if job["metadata"].get("deletionTimestamp"):
            return
        status.setdefault("startTime", iso(self.now))
        self._count_finished(job, pods)
        if _true(job, "FailureTarget"):
            self._end_failing(job, pods)
            return
        done = sorted(
            {
                int(p["metadata"]["annotations"][COMPLETION_INDEX])
                for p in pods
                if p["status"]["phase"] == "Succeeded"
            }
        )
        status["succeeded"] = len(done)
        if done:
            status["completedIndexes"] = _ranges(done)
        if len(done) == spec["completions"]:
            self._condition(job, "SuccessCriteriaMet")
            self._condition(job, "Complete")
            status["completionTime"] = iso(self.now)
            return
        # podReplacementPolicy Failed (the default with a podFailurePolicy): a terminating pod
        # is replaced only once it has failed
        running = {
            int(p["metadata"]["annotations"][COMPLETION_INDEX])
            for p in pods
            if p["status"]["phase"] != "Failed"
        }
        for index in range(spec["completions"]):
            if index not in running and index not in done:
                self._job_pod(job, index)
        status["active"] = sum(1 for p in self._owned(job) if p["status"]["phase"] in ("Pending", "Running"))

    def _pytorchjob_controller(self, job):
        """The Training Operator, simply: a pod per replica (``<job>-master-0``,
        ``<job>-worker-<i>``) from its template; Succeeded when the Master succeeds, Failed
        when any replica fails (``backoffLimit: 0``, ``restartPolicy: Never``); finished pods
        are kept and running ones left running (``cleanPodPolicy: None``)."""
        meta, status = job["metadata"], job.setdefault("status", {})
        name, run_policy = meta["name"], job["spec"].get("runPolicy") or {}
        if (
            run_policy.get("suspend")
            or meta.get("deletionTimestamp")
            or _true(job, "Succeeded")
            or _true(job, "Failed")
        ):
            return
        if not status.get("conditions"):
            self._condition(job, "Created", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
            for rtype, replica in job["spec"]["pytorchReplicaSpecs"].items():
                for i in range(replica["replicas"]):
                    pod = self.pods_from_template(
                        job,
                        replica["template"],
                        i,
                        labels={
                            "training.kubeflow.org/job-name": name,
                            "training.kubeflow.org/operator-name": "pytorchjob-controller",
                            "training.kubeflow.org/replica-index": str(i),
                            "training.kubeflow.org/replica-type": rtype.lower(),
                        },
                        namespace=meta["namespace"],
                    )
                    self._rename(pod, f"{name}-{rtype.lower()}-{i}")
        pods = self._owned(job)
        failed = [p for p in pods if p["status"]["phase"] == "Failed"]
        if failed:
            rtype = failed[0]["metadata"]["labels"]["training.kubeflow.org/replica-type"].capitalize()
            message = f"PyTorchJob {meta['namespace']}/{name} is failed because {len(failed)} {rtype} replica(s) failed."
            self._condition(job, "Failed", "PyTorchJobFailed", message)
        elif any(
            p["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "master"
            and p["status"]["phase"] == "Succeeded"
            for p in pods
        ):
            self._condition(
                job,
                "Succeeded",
                "PyTorchJobSucceeded",
                f"PyTorchJob {meta['namespace']}/{name} successfully completed.",
            )

    def _rename(self, pod, name):
        meta = pod["metadata"]
        del self.objects[("Pod", meta["namespace"], meta["name"])]
        meta["name"] = name
        self.objects[("Pod", meta["namespace"], name)] = pod

    def _job_pod(self, job, index):
        template = job["spec"]["template"]
        name = job["metadata"]["name"]
        pod = self.pods_from_template(
            job,
            template,
            index,
            labels={
                "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                "batch.kubernetes.io/job-name": name,
                "controller-uid": job["metadata"]["uid"],
                "job-name": name,
                COMPLETION_INDEX: str(index),
            },
            annotations={COMPLETION_INDEX: str(index)},
            namespace=job["metadata"]["namespace"],
        )
        pod["metadata"]["finalizers"] = [TRACKING]
        spec = pod["spec"]
        if spec.get("subdomain"):
            spec["hostname"] = f"{name}-{index}"
        for container in spec["containers"]:
            container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        return pod

    def _policy(self, job, pod):
        """The podFailurePolicy action for a Failed pod, and the controller's message."""
        ref = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        for i, rule in enumerate((job["spec"].get("podFailurePolicy") or {}).get("rules") or []):
            for cond in rule.get("onPodConditions") or []:
                if any(
                    c["type"] == cond["type"] and c["status"] == cond.get("status", "True")
                    for c in pod["status"].get("conditions") or []
                ):
                    return rule[
                        "action"
                    ], f"Pod {ref} has condition {cond['type']} matching {rule['action']} rule at index {i}"
            codes = rule.get("onExitCodes")
            if codes:
                for status in pod["status"].get("containerStatuses") or []:
                    if codes.get("containerName") not in (None, status["name"]):
                        continue
                    code = (status["state"].get("terminated") or {}).get("exitCode")
                    if code is None or code == 0:
                        continue  # exit code 0 never matches (the API rejects 0 in In)
                    if (code in codes["values"]) == (codes["operator"] == "In"):
                        return rule["action"], (
                            f"Container {status['name']} for pod {ref} failed with exit code {code} "
                            f"matching {rule['action']} rule at index {i}"
                        )
        return "Count", None

    def _fail(self, job, reason, message):
        if not _true(job, "FailureTarget"):
            self._condition(job, "FailureTarget", reason, message)

    def _condition(self, obj, ctype, reason=None, message=None):
        cond = {
            "type": ctype,
            "status": "True",
            "lastProbeTime": iso(self.now),
            "lastTransitionTime": iso(self.now),
        }
        if reason:
            cond.update(reason=reason, message=message)
        obj.setdefault("status", {}).setdefault("conditions", []).append(cond)

    def _schedule(self, pod):
        owner = pod["metadata"]["ownerReferences"][0]["uid"]
        used = {
            p["spec"].get("nodeName")
            for p in self.pods()
            if p["metadata"]["ownerReferences"][0]["uid"] == owner
        }
        free = [n for n in sorted(self.nodes) if self.ready(n) and n not in used and _fields_fit(pod, n)]
        if free:
            self.bind(pod, free[0])
        elif not pod["status"]["conditions"]:
            pod["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": f"0/{len(self.nodes)} nodes are available: no Ready node is free.",
                    "lastTransitionTime": iso(self.now),
                }
            ]

    def _kubelet(self, pod):
        status, node = pod["status"], pod["spec"].get("nodeName")
        if node is None:
            if not pod["metadata"].get("deletionTimestamp"):
                self._schedule(pod)
            else:  # never ran: nothing to stop
                status["phase"] = "Failed"
                self._remove_pod(pod)
            return
        if node in self.gone_nodes:  # the pod garbage collector fails pods of a gone node
            if self.now - self.gone_nodes[node] >= self.podgc_s:
                if status["phase"] not in ("Succeeded", "Failed"):
                    status["conditions"].append(
                        {
                            "type": "DisruptionTarget",
                            "status": "True",
                            "reason": "DeletionByPodGC",
                            "message": "PodGC: node no longer exists",
                            "lastTransitionTime": iso(self.now),
                        }
                    )
                    status["phase"] = "Failed"
                self._remove_pod(pod)
            return
        if not self.ready(node):
            return  # a NotReady node's kubelet does nothing, and confirms no deletion
        deleting = pod["metadata"].get("deletionTimestamp")
        if status["phase"] == "Pending" and not deleting:
            if self.image_error:
                status["containerStatuses"] = [
                    {
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "waiting": {
                                "reason": self.image_error,
                                "message": f'Back-off pulling image "{c["image"]}"',
                            }
                        },
                    }
                    for c in pod["spec"]["containers"]
                ]
            elif self.now - pod["_bound"] >= self.start_s:
                self.start(pod)
        if status["phase"] == "Running" and not deleting and self.program is not None:
            code = self.program(self, pod, self.now - pod["_started"])
            if code is not None:
                self.exit(pod, code)
        if deleting:
            self._stop_deleted(pod, deleting)

    def _stop_deleted(self, pod, deleting):
        """A pod being deleted on a ready node: a pending one fails, a running one exits on
        SIGTERM (143) or past its grace period (137), and a stopped one goes."""
        status, asked = pod["status"], pod["_deleted_at"]
        if status["phase"] == "Pending":
            status["phase"] = "Failed"  # its containers never started
            self._release(pod)
        if status["phase"] == "Running" and (
            (self.sigterm_exit_s is not None and self.now - asked >= self.sigterm_exit_s)
            or self.now >= _epoch(deleting)
        ):
            self.exit(pod, 143 if self.now < _epoch(deleting) else 137)
        if status["phase"] != "Running":
            self._remove_pod(pod)

    def _garbage_collector(self):
        live = {o["metadata"]["uid"] for (k, _, _), o in self.objects.items() if k != "Pod"}
        for (kind, _, _), obj in list(self.objects.items()):
            meta = obj["metadata"]
            if kind == "Pod":
                owners = [
                    o
                    for o in self.objects.values()
                    if o["metadata"].get("uid") in {r["uid"] for r in meta.get("ownerReferences") or []}
                ]
                if not owners or any(
                    o["metadata"].get("deletionTimestamp") or _true(o, "Complete") or _true(o, "Failed")
                    for o in owners
                ):
                    _drop_finalizer(obj, TRACKING)  # the Job controller no longer tracks it
                refs = [r for r in meta.get("ownerReferences") or [] if not r.get("_orphaned")]
                if refs and not any(r["uid"] in live for r in refs) and not meta.get("deletionTimestamp"):
                    self._delete_pod(obj)
            elif meta.get("deletionTimestamp") and "foregroundDeletion" in meta.get("finalizers", []):
                dependents = self._owned(obj)
                for pod in dependents:
                    self._delete_pod(pod)
                if not dependents:
                    self._remove(obj)

    def _delete_pod(self, pod, grace=None):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
        meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = iso(self.now + grace), grace
        pod["_deleted_at"] = self.now

    def _remove_pod(self, pod):
        """The pod leaves the API once no finalizer holds it (the Job controller's, until it
        has counted the pod)."""
        if not pod["metadata"].get("finalizers"):
            self._remove(pod)

    def _release(self, pod):
        held = self.held.get(pod["metadata"]["name"])
        if held is not None and held[3] is None:
            held[3] = self.now

    def _remove(self, obj):
        meta = obj["metadata"]
        if obj["kind"] == "Pod":
            self._release(obj)
        self.objects.pop((obj["kind"], meta["namespace"], meta["name"]), None)

    # -- the API server ----------------------------------------------------------------
    def _serve(self, verb, resource, name, action):
        """Run one call: log it, fail it as injected (before it acts, or after for a lost
        reply), and let the cluster move on by ``call_s``."""
        with self._lock:
            if self.call_s:
                self.tick(self.call_s)
            fault = next((f for f in self.faults if f.applies(verb, resource, name, self.now)), None)
            what = f"{verb} {resource}/{name or ''}"
            if (verb, resource) in self.denied:
                self.calls.append(Call(self.now, verb, resource, name, "403", False))
                raise api_error(
                    403, "Forbidden", f'{resource} "{name or ""}" is forbidden: User cannot {verb} {resource}'
                )
            label = None
            if fault is not None:
                fault.hits += 1
                label = "reset" if fault.reset else "timeout" if fault.timeout else str(fault.status)
                if fault.lost_reply:
                    label += " after acting"
            live = verb == "delete" and resource == "jobs" and self._live_job(name)
            if fault is not None and not fault.lost_reply:
                self.calls.append(Call(self.now, verb, resource, name, label, False, live))
                raise fault.error(what)
            try:
                result = action()
            except ApiException:
                self.calls.append(Call(self.now, verb, resource, name, label, False, live))
                raise
            self.calls.append(Call(self.now, verb, resource, name, label, True, live))
            if verb in ("create", "delete"):
                self._reconcile()
            if fault is not None:
                raise fault.error(what)
            return result

    def _live_job(self, name):
        job = next((o for (k, _, n), o in self.objects.items() if k == "Job" and n == name), None)
        return job is not None and not (_true(job, "Complete") or _true(job, "Failed"))

    def _model(self, obj, klass):
        return self._api.deserialize(SimpleNamespace(data=json.dumps(_public(obj))), klass)

    def _get(self, kind, namespace, name):
        obj = self.objects.get((kind, namespace, name))
        if obj is None:
            raise api_error(404, "Not Found", f'{PLURALS[kind]} "{name}" not found')
        return obj

    def _create(self, kind, namespace, body, field_validation=None):
        name = body["metadata"]["name"]

        def act():
            if field_validation == "Strict" and PLURALS[kind] in self.crds:
                schema = served_schema(self.crd(PLURALS[kind]) or {}, body["apiVersion"].split("/")[-1])
                unknown = unknown_fields(body, schema) if schema else []
                if unknown:  # as the API server words it
                    raise api_error(
                        400,
                        "Bad Request",
                        f"{kind} in version {body['apiVersion'].split('/')[-1]!r} cannot be handled as a "
                        f"{kind}: strict decoding error: "
                        + ", ".join(f'unknown field "{u[1:]}"' for u in unknown),
                    )
            if (kind, namespace, name) in self.objects:
                exc = api_error(409, "Conflict", f'{PLURALS[kind]} "{name}" already exists')
                exc.body = exc.body.replace('"Failure"', '"Failure", "reason": "AlreadyExists"')
                raise exc
            obj = copy.deepcopy(body)
            obj["metadata"].update(
                namespace=namespace,
                uid=f"uid-{next(self._uid)}",
                resourceVersion=str(next(self._rv)),
                creationTimestamp=iso(self.now),
            )
            self.objects[(kind, namespace, name)] = obj

        self._serve("create", PLURALS[kind], name, act)

    def _list(self, kind, namespace, selector):
        pairs = [p.split("=", 1) for p in selector.split(",") if p]
        return [
            _public(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind
            and ns == namespace
            and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in pairs)
        ]

    def _delete(self, kind, namespace, name, propagation_policy=None):
        def act():
            obj = self._get(kind, namespace, name)
            meta = obj["metadata"]
            if kind == "Pod":
                self._delete_pod(obj)
            elif propagation_policy == "Foreground":
                meta.setdefault("deletionTimestamp", iso(self.now))
                meta.setdefault("finalizers", [])
                if "foregroundDeletion" not in meta["finalizers"]:
                    meta["finalizers"].append("foregroundDeletion")
            else:
                if propagation_policy in (None, "Orphan"):  # the pods stay, ownerless
                    for pod in self._owned(obj):
                        for ref in pod["metadata"]["ownerReferences"]:
                            ref["_orphaned"] = True
                self._remove(obj)

        self._serve("delete", PLURALS[kind], name, act)

    def _plural(self, plural):
        if plural not in self.crds:
            raise api_error(404, "Not Found", "the server could not find the requested resource")
        return KINDS[plural]

    # core/v1
    def create_namespaced_service(self, namespace, body, field_validation=None):
        self._create("Service", namespace, body, field_validation)

    def delete_namespaced_service(self, name, namespace):
        self._delete("Service", namespace, name, propagation_policy="Background")

    def list_namespaced_pod(self, namespace, label_selector=""):
        def act():
            items = [
                {k: v for k, v in p.items() if k not in ("kind", "apiVersion")}
                for p in self._list("Pod", namespace, label_selector)
            ]
            return self._model(
                {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}, "V1PodList"
            )

        return self._serve("list", "pods", None, act)

    def read_node(self, name):
        def act():
            if name not in self.nodes:
                raise api_error(404, "Not Found", f'nodes "{name}" not found')
            return self._model(self.nodes[name], "V1Node")

        return self._serve("get", "nodes", name, act)

    def list_node(self, _request_timeout=None):
        """Every node :meth:`add_node` made (and not removed), as a ``V1NodeList``."""

        def act():
            items = [
                {k: v for k, v in n.items() if k not in ("kind", "apiVersion")}
                for _, n in sorted(self.nodes.items())
            ]
            return self._model(
                {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": _public(items)},
                "V1NodeList",
            )

        return self._serve("list", "nodes", None, act)

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
        def act():
            pod = self._get("Pod", namespace, name)
            if pod["status"]["phase"] == "Pending":
                raise api_error(
                    400,
                    "Bad Request",
                    f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
                )
            entries = self.logs.get((name, container), [])
            if tail_lines is not None:
                entries = entries[len(entries) - tail_lines :] if tail_lines else []
            if since_seconds is not None:
                entries = [e for e in entries if e[0] >= round(self.now * 10**9) - since_seconds * 10**9]
            body = "".join(
                f"{rfc3339nano(ns)} {line}" if timestamps else line for ns, line in entries
            ).encode()
            body = body[:limit_bytes]
            return RawResponse(body) if not _preload_content else str(body)

        return self._serve("get", "pods/log", name, act)

    # batch/v1
    def create_namespaced_job(self, namespace, body, field_validation=None):
        self._create("Job", namespace, body, field_validation)

    def read_namespaced_job(self, name, namespace):
        return self._serve(
            "get", "jobs", name, lambda: self._model(self._get("Job", namespace, name), "V1Job")
        )

    def list_namespaced_job(self, namespace, label_selector=""):
        def act():
            items = [
                {k: v for k, v in j.items() if k not in ("kind", "apiVersion")}
                for j in self._list("Job", namespace, label_selector)
            ]
            return self._model(
                {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": items}, "V1JobList"
            )

        return self._serve("list", "jobs", None, act)

    def delete_namespaced_job(self, name, namespace, propagation_policy=None):
        self._delete("Job", namespace, name, propagation_policy=propagation_policy)

    # custom objects
    def create_namespaced_custom_object(self, group, version, namespace, plural, body, field_validation=None):
        self._create(self._plural(plural), namespace, body, field_validation)

    # cluster-scoped: CRDs (read through the custom objects API, as the backend does)
    def crd(self, plural):
        """The CRD installed for ``plural`` (None: not installed)."""
        if plural not in self.crds:
            return None
        return self.crd_objects.get(plural) or crd_files.served(plural)

    def get_cluster_custom_object(self, group, version, plural, name, _request_timeout=None):
        if (group, plural) != ("apiextensions.k8s.io", "customresourcedefinitions"):
            raise api_error(404, "Not Found", "the server could not find the requested resource")

        def act():
            kind_plural, _, kind_group = name.partition(".")
            found = self.crd(kind_plural)
            if found is None or found["spec"].get("group") != kind_group:
                raise api_error(
                    404, "Not Found", f'customresourcedefinitions.apiextensions.k8s.io "{name}" not found'
                )
            return copy.deepcopy(found)

        return self._serve("get", plural, name, act)

    def create_cluster_custom_object(self, group, version, plural, body, _request_timeout=None):
        """A SelfSubjectAccessReview: allowed unless the (verb, resource) is :attr:`denied`."""
        if (group, plural) != ("authorization.k8s.io", "selfsubjectaccessreviews"):
            raise api_error(404, "Not Found", "the server could not find the requested resource")

        def act():
            attrs = body["spec"]["resourceAttributes"]
            resource = attrs["resource"] + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
            allowed = (attrs["verb"], resource) not in self.denied
            return {
                **body,
                "status": {"allowed": allowed, **({} if allowed else {"reason": "RBAC: no rule"})},
            }

        return self._serve("create", plural, None, act)

    def read_namespace(self, name, _request_timeout=None):
        def act():
            if name not in self.namespaces:
                raise api_error(404, "Not Found", f'namespaces "{name}" not found')
            return self._model(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, "V1Namespace"
            )

        return self._serve("get", "namespaces", name, act)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        kind = self._plural(plural)
        return self._serve("get", plural, name, lambda: _public(self._get(kind, namespace, name)))

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=""):
        kind = self._plural(plural)
        return self._serve(
            "list", plural, None, lambda: {"items": self._list(kind, namespace, label_selector)}
        )

    def delete_namespaced_custom_object(
        self, group, version, namespace, plural, name, propagation_policy=None
    ):
        self._delete(self._plural(plural), namespace, name, propagation_policy=propagation_policy)


def _fields_fit(pod, node_name):
    """Whether ``node_name`` meets the pod's required node affinity's ``matchFields`` in some
    term (``metadata.name In/NotIn``; labels are not checked: any Ready node fits them)."""
    required = (
        ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if not required:
        return True
    for term in required:
        ok = True
        for match in term.get("matchFields") or []:
            if match["key"] == "metadata.name":
                inside = node_name in match.get("values", [])
                ok = ok and (inside if match["operator"] == "In" else not inside)
        if ok:
            return True
    return False


def _true(obj, ctype):
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype and cond["status"] == "True":
            return cond
    return None


def _job_of(pod):
    labels = pod["metadata"].get("labels") or {}
    return next((labels[k] for k in JOB_NAME_LABELS if k in labels), None)


def _drop_finalizer(obj, name):
    finalizers = obj["metadata"].get("finalizers") or []
    if name in finalizers:
        finalizers.remove(name)


def _ranges(indexes):
    """``completedIndexes`` as the controller writes it: ``0-2,4``."""
    out, start = [], None
    for i, n in enumerate(indexes):
        if start is None:
            start = n
        if i + 1 == len(indexes) or indexes[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ",".join(out)


def _public(obj):
    """An object as the API returns it: without the simulation's bookkeeping (``_`` keys)."""
    if isinstance(obj, dict):
        return {k: _public(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, list):
        return [_public(v) for v in obj]
    return obj
