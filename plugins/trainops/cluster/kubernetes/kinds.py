"""The job kinds: a plain Indexed Job + headless Service, a Kubeflow PyTorchJob, or a Kubeflow
Trainer v2 TrainJob (``k8s_trainjob``).

Recovery is a whole-gang relaunch owned by the operator, so no kind restarts a pod by
itself: ``restartPolicy: Never`` everywhere, and the Indexed Job fails as a whole on the
first disruption or non-zero exit.
"""

from __future__ import annotations

from trainops.cluster.kubernetes import names
from trainops.cluster.kubernetes import pod as k8s_pod

JOB_LABEL = "trainops/job"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


def queue(spec) -> str | None:
    """The Kueue or Volcano queue named by ``scheduler``, if any."""
    _, _, name = spec.scheduler.partition(":")
    return name or None


def metadata(spec, name: str) -> dict:
    """The job object's metadata: the user's labels, ``trainops/job``, the Kueue queue label."""
    labels = {**spec.labels, JOB_LABEL: name}
    if spec.scheduler.startswith("kueue:"):
        labels[KUEUE_QUEUE_LABEL] = queue(spec)
    meta = {"name": name, "namespace": spec.namespace, "labels": names.labels(labels)}
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    return meta


def indexed_job_rendezvous(spec, job: str) -> str:
    """Index 0's stable DNS name. It is the fully qualified name that the kubelet writes as
    the canonical name in index 0's /etc/hosts, which is how torchrun's c10d backend finds,
    without per-index arguments, that this pod is the one to host the rendezvous store."""
    service = names.service_name(job)
    return f"{job}-0.{service}.{spec.namespace}.svc.{spec.cluster_domain}:{k8s_pod.RDZV_PORT}"


def indexed_job(spec) -> list[dict]:
    """A headless Service, (Volcano: a PodGroup,) and an Indexed Job."""
    job = names.k8s_job_name(spec)
    service = names.service_name(job)
    argv = k8s_pod.command(spec, job, indexed_job_rendezvous(spec, job), is_host=None)
    pod_annotations = {}
    out = []
    if spec.distributed:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": metadata(spec, service),
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": {JOB_LABEL: job},
                    "ports": [
                        {
                            "name": "rendezvous",
                            "port": k8s_pod.RDZV_PORT,
                            "targetPort": k8s_pod.RDZV_PORT,
                            "protocol": "TCP",
                        }
                    ],
                },
            }
        )
    if spec.scheduler.startswith("volcano"):
        out.append(volcano_pod_group(spec, job))
        pod_annotations[VOLCANO_GROUP_ANNOTATION] = job
    template_spec = k8s_pod.pod_spec(
        spec, k8s_pod.container(spec, "trainer", argv), subdomain=service if spec.distributed else None
    )
    job_spec = {
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
            "metadata": k8s_pod.pod_metadata(spec, {JOB_LABEL: job}, pod_annotations),
            "spec": template_spec,
        },
    }
    if spec.scheduler.startswith("kueue:"):
        job_spec["suspend"] = True  # Kueue unsuspends it when the queue admits it
    out.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(spec, job), "spec": job_spec})
    return out


def volcano_pod_group(spec, job: str) -> dict:
    """Gang scheduling for a plain Job: all ``nodes`` pods or none."""
    group = {"minMember": spec.nodes}
    if queue(spec):
        group["queue"] = queue(spec)
    if spec.priority_class:
        group["priorityClassName"] = spec.priority_class
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": metadata(spec, job),
        "spec": group,
    }


def pytorchjob(spec) -> list[dict]:
    """A Kubeflow PyTorchJob: Master (rendezvous host) and nodes-1 Workers."""
    job = names.k8s_job_name(spec)
    endpoint = f"{job}-master-0:{k8s_pod.RDZV_PORT}"  # the operator's per-replica Service

    def replica(replicas: int, is_host: bool) -> dict:
        argv = k8s_pod.command(spec, job, endpoint, is_host=is_host)
        container = k8s_pod.container(spec, "pytorch", argv, port_name="pytorchjob-port")
        return {
            "replicas": replicas,
            "restartPolicy": "Never",
            "template": {
                "metadata": k8s_pod.pod_metadata(spec, {JOB_LABEL: job}),
                "spec": k8s_pod.pod_spec(spec, container),
            },
        }

    replicas = {"Master": replica(1, True)}
    if spec.nodes > 1:
        replicas["Worker"] = replica(spec.nodes - 1, False)
    # cleanPodPolicy None keeps finished pods, so the operator can read why they ended.
    run_policy: dict = {"cleanPodPolicy": "None", "backoffLimit": 0}
    if spec.scheduler.startswith("volcano"):
        policy = {"minAvailable": spec.nodes}
        if queue(spec):
            policy["queue"] = queue(spec)
        if spec.priority_class:
            policy["priorityClass"] = spec.priority_class
        run_policy["schedulingPolicy"] = policy
    if spec.scheduler.startswith("kueue:"):
        run_policy["suspend"] = True
    return [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": metadata(spec, job),
            "spec": {
                "runPolicy": run_policy,
                "nprocPerNode": str(spec.procs_per_node),
                "pytorchReplicaSpecs": replicas,
            },
        }
    ]


def trainjob(spec) -> list[dict]:
    """A Kubeflow Trainer v2 TrainJob (``k8s_trainjob``)."""
    from trainops.cluster.kubernetes import trainjob as k8s_trainjob

    return k8s_trainjob.trainjob(spec)


BUILDERS = {"indexed-job": indexed_job, "pytorchjob": pytorchjob, "trainjob": trainjob}


def pod_selector(kind: str, job: str) -> dict[str, str]:
    """The labels that select an attempt's pods, for a job named ``job``
    (``names.k8s_job_name``). ``trainops/job`` reaches the pods of an Indexed Job and a
    PyTorchJob; a TrainJob cannot label its pods, so those are selected by their JobSet's
    labels (the JobSet is named after the TrainJob)."""
    if kind == "trainjob":
        from trainops.cluster.kubernetes import trainjob as k8s_trainjob

        return k8s_trainjob.pod_selector(job)
    return {JOB_LABEL: job}
