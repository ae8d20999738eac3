"""The ``pytorchjob`` kind: a Kubeflow Training Operator v1 ``PyTorchJob`` (``kubeflow.org/v1``).

One ``Master`` replica hosts the rendezvous (the operator gives it the Service
``<job>-master-0``) and ``nodes - 1`` ``Worker`` replicas join it. Every replica has
``restartPolicy: Never`` and the run policy ``backoffLimit: 0``: the operator relaunches the
whole gang. Volcano gang scheduling and Kueue suspension go in the run policy.
"""

from __future__ import annotations

from trainops.cluster.kubernetes import names, objects, pod
from trainops.cluster.kubernetes.objects import JOB_LABEL, Json
from trainops.cluster.spec import JobSpec

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
API_VERSION, KIND = f"{GROUP}/{VERSION}", "PyTorchJob"
CONTAINER = "pytorch"  # the name the Training Operator requires
PORT_NAME = "pytorchjob-port"  # the port the Training Operator looks for


def replica(spec: JobSpec, job: str, replicas: int, is_host: bool) -> Json:
    """One replica spec: ``replicas`` pods, each a torchrun agent (``is_host``: the Master)."""
    endpoint = f"{job}-master-0:{pod.RDZV_PORT}"  # the operator's per-replica Service
    argv = pod.command(spec, job, endpoint, is_host=is_host)
    container = pod.container(spec, CONTAINER, argv, port_name=PORT_NAME)
    return {
        "replicas": replicas,
        "restartPolicy": "Never",
        "template": {
            "metadata": pod.pod_metadata(spec, {JOB_LABEL: job}),
            "spec": pod.pod_spec(spec, container),
        },
    }


def run_policy(spec: JobSpec) -> Json:
    """No retries, finished pods kept, Volcano's gang and Kueue's suspension, and the TTL of a
    kept job."""
    # cleanPodPolicy None keeps finished pods, so the operator can read why they ended.
    policy: Json = {"cleanPodPolicy": "None", "backoffLimit": 0}
    if spec.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if objects.is_volcano(spec):
        gang: Json = {"minAvailable": spec.nodes}
        if objects.queue(spec):
            gang["queue"] = objects.queue(spec)
        if spec.priority_class:
            gang["priorityClass"] = spec.priority_class
        policy["schedulingPolicy"] = gang
    if objects.is_kueue(spec):
        policy["suspend"] = True
    return policy


def manifests(spec: JobSpec) -> list[Json]:
    """One PyTorchJob: Master (rendezvous host) and nodes-1 Workers."""
    job = names.job_name(spec)
    replicas = {"Master": replica(spec, job, 1, True)}
    if spec.nodes > 1:
        replicas["Worker"] = replica(spec, job, spec.nodes - 1, False)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": objects.metadata(spec, job),
            "spec": {
                "runPolicy": run_policy(spec),
                "nprocPerNode": str(spec.procs_per_node),
                "pytorchReplicaSpecs": replicas,
            },
        }
    ]
