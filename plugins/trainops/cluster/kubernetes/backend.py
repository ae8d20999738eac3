"""The Kubernetes backend: submit, watch and delete job gangs through the cncf-kubernetes
provider's ``KubernetesHook`` (an Airflow connection says which cluster).

It implements :class:`~trainops.cluster.base.ClusterBackend`. What the objects are is decided
by the pure :func:`~trainops.cluster.kubernetes.render.render_manifests`, what an attempt's
state means by the pure :func:`~trainops.cluster.kubernetes.state.job_state`; this module only
reads and writes API objects. The client has no types: what it returns is the API's JSON form
(``Json``) until ``job_state`` turns it into a :class:`~trainops.cluster.base.JobState`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from trainops.cluster.base import Chaos, JobAlreadyExists, JobHandle, JobState, LogCursor, ObjectRef
from trainops.cluster.kubernetes import crd_schema, indexed_job, logs, pools, pytorchjob, trainjob
from trainops.cluster.kubernetes.api_retry import DEFAULT_API_RETRY_S, ApiRetry, ApiUnavailable, status_of
from trainops.cluster.kubernetes.names import label_value
from trainops.cluster.kubernetes.nodes import NodeType, node_type
from trainops.cluster.kubernetes.objects import Json
from trainops.cluster.kubernetes.render import (
    JOB_KINDS,
    JOB_OBJECTS,
    job_ref,
    object_refs,
    pod_selector,
    render_manifests,
)
from trainops.cluster.kubernetes.state import job_outcome, job_state, node_index, trainer_container
from trainops.cluster.spec import JobSpec, JobSpecError
from trainops.cluster.torchrun_log import MAX_BLOCK_LINES, fold

log = logging.getLogger(__name__)
# API kind -> (group, version, plural) of the objects created through the custom objects API
CUSTOM_KINDS = {
    pytorchjob.KIND: (pytorchjob.GROUP, pytorchjob.VERSION, pytorchjob.PLURAL),
    trainjob.KIND: (trainjob.GROUP, trainjob.VERSION, trainjob.PLURAL),
    indexed_job.POD_GROUP_KIND: (
        indexed_job.POD_GROUP_GROUP,
        indexed_job.POD_GROUP_VERSION,
        indexed_job.POD_GROUP_PLURAL,
    ),
}
FINISHED_POD_PHASES = ("Succeeded", "Failed")
FIELD_VALIDATION = "Strict"  # the API server refuses unknown and duplicate fields
CRD_API = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
# What installs each custom kind, for the message when its CRD is missing.
CRD_OWNERS = {
    pytorchjob.KIND: "the Kubeflow Training Operator v1",
    trainjob.KIND: "Kubeflow Trainer v2",
    indexed_job.POD_GROUP_KIND: "Volcano",
}


def label_selector(labels: Mapping[str, str]) -> str:
    """``k=v,...`` with values fitted as they were on the objects (``names.label_value``)."""
    return ",".join(f"{k}={label_value(v)}" for k, v in sorted(labels.items()))


def _api_message(exc: Exception) -> str:
    """The API server's own message in an ApiException's body (a Status), else the error."""
    body = getattr(exc, "body", None)
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return str(message or exc)


def _ref(manifest: Json) -> ObjectRef:
    return {
        "apiVersion": manifest["apiVersion"],
        "kind": manifest["kind"],
        "name": manifest["metadata"]["name"],
    }


class KubernetesCluster:
    """Launch, watch and delete jobs on a Kubernetes cluster.

    :param kubernetes_conn_id: the Airflow connection of the cluster (``KubernetesHook``).
    :param namespace: where to look for jobs (``find``); default: the connection's
        namespace, else ``default``. Jobs are created in their JobSpec's namespace.
    :param unschedulable_deadline_s: seconds pods may stay unschedulable before the attempt
        counts as an infrastructure failure (not while Kueue holds it suspended).
    :param api_retry_s: how long one API call rides out 5xx, 429 and connection errors,
        retried with back-off (:mod:`.api_retry`), before it raises
        :class:`~trainops.cluster.kubernetes.api_retry.ApiUnavailable`; ``0``: no retries.
    :param hook: a ready hook (tests); default: ``KubernetesHook(conn_id=kubernetes_conn_id)``,
        created on first use.
    :param clock: the current time in epoch seconds (tests); default ``time.time``.
    :param sleep: waits out a retry's back-off (tests: a simulated clock's); default ``time.sleep``.
    """

    name = "kubernetes"
    log_limit_bytes = 1 << 20  # the most one ``log_lines`` call reads from the API

    def __init__(
        self,
        kubernetes_conn_id: str | None = "kubernetes_default",
        namespace: str | None = None,
        unschedulable_deadline_s: float = 900,
        api_retry_s: float = DEFAULT_API_RETRY_S,
        hook: Any = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self.unschedulable_deadline_s = unschedulable_deadline_s
        self._hook = hook
        self._clock = clock
        # the retry budget is measured on the monotonic clock, unless a test brings its own
        self.api = ApiRetry(api_retry_s, clock=time.monotonic if clock is time.time else clock, sleep=sleep)
        self._read_nodes = True  # off after a 403: the node check needs a ClusterRole
        self._list_nodes = True  # off after a 403: the node pool check needs a ClusterRole
        # node name -> its labels (None: gone before it was read)
        self._node_labels: dict[str, dict[str, str] | None] = {}
        self._serializer: Any = None
        # API kind -> the schema of the CRD version the cluster serves (None: not readable)
        self._served: dict[str, Json | None] = {}

    # -- plumbing --------------------------------------------------------------------
    @property
    def hook(self) -> Any:
        """The ``KubernetesHook`` (untyped, as its clients are)."""
        if self._hook is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

            self._hook = KubernetesHook(conn_id=self.kubernetes_conn_id)
        return self._hook

    @property
    def namespace(self) -> str:
        return self._namespace or self.hook.get_namespace() or "default"

    def _plain(self, obj: Any) -> Any:
        """The API's JSON form (camelCase dicts) of what the client returned."""
        if obj is None or isinstance(obj, dict):
            return obj
        if self._serializer is None:
            from kubernetes.client import ApiClient

            self._serializer = ApiClient()
        return self._serializer.sanitize_for_serialization(obj)

    def _call(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, its blips (5xx, 429, connection errors) retried."""
        return self.api.call(what, call, *args, **kwargs)

    def _ignore_missing(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call`` result (blips retried), or None when the object is not there (404). A
        delete whose reply was lost and whose retry finds the object gone lands here too."""
        try:
            return self._call(what, call, *args, **kwargs)
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise

    # -- interface -------------------------------------------------------------------
    def launch(self, spec: JobSpec, *, chaos: Chaos | None = None) -> JobHandle:
        """Create the rendered objects (Service, PodGroup, then the job) and return the handle.
        If one cannot be created, the ones already created are deleted again."""
        if chaos:
            raise ValueError(f"injected preemptions ({chaos!r}) work only on cluster='local'")

        if self._namespace and self._namespace != spec.namespace:
            raise ValueError(
                f"JobSpec namespace {spec.namespace!r} differs from the backend's "
                f"namespace {self._namespace!r}: set the same namespace on both"
            )
        self._refuse_unschedulable(spec)
        manifests = self._render(spec)
        job = manifests[-1]
        handle: JobHandle = {
            "cluster": self.name,
            "job_id": job["metadata"]["name"],
            "kind": JOB_KINDS[job["kind"]],
            "namespace": spec.namespace,
            "labels": dict(spec.labels),
            "manifests": [_ref(m) for m in manifests],
        }
        created: list[Json] = []
        try:
            for manifest in manifests:
                try:
                    self._create(manifest, spec.namespace, handle if manifest is job else None)
                except ApiUnavailable:
                    created.append(manifest)  # its reply may have been lost after it was created
                    raise
                created.append(manifest)
        except JobAlreadyExists:
            raise  # the Service and PodGroup are the existing job's too: delete nothing
        except Exception:
            try:
                self._delete_objects([_ref(m) for m in created], spec.namespace)
            except Exception:  # the creation error is the one to report
                log.exception("could not delete %s after a failed launch", [_ref(m) for m in created])
            raise
        return handle

    def served_schema(self, kind: str) -> Json | None:
        """The schema the cluster serves for the custom kind ``kind`` (``TrainJob``), read from
        its CRD once per backend. None when it cannot be read (no RBAC to read CRDs: the
        manifests are then rendered for the newest release and checked by the API server's
        strict field validation). Raises JobSpecError when the CRD is not installed, or does
        not serve the version trainops creates."""
        if kind in self._served:
            return self._served[kind]
        group, version, plural = CUSTOM_KINDS[kind]
        name = f"{plural}.{group}"
        try:
            crd = self._plain(
                self._call(
                    f"get CRD {name}",
                    self.hook.custom_object_client.get_cluster_custom_object,
                    *CRD_API,
                    name,
                )
            )
        except Exception as exc:
            if status_of(exc) == 404:
                raise JobSpecError(
                    f"the cluster has no {kind} CRD ({name}): install {CRD_OWNERS[kind]}, or use "
                    "kind 'indexed-job' (plain Kubernetes Jobs); 'python -m trainops doctor' lists "
                    "what the cluster has"
                ) from exc
            if status_of(exc) != 403:
                raise
            log.info(
                "cannot read the %s CRD (%s: 403; the optional 'get customresourcedefinitions' rule "
                "grants it): rendering for the newest release, and the API server checks the fields",
                kind,
                name,
            )
            crd = None
        schema = None
        if isinstance(crd, dict):
            if version not in crd_schema.served_versions(crd):
                raise JobSpecError(
                    f"the cluster's {kind} CRD ({name}) serves {crd_schema.served_versions(crd)}, "
                    f"not {version}, the version trainops creates: install a release of "
                    f"{CRD_OWNERS[kind]} that serves {group}/{version}"
                )
            schema = crd_schema.served_schema(crd, version)
        self._served[kind] = schema
        return schema

    def _render(self, spec: JobSpec) -> list[Json]:
        """The manifests for ``spec``, rendered for the API the cluster serves: a TrainJob for
        the Trainer release whose CRD is installed. Raises JobSpecError naming every field a
        custom object has that its CRD does not define (the API server would drop it silently)."""
        api = trainjob.CURRENT
        if spec.kind == "trainjob":
            served = self.served_schema(trainjob.KIND)
            if served is not None:
                api = trainjob.api_of(served)
        manifests = render_manifests(spec, api)
        for manifest in manifests:
            if manifest["kind"] not in CUSTOM_KINDS:
                continue
            served = self.served_schema(manifest["kind"])
            unknown = crd_schema.unknown_fields(manifest, served) if served else []
            if unknown:
                raise JobSpecError(
                    f"{manifest['kind']} {manifest['metadata']['name']!r} has fields the cluster's "
                    f"CRD does not define, which its API server would drop silently: "
                    f"{', '.join(unknown)}; upgrade {CRD_OWNERS[manifest['kind']]} on the cluster, "
                    "or leave out the JobSpec settings that need them"
                )
        return manifests

    def _refuse_unschedulable(self, spec: JobSpec) -> None:
        """Raise JobSpecError (no retry) when no node pool can hold one pod of ``spec``
        (:func:`.pools.refusal`), before anything is created. The nodes are listed once per
        launch; when they cannot be read (no RBAC to ``list nodes``: said once; an outage; any
        other error) the check is skipped and the launch goes on."""
        if not self._list_nodes:
            return
        try:
            listed = self._plain(self._call("list Nodes", self.hook.core_v1_client.list_node))
        except Exception as exc:
            if status_of(exc) == 403:
                self._list_nodes = False  # no ClusterRole to list nodes: do not ask again
                log.info(
                    "not checking that a node pool can hold the job's pods: that needs RBAC to list "
                    "nodes (the optional rules of the trainops ClusterRole, docker/deploy/base/rbac.yaml)"
                )
            else:  # the check only saves time: an outage or an odd answer must not fail the launch
                log.warning(
                    "not checking that a node pool can hold the job's pods: listing nodes failed: %s", exc
                )
            return
        why = pools.refusal(spec, pools.pools(listed.get("items") or []))
        if why is not None:
            raise JobSpecError(why)

    def _create(self, manifest: Json, namespace: str, job_handle: JobHandle | None) -> None:
        """Create one object; 409 AlreadyExists is fine for a Service or PodGroup (derived from
        the JobSpec alone, an existing one fits) and :class:`JobAlreadyExists` for the job
        (``job_handle``): an earlier launch of this attempt, or this one whose reply was lost."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        tries = 0

        def create() -> None:
            nonlocal tries
            tries += 1
            # Strict: an unknown field is an error (400), not a warning and a pruned field
            if kind == "Service":
                self.hook.core_v1_client.create_namespaced_service(
                    namespace, manifest, field_validation=FIELD_VALIDATION
                )
            elif kind == indexed_job.KIND:
                self.hook.batch_v1_client.create_namespaced_job(
                    namespace, manifest, field_validation=FIELD_VALIDATION
                )
            else:
                group, version, plural = CUSTOM_KINDS[kind]
                self.hook.custom_object_client.create_namespaced_custom_object(
                    group, version, namespace, plural, manifest, field_validation=FIELD_VALIDATION
                )

        try:
            self._call(f"create {kind} {namespace}/{name}", create)
        except Exception as exc:
            if status_of(exc) in (400, 422):
                raise JobSpecError(
                    f"the API server refused {kind} {namespace}/{name}: {_api_message(exc)}"
                ) from exc
            if status_of(exc) != 409:
                raise
            if job_handle is None:
                return
            how = (
                "this launch created it, and the reply was lost"
                if tries > 1
                else "an earlier launch of this attempt created it"
            )
            raise JobAlreadyExists(
                f"{kind} {name!r} already exists in namespace {namespace!r} ({how}): reattach to "
                f"it, or delete it (kubectl -n {namespace} delete {kind.lower()} {name}) to launch anew",
                job_handle,
            ) from exc

    def _read_job(self, handle: JobHandle) -> Json | None:
        ns, name, (_, api_kind) = handle["namespace"], handle["job_id"], JOB_OBJECTS[handle["kind"]]
        if api_kind in CUSTOM_KINDS:
            group, version, plural = CUSTOM_KINDS[api_kind]
            return self._plain(
                self._ignore_missing(
                    f"get {api_kind} {ns}/{name}",
                    self.hook.custom_object_client.get_namespaced_custom_object,
                    group,
                    version,
                    ns,
                    plural,
                    name,
                )
            )
        return self._plain(
            self._ignore_missing(
                f"get Job {ns}/{name}", self.hook.batch_v1_client.read_namespaced_job, name, ns
            )
        )

    def _pods(self, handle: JobHandle) -> list[Json]:
        ns, selector = handle["namespace"], label_selector(pod_selector(handle["kind"], handle["job_id"]))
        pods = self._call(
            f"list pods {ns}/{selector}",
            self.hook.core_v1_client.list_namespaced_pod,
            ns,
            label_selector=selector,
        )
        items: list[Json] = self._plain(pods).get("items") or []
        return items

    def _read_node(self, name: str) -> Json | None:
        """The node ``name``, or None when it is gone; remembers its labels."""
        node: Json | None = self._plain(
            self._ignore_missing(f"get Node {name}", self.hook.core_v1_client.read_node, name)
        )
        if node is not None:
            self._node_labels[name] = dict((node.get("metadata") or {}).get("labels") or {})
        return node

    def _read_nodes_or_none(self, names: list[str]) -> list[Json | None] | None:
        """The nodes ``names`` (None for a gone one), or None if we may not read nodes."""
        if not self._read_nodes:
            return None
        try:
            return [self._read_node(name) for name in names]
        except Exception as exc:
            if status_of(exc) != 403:
                raise
            self._read_nodes = False  # no ClusterRole for nodes: rely on pod conditions
            return None

    def _nodes_present(self, pods: list[Json]) -> set[str] | None:
        """Which of the running pods' nodes still exist (read at every call: a node can
        vanish any time); None if we may not read nodes."""
        names = sorted(
            {
                p["spec"]["nodeName"]
                for p in pods
                if (p.get("spec") or {}).get("nodeName")
                and (p.get("status") or {}).get("phase") not in FINISHED_POD_PHASES
            }
        )
        nodes = self._read_nodes_or_none(names)
        if nodes is None:
            return None
        return {name for name, node in zip(names, nodes, strict=False) if node is not None}

    def _node_types(self, pods: list[Json]) -> dict[str, NodeType]:
        """``nodes.node_type`` of each of the pods' nodes. Labels do not change, so a node is
        read once (``_nodes_present`` reads the running pods' nodes anyway)."""
        names: set[str] = {name for p in pods if (name := (p.get("spec") or {}).get("nodeName")) is not None}
        unread = sorted(names - set(self._node_labels))
        for name, node in zip(unread, self._read_nodes_or_none(unread) or [], strict=False):
            if node is None:
                self._node_labels[name] = None  # gone before we read it: do not ask again
        return {name: node_type(self._node_labels.get(name)) for name in names}

    def status(self, handle: JobHandle) -> JobState:
        """The attempt's state (``state.job_state``): phase, reason, nodes, disruptions.
        Each of ``nodes`` also has ``instance_type`` and ``capacity_type`` (``spot``,
        ``on-demand``; None when unknown or nodes may not be read)."""
        job = self._read_job(handle)
        pods = self._pods(handle)
        state = job_state(
            job,
            pods,
            now=datetime.fromtimestamp(self._clock(), UTC),
            unschedulable_deadline_s=self.unschedulable_deadline_s,
            node_names_present=self._nodes_present(pods),
        )
        types = self._node_types(pods)
        for node in state["nodes"]:
            name = node.get("node_name")
            machine = types[name] if name is not None and name in types else node_type(None)
            node["instance_type"] = machine["instance_type"]
            node["capacity_type"] = machine["capacity_type"]
        return state

    def delete(self, handle: JobHandle) -> None:
        """Delete the job (Foreground: its pods go first, each with its grace period) and its
        Service and PodGroup. Missing objects are fine."""
        refs = handle.get("manifests") or [job_ref(handle["kind"], handle["job_id"])]
        self._delete_objects(refs, handle["namespace"])

    def _delete_objects(self, refs: list[ObjectRef], namespace: str) -> None:
        for ref in reversed(refs):  # the job first, then what its pods used
            kind, name = ref["kind"], ref["name"]
            what = f"delete {kind} {namespace}/{name}"
            if kind == "Service":
                self._ignore_missing(
                    what, self.hook.core_v1_client.delete_namespaced_service, name, namespace
                )
            elif kind == indexed_job.KIND:
                self._ignore_missing(
                    what,
                    self.hook.batch_v1_client.delete_namespaced_job,
                    name,
                    namespace,
                    propagation_policy="Foreground",
                )
            else:
                group, version, plural = CUSTOM_KINDS[kind]
                self._ignore_missing(
                    what,
                    self.hook.custom_object_client.delete_namespaced_custom_object,
                    group,
                    version,
                    namespace,
                    plural,
                    name,
                    propagation_policy="Foreground",
                )

    def all_gone(self, handle: JobHandle) -> bool:
        """True once no pod of the attempt is left (relaunch only then: no late commit races)."""
        return not self._pods(handle)

    def find(self, labels: Mapping[str, str]) -> list[JobHandle]:
        """Handles of live (not finished) jobs in ``namespace`` whose labels include ``labels``."""
        ns, selector = self.namespace, label_selector(labels)
        # The API server leaves kind and apiVersion out of a list's items (kubernetes#3030):
        # each job goes with the API kind it was listed by.
        listed = self._plain(
            self._call(
                f"list Jobs {ns}/{selector}",
                self.hook.batch_v1_client.list_namespaced_job,
                ns,
                label_selector=selector,
            )
        )
        jobs: list[tuple[str, Json]] = [(indexed_job.KIND, job) for job in listed.get("items") or []]
        for api_kind in (pytorchjob.KIND, trainjob.KIND):
            group, version, plural = CUSTOM_KINDS[api_kind]
            # 404: that CRD (Training Operator, Trainer v2) is not installed: there are none
            listed = self._ignore_missing(
                f"list {api_kind}s {ns}/{selector}",
                self.hook.custom_object_client.list_namespaced_custom_object,
                group,
                version,
                ns,
                plural,
                label_selector=selector,
            )
            jobs += [(api_kind, job) for job in (listed or {}).get("items") or []]
        found: list[JobHandle] = []
        for api_kind, job in jobs:
            if job_outcome({**job, "kind": api_kind})[0] in ("succeeded", "failed"):
                continue
            meta, kind = job["metadata"], JOB_KINDS[api_kind]
            found.append(
                {
                    "cluster": self.name,
                    "job_id": meta["name"],
                    "kind": kind,
                    "namespace": meta.get("namespace", ns),
                    "labels": dict(meta.get("labels") or {}),
                    "manifests": object_refs(kind, meta["name"]),
                }
            )
        return found

    def _read_log(self, pod: Json, namespace: str, **options: Any) -> bytes:
        """The raw log of ``pod``'s trainer container. Raw, not the client's str: it would
        json-parse the body, and client 36 returns the repr of the bytes (``"b'...'"``)."""
        name = pod["metadata"]["name"]

        def read() -> bytes:
            response = self.hook.core_v1_client.read_namespaced_pod_log(
                name, namespace, container=trainer_container(pod), _preload_content=False, **options
            )
            try:
                data: bytes = response.data  # a reset while reading the body is retried too
                return data
            finally:
                response.release_conn()

        data: bytes = self._call(f"read log of pod {namespace}/{name}", read)
        return data

    def logs_tail(self, handle: JobHandle, lines: int = 30) -> str:
        """The last ``lines`` lines of each pod's trainer container, prefixed ``[node-<i>]``, with
        torchrun's own traceback folded into one line (:mod:`~trainops.cluster.torchrun_log`)."""
        out = []
        for pod in sorted(self._pods(handle), key=lambda p: node_index(p) or 0):
            name, index = pod["metadata"]["name"], node_index(pod)
            try:
                # with room for a torchrun block's start, to fold it
                text = self._read_log(pod, handle["namespace"], tail_lines=lines + MAX_BLOCK_LINES).decode(
                    "utf-8", errors="replace"
                )
            except Exception as exc:  # a pod that never started has no log; say so
                text = f"(no log for pod {name}: {getattr(exc, 'reason', None) or exc})"
            folded, _ = fold(text.splitlines())
            out += [f"[node-{index}] {line}" for line in (folded[-lines:] if lines > 0 else [])]
        return "\n".join(out)

    def _node0_pod(self, handle: JobHandle) -> Json | None:
        """The newest pod of gang index 0 (a retried index leaves its failed pod behind)."""
        pods = [p for p in self._pods(handle) if node_index(p) == 0]
        return max(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp")), default=None)

    def log_lines(
        self, handle: JobHandle, cursor: LogCursor | None, max_lines: int = 200
    ) -> tuple[list[str], LogCursor | None]:
        """New lines of node 0's trainer log since ``cursor`` (None: start), and the next cursor.

        The cursor is plain JSON, ``{"pod", "ts", "n"}`` (:mod:`.logs`). A first read (no
        cursor, or another pod's after a relaunch) returns the pod's last lines. Never raises
        for a pod that has not started yet or is gone: returns ``([], cursor)``. At most
        ``max_lines`` lines per call; when more were available, the first returned line says
        how many were skipped (``(… 1234 earlier lines skipped)``) and the newest follow.
        """
        if max_lines < 1:
            raise ValueError(f"max_lines must be at least 1, not {max_lines}")
        pod = self._node0_pod(handle)
        if pod is None or (pod.get("status") or {}).get("phase") == "Pending":
            return [], cursor
        first = logs.first_read(cursor, pod["metadata"]["name"])
        try:
            lines, next_cursor, stuck = self._read_new_lines(handle, pod, cursor, max_lines, first)
            if stuck:  # a byte-capped read held only lines seen already: skip to the newest
                lines, next_cursor, _ = self._read_new_lines(handle, pod, cursor, max_lines, True)
        except Exception as exc:
            status = status_of(exc)
            if status == 404 or logs.not_started(
                status, f"{getattr(exc, 'reason', '')} {getattr(exc, 'body', '')}"
            ):
                return [], cursor
            raise
        return lines, next_cursor

    def _read_new_lines(
        self, handle: JobHandle, pod: Json, cursor: LogCursor | None, max_lines: int, tailed: bool
    ) -> tuple[list[str], LogCursor, bool]:
        """One timestamped read of ``pod``'s log: its last lines (``tailed``) or all since the
        cursor, capped at ``log_limit_bytes``. Returns the new lines, the next cursor and
        whether the read was capped before it reached a new line."""
        # not tailed: the cursor has seen this pod up to its timestamp (``logs.first_read``)
        since = None if tailed else (cursor or {}).get("ts")
        window = (
            {"tail_lines": max_lines + 1}
            if since is None
            else {"since_seconds": logs.since_seconds(since, self._clock())}
        )
        data = self._read_log(
            pod, handle["namespace"], timestamps=True, limit_bytes=self.log_limit_bytes, **window
        )
        capped = len(data) >= self.log_limit_bytes
        finished = (pod.get("status") or {}).get("phase") in FINISHED_POD_PHASES
        lines, next_cursor = logs.new_lines(
            data.decode("utf-8", errors="replace"),
            cursor,
            pod["metadata"]["name"],
            max_lines,
            tailed=tailed,
            keep_partial=finished and not capped,
            final=finished and not capped,
        )
        return lines, next_cursor, capped and not lines and not tailed
