"""The Kubernetes backend: submit, watch and delete job gangs through the cncf-kubernetes
provider's ``KubernetesHook`` (an Airflow connection says which cluster).

Same interface as ``LocalCluster``; handles are plain dicts (XCom and trigger safe). What an
attempt's state means is decided by the pure ``k8s_classify.job_state``; this module only
reads and writes API objects.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from trainops.cluster import k8s_classify, k8s_names
from trainops.cluster.k8s_kinds import JOB_LABEL

log = logging.getLogger(__name__)
# kind -> (group, version, plural) of the objects created through the custom objects API
CUSTOM_KINDS = {"PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
                "PodGroup": ("scheduling.volcano.sh", "v1beta1", "podgroups")}
JOB_KINDS = {"Job": "indexed-job", "PyTorchJob": "pytorchjob"}


def label_selector(labels: dict) -> str:
    """``k=v,...`` with values fitted as they were on the objects (``k8s_names.label_value``)."""
    return ",".join(f"{k}={k8s_names.label_value(v)}" for k, v in sorted(labels.items()))


def _status_code(exc: Exception) -> int | None:
    return getattr(exc, "status", None)


class KubernetesCluster:
    """Launch, watch and delete jobs on a Kubernetes cluster.

    :param kubernetes_conn_id: the Airflow connection of the cluster (``KubernetesHook``).
    :param namespace: where to look for jobs (``find``); default: the connection's
        namespace, else ``default``. Jobs are created in their JobSpec's namespace.
    :param unschedulable_deadline_s: seconds pods may stay unschedulable before the attempt
        counts as an infrastructure failure (not while Kueue holds it suspended).
    :param hook: a ready hook (tests); default: ``KubernetesHook(conn_id=kubernetes_conn_id)``,
        created on first use.
    """

    name = "kubernetes"

    def __init__(self, kubernetes_conn_id: str | None = "kubernetes_default",
                 namespace: str | None = None, unschedulable_deadline_s: float = 900,
                 hook=None):
        self.kubernetes_conn_id = kubernetes_conn_id
        self._namespace = namespace
        self.unschedulable_deadline_s = unschedulable_deadline_s
        self._hook = hook
        self._read_nodes = True  # off after a 403: the node check needs a ClusterRole
        self._serializer = None

    # -- plumbing --------------------------------------------------------------------
    @property
    def hook(self):
        if self._hook is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

            self._hook = KubernetesHook(conn_id=self.kubernetes_conn_id)
        return self._hook

    @property
    def namespace(self) -> str:
        return self._namespace or self.hook.get_namespace() or "default"

    def _plain(self, obj):
        """The API's JSON form (camelCase dicts) of what the client returned."""
        if obj is None or isinstance(obj, dict):
            return obj
        if self._serializer is None:
            from kubernetes.client import ApiClient

            self._serializer = ApiClient()
        return self._serializer.sanitize_for_serialization(obj)

    def _ignore_missing(self, call, *args, **kwargs):
        """``call`` result, or None when the object is not there (404)."""
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if _status_code(exc) == 404:
                return None
            raise

    # -- interface -------------------------------------------------------------------
    def launch(self, spec, *, chaos: dict | None = None) -> dict:
        """Create the rendered objects (Service, PodGroup, then the job) and return the handle.
        If one cannot be created, the ones already created are deleted again."""
        from trainops.cluster.k8s_render import render_manifests

        if chaos:
            raise ValueError(f"injected preemptions ({chaos!r}) work only on cluster='local'")

        if self._namespace and self._namespace != spec.namespace:
            raise ValueError(f"JobSpec namespace {spec.namespace!r} differs from the backend's "
                             f"namespace {self._namespace!r}: set the same namespace on both")
        manifests = render_manifests(spec)
        job = manifests[-1]
        handle = {"cluster": self.name, "job_id": job["metadata"]["name"],
                  "kind": JOB_KINDS[job["kind"]], "namespace": spec.namespace,
                  "labels": dict(spec.labels),
                  "manifests": [{"apiVersion": m["apiVersion"], "kind": m["kind"],
                                 "name": m["metadata"]["name"]} for m in manifests]}
        created = []
        try:
            for manifest in manifests:
                self._create(manifest, spec.namespace, is_job=manifest is job)
                created.append(manifest)
        except Exception:
            try:
                self._delete_objects([_ref(m) for m in created], spec.namespace)
            except Exception:  # the creation error is the one to report
                log.exception("could not delete %s after a failed launch", [_ref(m) for m in created])
            raise
        return handle

    def _create(self, manifest: dict, namespace: str, is_job: bool) -> None:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        try:
            if kind == "Service":
                self.hook.core_v1_client.create_namespaced_service(namespace, manifest)
            elif kind == "Job":
                self.hook.batch_v1_client.create_namespaced_job(namespace, manifest)
            else:
                group, version, plural = CUSTOM_KINDS[kind]
                self.hook.custom_object_client.create_namespaced_custom_object(
                    group, version, namespace, plural, manifest)
        except Exception as exc:
            if _status_code(exc) != 409:
                raise
            if is_job:
                raise RuntimeError(
                    f"{kind} {name!r} already exists in namespace {namespace!r}: a previous launch "
                    f"of this attempt is still there; delete it (kubectl -n {namespace} delete "
                    f"{kind.lower()} {name}) or let the operator reattach to it") from exc
            # Services and PodGroups are derived from the JobSpec alone: an existing one fits.

    def _read_job(self, handle: dict) -> dict | None:
        ns, name = handle["namespace"], handle["job_id"]
        if handle["kind"] == "pytorchjob":
            group, version, plural = CUSTOM_KINDS["PyTorchJob"]
            return self._plain(self._ignore_missing(
                self.hook.custom_object_client.get_namespaced_custom_object,
                group, version, ns, plural, name))
        return self._plain(self._ignore_missing(
            self.hook.batch_v1_client.read_namespaced_job, name, ns))

    def _pods(self, handle: dict) -> list[dict]:
        pods = self.hook.core_v1_client.list_namespaced_pod(
            handle["namespace"], label_selector=label_selector({JOB_LABEL: handle["job_id"]}))
        return self._plain(pods).get("items") or []

    def _nodes_present(self, pods: list[dict]) -> set[str] | None:
        """Which of the running pods' nodes still exist; None if we may not read nodes."""
        names = {p["spec"]["nodeName"] for p in pods if (p.get("spec") or {}).get("nodeName")
                 and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        if not self._read_nodes:
            return None
        present = set()
        for name in sorted(names):
            try:
                if self._ignore_missing(self.hook.core_v1_client.read_node, name) is not None:
                    present.add(name)
            except Exception as exc:
                if _status_code(exc) != 403:
                    raise
                self._read_nodes = False  # no ClusterRole for nodes: rely on pod conditions
                return None
        return present

    def status(self, handle: dict) -> dict:
        """The attempt's state (``k8s_classify.job_state``): phase, reason, nodes, disruptions."""
        job = self._read_job(handle)
        pods = self._pods(handle)
        return k8s_classify.job_state(
            job, pods, now=datetime.now(timezone.utc),
            unschedulable_deadline_s=self.unschedulable_deadline_s,
            node_names_present=self._nodes_present(pods))

    def delete(self, handle: dict) -> None:
        """Delete the job (Foreground: its pods go first, each with its grace period) and its
        Service and PodGroup. Missing objects are fine."""
        refs = handle.get("manifests") or [
            {"kind": {"indexed-job": "Job", "pytorchjob": "PyTorchJob"}[handle["kind"]],
             "name": handle["job_id"]}]
        self._delete_objects(refs, handle["namespace"])

    def _delete_objects(self, refs: list[dict], namespace: str) -> None:
        for ref in reversed(refs):  # the job first, then what its pods used
            kind, name = ref["kind"], ref["name"]
            if kind == "Service":
                self._ignore_missing(self.hook.core_v1_client.delete_namespaced_service, name, namespace)
            elif kind == "Job":
                self._ignore_missing(self.hook.batch_v1_client.delete_namespaced_job, name, namespace,
                                     propagation_policy="Foreground")
            else:
                group, version, plural = CUSTOM_KINDS[kind]
                self._ignore_missing(self.hook.custom_object_client.delete_namespaced_custom_object,
                                     group, version, namespace, plural, name,
                                     propagation_policy="Foreground")

    def all_gone(self, handle: dict) -> bool:
        """True once no pod of the attempt is left (relaunch only then: no late commit races)."""
        return not self._pods(handle)

    def find(self, labels: dict) -> list[dict]:
        """Handles of live (not finished) jobs in ``namespace`` whose labels include ``labels``."""
        ns, selector = self.namespace, label_selector(labels)
        jobs = self._plain(self.hook.batch_v1_client.list_namespaced_job(
            ns, label_selector=selector)).get("items") or []
        group, version, plural = CUSTOM_KINDS["PyTorchJob"]
        # 404: the Training Operator's CRD is not installed, so there are no PyTorchJobs
        listed = self._ignore_missing(self.hook.custom_object_client.list_namespaced_custom_object,
                                      group, version, ns, plural, label_selector=selector)
        jobs += (listed or {}).get("items") or []
        found = []
        for job in jobs:
            meta = job["metadata"]
            if k8s_classify.job_outcome(job)[0] in ("succeeded", "failed"):
                continue
            name = meta["name"]
            manifests = [{"apiVersion": job.get("apiVersion"), "kind": job.get("kind"), "name": name}]
            if job.get("kind") == "Job":  # its Service and PodGroup share its name
                manifests = [{"apiVersion": "v1", "kind": "Service", "name": name},
                             {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                              "name": name}, *manifests]
            found.append({"cluster": self.name, "job_id": name, "kind": JOB_KINDS[job["kind"]],
                          "namespace": meta.get("namespace", ns),
                          "labels": dict(meta.get("labels") or {}), "manifests": manifests})
        return found

    def logs_tail(self, handle: dict, lines: int = 30) -> str:
        """The last ``lines`` lines of each pod's trainer container, prefixed ``[node-<i>]``."""
        out = []
        for pod in sorted(self._pods(handle), key=lambda p: k8s_classify.node_index(p) or 0):
            name, index = pod["metadata"]["name"], k8s_classify.node_index(pod)
            try:
                text = self.hook.core_v1_client.read_namespaced_pod_log(
                    name, handle["namespace"], container=k8s_classify.trainer_container(pod),
                    tail_lines=lines)
            except Exception as exc:  # a pod that never started has no log; say so
                text = f"(no log for pod {name}: {getattr(exc, 'reason', None) or exc})"
            out += [f"[node-{index}] {line}" for line in str(text).splitlines()]
        return "\n".join(out)


def _ref(manifest: dict) -> dict:
    return {"apiVersion": manifest["apiVersion"], "kind": manifest["kind"],
            "name": manifest["metadata"]["name"]}
