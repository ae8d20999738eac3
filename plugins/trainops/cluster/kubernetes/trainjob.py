"""The ``trainjob`` kind: a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``).

The schema is the one pinned in tests/data/crds (its ``podSpecOverrides`` took effect with
Trainer v2.0; later releases renamed it ``podTemplateOverrides``, and an API server would
prune the old field silently, so pin again before targeting them). A TrainJob names a
ClusterTrainingRuntime (``JobSpec.runtime``); Trainer turns both into a JobSet whose
replicated job ``node`` runs ``numNodes`` pods of the Indexed Job ``<job>-node-0``, pod
hostnames ``<job>-node-0-<index>``, container ``node``.

What the TrainJob sets, as the other kinds do: image, command (an argument list), node count,
processes per node, resources (GPU requests = limits), env with Secret key references, the
whole-Secret ``envFrom``, the ``/dev/shm`` and cache volumes, tolerations, service account,
placement, labels, Kueue suspension.

Rendezvous: the runtime's Torch plugin sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK`` (the completion index), ``PET_MASTER_ADDR`` (``<job>-node-0-0.<job>``) and
``PET_MASTER_PORT`` (29500), which torchrun reads as its flags; the command is our torchrun
without the c10d flags (``pod.static_command``), keeping ``--shutdown-timeout`` and
``--max-restarts=0``. It is split into ``command`` (the interpreter) and ``args`` (the rest),
so a runtime's own ``args`` can never be appended to it.

What the schema cannot say, and how each is handled:

- pod affinity: placement is a ``nodeSelector`` (``placement.node_selector``), which
  raises JobSpecError for ``spot_flavour: auto``, on-demand on GKE or AKS, and ``affinity``.
- ``schedulerName``, ``priorityClassName``: JobSpecError for ``volcano`` schedulers and
  ``priority_class`` (gang scheduling and priority belong in the runtime, or use Kueue).
- ``terminationGracePeriodSeconds``: the pods get the runtime's. ``termination_grace_seconds``
  must state it (torchrun's shutdown timeout is sized from it); with the stock
  ``torch-distributed`` runtime, which sets none (Kubernetes' 30 s), a larger value is a
  JobSpecError.
- pod labels and annotations: ``spec.labels``/``spec.annotations`` reach the JobSet, not the
  pods, so the pods do not carry ``trainops/job``: select them with ``pod_selector``.
- security context, ``restartPolicy``, the Job's ``backoffLimit``/``podFailurePolicy``,
  ``enableServiceLinks``, ``automountServiceAccountToken``: the runtime's pod and Job
  templates decide (documented in docs/kubernetes.md; the stock runtime sets none of them).
- ``ttlSecondsAfterFinished``: the TrainJob has none, so ``ttl_seconds_after_finished`` is a
  JobSpecError (a kept TrainJob stays until deleted; the training operator deletes finished
  attempts itself unless told to keep them).
- env on the ``node`` container override is refused by Trainer's webhook, so variables go in
  ``trainer.env`` (which keeps ``valueFrom``); names starting ``PET_`` are Trainer's own and
  a JobSpecError.
"""

from __future__ import annotations

from trainops.cluster.kubernetes import names, objects, placement, pod
from trainops.cluster.kubernetes.objects import JOB_LABEL, Json
from trainops.cluster.spec import JobSpec, JobSpecError

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
API_VERSION, KIND = f"{GROUP}/{VERSION}", "TrainJob"
NODE = "node"  # the runtime's replicated job and container that run the trainer
STOCK_RUNTIME = "torch-distributed"  # Trainer's own; its pod template sets no grace period
DEFAULT_GRACE_SECONDS = 30  # Kubernetes' default terminationGracePeriodSeconds
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on every pod; the JobSet's name is ours
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESERVED_ENV_PREFIX = "PET_"


def pod_selector(job: str) -> dict[str, str]:
    """The labels of a TrainJob's trainer pods (JobSet sets them; ours do not reach pods)."""
    return {JOBSET_NAME_LABEL: job, JOBSET_REPLICATED_JOB_LABEL: NODE}


