"""The ``indexed-job`` kind: a plain batch/v1 Indexed Job and its headless Service, which need no
operator installed (and a Volcano PodGroup when Volcano gang-schedules the pods).

The Job runs ``nodes`` pods with ``completionMode: Indexed``; each pod's hostname is
``<job>-<index>`` under the Service, so index 0 has a stable DNS name for torchrun's c10d
rendezvous, and every index runs the same argument list. ``backoffLimit: 0`` and a
``podFailurePolicy`` fail the Job as a whole on the first ``DisruptionTarget`` or non-zero
exit: the operator relaunches the whole gang.
"""

from __future__ import annotations

from trainops.cluster.base import ObjectRef
from trainops.cluster.kubernetes import names, objects, pod
from trainops.cluster.kubernetes.objects import JOB_LABEL, Json
from trainops.cluster.spec import JobSpec

API_VERSION, KIND = "batch/v1", "Job"
POD_GROUP_GROUP, POD_GROUP_VERSION, POD_GROUP_PLURAL = "scheduling.volcano.sh", "v1beta1", "podgroups"
POD_GROUP_API_VERSION, POD_GROUP_KIND = f"{POD_GROUP_GROUP}/{POD_GROUP_VERSION}", "PodGroup"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
CONTAINER = "trainer"


def rendezvous(spec: JobSpec, job: str) -> str:
    """Index 0's stable DNS name. It is the fully qualified name that the kubelet writes as
    the canonical name in index 0's /etc/hosts, which is how torchrun's c10d backend finds,
    without per-index arguments, that this pod is the one to host the rendezvous store."""
    service = names.service_name(job)
    return f"{job}-0.{service}.{spec.namespace}.svc.{spec.cluster_domain}:{pod.RDZV_PORT}"


def service(spec: JobSpec, job: str) -> Json:
    """The headless Service that gives each index its DNS name (also before it is ready)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": objects.metadata(spec, names.service_name(job)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: job},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": pod.RDZV_PORT,
                    "targetPort": pod.RDZV_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def pod_group(spec: JobSpec, job: str) -> Json:
    """Gang scheduling for a plain Job: all ``nodes`` pods or none."""
    group: Json = {"minMember": spec.nodes}
    if objects.queue(spec):
        group["queue"] = objects.queue(spec)
    if spec.priority_class:
        group["priorityClassName"] = spec.priority_class
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": POD_GROUP_KIND,
        "metadata": objects.metadata(spec, job),
        "spec": group,
    }


def manifests(spec: JobSpec) -> list[Json]:
    """A headless Service (when distributed), a PodGroup (Volcano), then the Indexed Job."""
    job = names.job_name(spec)
    argv = pod.command(spec, job, rendezvous(spec, job), is_host=None)
    pod_annotations = {}
    out = []
    if spec.distributed:
        out.append(service(spec, job))
    if objects.is_volcano(spec):
        out.append(pod_group(spec, job))
        pod_annotations[VOLCANO_GROUP_ANNOTATION] = job
    template_spec = pod.pod_spec(
        spec,
        pod.container(spec, CONTAINER, argv),
        subdomain=names.service_name(job) if spec.distributed else None,
    )
    job_spec: Json = {
        "completionMode": "Indexed",
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
            ]
        },
        "template": {
            "metadata": pod.pod_metadata(spec, {JOB_LABEL: job}, pod_annotations),
            "spec": template_spec,
        },
    }
    if spec.ttl_seconds_after_finished is not None:  # a kept job: Kubernetes deletes it later
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if objects.is_kueue(spec):
        job_spec["suspend"] = True  # Kueue unsuspends it when the queue admits it
    out.append(
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": objects.metadata(spec, job), "spec": job_spec}
    )
    return out


def object_refs(job: str) -> list[ObjectRef]:
    """Every object a launch of the Indexed Job ``job`` may have created, in creation order
    (its Service and PodGroup share its name; deleting one that is not there is no error)."""
    return [
        {"apiVersion": "v1", "kind": "Service", "name": names.service_name(job)},
        {"apiVersion": POD_GROUP_API_VERSION, "kind": POD_GROUP_KIND, "name": job},
        {"apiVersion": API_VERSION, "kind": KIND, "name": job},
    ]