def check(spec: JobSpec) -> None:
    """Raise JobSpecError for what a TrainJob cannot carry, naming the field."""
    if objects.is_volcano(spec):
        raise JobSpecError(
            f"JobSpec scheduler {spec.scheduler!r} cannot be used with kind 'trainjob': a TrainJob "
            "cannot set its pods' schedulerName; gang scheduling belongs in the runtime "
            f"({spec.runtime!r}: podGroupPolicy); use 'default' with such a runtime, or "
            "'kueue:<queue>'"
        )
    if spec.priority_class:
        raise JobSpecError(
            f"JobSpec priority_class {spec.priority_class!r} cannot be set for kind 'trainjob': a "
            "TrainJob cannot set its pods' priorityClassName; set it in the runtime's pod "
            "template, or leave it to Kueue"
        )
    if spec.runtime == STOCK_RUNTIME and spec.termination_grace_seconds > DEFAULT_GRACE_SECONDS:
        raise JobSpecError(
            f"JobSpec termination_grace_seconds {spec.termination_grace_seconds} cannot be "
            f"honoured by kind 'trainjob' with runtime {STOCK_RUNTIME!r}: a TrainJob cannot set "
            "terminationGracePeriodSeconds, and that runtime leaves Kubernetes' default "
            f"({DEFAULT_GRACE_SECONDS} s); set termination_grace_seconds <= "
            f"{DEFAULT_GRACE_SECONDS}, or name a ClusterTrainingRuntime of yours (runtime) whose "
            "pod template sets terminationGracePeriodSeconds to it"
        )
    if spec.ttl_seconds_after_finished is not None:
        raise JobSpecError(
            f"JobSpec ttl_seconds_after_finished {spec.ttl_seconds_after_finished} cannot be set for "
            "kind 'trainjob': a TrainJob has no ttlSecondsAfterFinished; leave it None (delete "
            "the TrainJob, or let its runtime's JobSet template set a TTL)"
        )
    for name in [
        *spec.env,
        *spec.nccl_env,
        *(r["env"] for r in spec.env_from_secrets if not isinstance(r, str)),
    ]:
        if name.startswith(RESERVED_ENV_PREFIX):
            raise JobSpecError(
                f"JobSpec env {name!r} cannot be set for kind 'trainjob': Trainer sets the "
                f"{RESERVED_ENV_PREFIX}* variables (torchrun's rendezvous) itself"
            )


def trainer(spec: JobSpec) -> Json:
    """``spec.trainer``: image, argv, nodes, processes, resources, env."""
    argv = pod.static_command(spec)
    out: Json = {"image": spec.image, "command": argv[:1], "args": argv[1:], "numNodes": spec.nodes}
    if spec.distributed:
        out["numProcPerNode"] = spec.procs_per_node
    out["resourcesPerNode"] = pod.resources(spec)
    out["env"] = pod.env_vars(spec)
    return out


def pod_overrides(spec: JobSpec) -> list[Json]:
    """``spec.podSpecOverrides`` for the ``node`` job: volumes and their mounts, whole-Secret
    ``envFrom``, placement, tolerations, service account."""
    container: Json = {"name": NODE, "volumeMounts": pod.volume_mounts()}
    secrets = pod.env_from(spec)
    if secrets:
        container["envFrom"] = secrets
    override: Json = {
        "targetJobs": [{"name": NODE}],
        "containers": [container],
        "volumes": pod.volumes(spec),
        "nodeSelector": placement.node_selector(spec, "trainjob"),
    }
    tolerations = placement.tolerations(spec)
    if tolerations:
        override["tolerations"] = tolerations
    if spec.service_account:
        override["serviceAccountName"] = spec.service_account
    return [override]


def manifests(spec: JobSpec) -> list[Json]:
    """One TrainJob. Raises JobSpecError naming a field the TrainJob cannot carry."""
    check(spec)
    pod.check_env(spec)
    job = names.job_name(spec)
    body: Json = {
        "runtimeRef": {"name": spec.runtime, "apiGroup": GROUP, "kind": "ClusterTrainingRuntime"},
        "trainer": trainer(spec),
        # to the JobSet Trainer creates; not the Kueue label (Kueue would then
        # manage that JobSet too)
        "labels": names.labels({**spec.labels, JOB_LABEL: job}),
    }
    if spec.annotations:
        body["annotations"] = dict(spec.annotations)
    body["podSpecOverrides"] = pod_overrides(spec)
    if objects.is_kueue(spec):
        body["suspend"] = True  # Kueue unsuspends it when the queue admits it
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": objects.metadata(spec, job),
            "spec": body,
        }
    ]
