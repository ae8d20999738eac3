"""The ``trainjob`` kind: a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``),
rendered for the Trainer release the cluster runs.

A TrainJob names a ClusterTrainingRuntime (``JobSpec.runtime``); Trainer turns both into a
JobSet whose replicated job ``node`` runs ``numNodes`` pods of the Indexed Job
``<job>-node-0``, pod hostnames ``<job>-node-0-<index>``, container ``node``.

**One API version, three shapes.** Every Trainer release serves ``v1alpha1``, but where a
TrainJob sets its pods' settings moved twice, and an API server prunes a field its CRD does
not know without a word (the pods would lose spot placement, service account and volumes):

- Trainer v2.0: ``spec.podSpecOverrides[]`` (``targetJobs`` plus pod fields, flat);
- v2.1: ``spec.podTemplateOverrides[]`` (``targetJobs``, ``metadata``, ``spec``), which adds
  ``affinity``, so every placement can be expressed;
- v2.2 and later: ``spec.runtimePatches[]``, keyed by ``manager``, each patching the
  runtime's JobSet template (``trainingRuntimeSpec.template.spec.replicatedJobs[]``); they add
  security contexts (v2.2) and ``terminationGracePeriodSeconds`` (v2.3), and drop
  ``spec.labels``/``spec.annotations``.

:class:`TrainJobApi` says what one release's schema allows; :func:`api_of` reads it from the
CRD a cluster serves (the backend does, once), so the TrainJob is rendered for that cluster;
without a cluster (a dry run, the check when a DAG is parsed) it is rendered for
:data:`CURRENT`. What a TrainJob sets, as the other kinds do: image, command (an argument
list), node count, processes per node, resources (GPU requests = limits), env with Secret key
references, the ``/dev/shm`` and cache volumes, tolerations, service account, placement,
labels, Kueue suspension; and, where the release allows, the non-root security contexts and
the grace period.

Rendezvous: the runtime's Torch plugin sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK`` (the completion index), ``PET_MASTER_ADDR`` (``<job>-node-0-0.<job>``) and
``PET_MASTER_PORT`` (29500), which torchrun reads as its flags; the command is our torchrun
without the c10d flags (``pod.static_command``), keeping ``--shutdown-timeout``, with
``--max-restarts=0``: torchrun's static rendezvous cannot restart one node's workers in place
with the others', so a TrainJob's failures relaunch the whole gang whatever
``restarts_in_place`` says. It is split into ``command`` (the interpreter) and
``args`` (the rest), so a runtime's own ``args`` can never be appended to it.

What a release's schema cannot say, and how each is handled:

- placement without ``affinity`` (v2.0): a ``nodeSelector`` (``placement.node_selector``),
  which raises JobSpecError for ``spot_flavour: auto``, on-demand on GKE or AKS, and
  ``affinity``.
- whole-Secret ``envFrom``: no release's container patch has it; JobSpecError (name each key:
  ``{"env", "secret", "key"}`` entries go in ``trainer.env`` as ``secretKeyRef``).
- ``schedulerName``, ``priorityClassName``: JobSpecError for ``volcano`` schedulers and
  ``priority_class`` (gang scheduling and priority belong in the runtime, or use Kueue).
- ``terminationGracePeriodSeconds`` before v2.3: the pods get the runtime's.
  ``termination_grace_seconds`` must state it (torchrun's shutdown timeout is sized from it);
  with the stock ``torch-distributed`` runtime, which sets none (Kubernetes' 30 s), a larger
  value is a JobSpecError.
- pod labels: ``spec.labels`` reach the JobSet (v2.0, v2.1), and the pod template's metadata
  the pods (v2.1 and later); the pods are selected by their JobSet's labels either way
  (``pod_selector``).
- security contexts before v2.2, ``restartPolicy``, the Job's
  ``backoffLimit``/``podFailurePolicy``, ``enableServiceLinks``,
  ``automountServiceAccountToken``: the runtime's pod and Job templates decide (documented in
  docs/kubernetes.md; the stock runtime sets none of them).
- ``ttlSecondsAfterFinished``: the TrainJob has none, so ``ttl_seconds_after_finished`` is a
  JobSpecError (a kept TrainJob stays until deleted; the training operator deletes finished
  attempts itself unless told to keep them).
- env on the ``node`` container patch is refused by Trainer's webhook, so variables go in
  ``trainer.env`` (which keeps ``valueFrom``); names starting ``PET_`` are Trainer's own and
  a JobSpecError.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainops.cluster.kubernetes import crd_schema, names, objects, placement, pod
from trainops.cluster.kubernetes.objects import JOB_LABEL, Json
from trainops.cluster.spec import JobSpec, JobSpecError

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
API_VERSION, KIND = f"{GROUP}/{VERSION}", "TrainJob"
CRD_NAME = f"{PLURAL}.{GROUP}"
NODE = "node"  # the runtime's replicated job and container that run the trainer
STOCK_RUNTIME = "torch-distributed"  # Trainer's own; its pod template sets no grace period
DEFAULT_GRACE_SECONDS = 30  # Kubernetes' default terminationGracePeriodSeconds
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on every pod; the JobSet's name is ours
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESERVED_ENV_PREFIX = "PET_"
MANAGER = "trainops/launcher"  # our runtimePatches entry's owner

# Where each shape keeps the pod spec fields, from the TrainJob's root.
POD_PATHS: dict[str, list[str]] = {
    "podSpecOverrides": ["spec", "podSpecOverrides"],
    "podTemplateOverrides": ["spec", "podTemplateOverrides", "spec"],
    "runtimePatches": [
        "spec",
        "runtimePatches",
        *("trainingRuntimeSpec", "template", "spec", "replicatedJobs"),
        *("template", "spec", "template", "spec"),
    ],
}
# ... and the pods' metadata (labels, annotations), where the shape has it.
POD_METADATA_PATHS: dict[str, list[str]] = {
    "podTemplateOverrides": ["spec", "podTemplateOverrides", "metadata"],
    "runtimePatches": [*POD_PATHS["runtimePatches"][:-1], "metadata"],
}
SHAPES = tuple(POD_PATHS)  # newest last


@dataclass(frozen=True)
class TrainJobApi:
    """What a Trainer release's TrainJob schema lets a TrainJob set (:func:`api_of`).

    :param overrides: where the pods' settings go: ``podSpecOverrides``,
        ``podTemplateOverrides`` or ``runtimePatches``.
    :param pod_fields: the pod spec fields those settings may hold.
    :param container_fields: the fields of a container's entry in them.
    :param spec_fields: the TrainJob's own ``spec`` fields.
    :param pod_metadata: the pods' labels and annotations can be set.
    :param release: how messages name it (``Trainer v2.3``; ``the cluster's Trainer``).
    """

    overrides: str
    pod_fields: frozenset[str]
    container_fields: frozenset[str]
    spec_fields: frozenset[str]
    pod_metadata: bool
    release: str = "the cluster's Trainer"


_BASE_SPEC = frozenset({"runtimeRef", "trainer", "initializer", "suspend", "managedBy"})
_BASE_POD = frozenset(
    {"containers", "initContainers", "volumes", "nodeSelector", "tolerations", "serviceAccountName"}
)
TRAINER_V2_0 = TrainJobApi(
    "podSpecOverrides",
    _BASE_POD | {"schedulingGates"},
    frozenset({"name", "env", "volumeMounts"}),
    _BASE_SPEC | {"labels", "annotations", "podSpecOverrides"},
    pod_metadata=False,
    release="Trainer v2.0",
)
TRAINER_V2_1 = TrainJobApi(
    "podTemplateOverrides",
    _BASE_POD | {"affinity", "imagePullSecrets", "schedulingGates"},
    frozenset({"name", "env", "volumeMounts"}),
    _BASE_SPEC | {"labels", "annotations", "podTemplateOverrides"},
    pod_metadata=True,
    release="Trainer v2.1",
)
TRAINER_V2_3 = TrainJobApi(
    "runtimePatches",
    TRAINER_V2_1.pod_fields | {"securityContext", "terminationGracePeriodSeconds"},
    frozenset({"name", "env", "volumeMounts", "securityContext"}),
    _BASE_SPEC | {"runtimePatches", "activeDeadlineSeconds"},
    pod_metadata=True,
    release="Trainer v2.3",
)
CURRENT = TRAINER_V2_3  # what a TrainJob is rendered for when no cluster says otherwise


def api_of(schema: Json, release: str = "the cluster's Trainer") -> TrainJobApi:
    """What the TrainJob schema ``schema`` (a CRD version's ``openAPIV3Schema``) lets a
    TrainJob set. Raises JobSpecError when it has none of the known places for pod settings
    (a Trainer this code does not know: pin a supported release, or upgrade trainops)."""
    spec_fields = crd_schema.properties_at(schema, ["spec"])
    for shape in reversed(SHAPES):
        if shape in spec_fields:
            pod_fields = crd_schema.properties_at(schema, POD_PATHS[shape]) - {"targetJobs"}
            meta = POD_METADATA_PATHS.get(shape)
            return TrainJobApi(
                overrides=shape,
                pod_fields=frozenset(pod_fields),
                container_fields=crd_schema.properties_at(schema, [*POD_PATHS[shape], "containers"]),
                spec_fields=spec_fields,
                pod_metadata=bool(meta) and "labels" in crd_schema.properties_at(schema, meta or []),
                release=release,
            )
    raise JobSpecError(
        f"the TrainJob CRD ({CRD_NAME}) of {release} has none of {', '.join(SHAPES)} in its "
        f"spec (it has: {', '.join(sorted(spec_fields)) or 'nothing'}): trainops cannot place "
        "its pods on this Trainer release; install Kubeflow Trainer v2.0 or later, or use kind "
        "'indexed-job'"
    )


def pod_selector(job: str) -> dict[str, str]:
    """The labels of a TrainJob's trainer pods (JobSet sets them on every release)."""
    return {JOBSET_NAME_LABEL: job, JOBSET_REPLICATED_JOB_LABEL: NODE}


def check(spec: JobSpec, api: TrainJobApi = CURRENT) -> None:
    """Raise JobSpecError for what a TrainJob on ``api`` cannot carry, naming the field."""
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
    if (
        "terminationGracePeriodSeconds" not in api.pod_fields
        and spec.runtime == STOCK_RUNTIME
        and spec.termination_grace_seconds > DEFAULT_GRACE_SECONDS
    ):
        raise JobSpecError(
            f"JobSpec termination_grace_seconds {spec.termination_grace_seconds} cannot be "
            f"honoured by kind 'trainjob' with runtime {STOCK_RUNTIME!r} on {api.release}: its "
            "TrainJob cannot set terminationGracePeriodSeconds (Trainer v2.3 can), and that "
            f"runtime leaves Kubernetes' default ({DEFAULT_GRACE_SECONDS} s); set "
            f"termination_grace_seconds <= {DEFAULT_GRACE_SECONDS}, or name a "
            "ClusterTrainingRuntime of yours (runtime) whose pod template sets "
            "terminationGracePeriodSeconds to it"
        )
    if spec.ttl_seconds_after_finished is not None:
        raise JobSpecError(
            f"JobSpec ttl_seconds_after_finished {spec.ttl_seconds_after_finished} cannot be set for "
            "kind 'trainjob': a TrainJob has no ttlSecondsAfterFinished; leave it None (delete "
            "the TrainJob, or let its runtime's JobSet template set a TTL)"
        )
    whole = [r for r in spec.env_from_secrets if isinstance(r, str)]
    if whole and "envFrom" not in api.container_fields:
        raise JobSpecError(
            f"JobSpec env_from_secrets {whole[0]!r} (a whole Secret) cannot be used with kind "
            f"'trainjob' on {api.release}: a TrainJob's container patch has no envFrom; name "
            f'each key instead, {{"env": "AWS_ACCESS_KEY_ID", "secret": {whole[0]!r}, "key": '
            '"AWS_ACCESS_KEY_ID"}, or give the pods a cloud identity (service_account)'
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


def pod_settings(spec: JobSpec, api: TrainJobApi = CURRENT) -> Json:
    """The pod spec fields the TrainJob sets on the ``node`` job's pods: volumes and their
    mounts, placement (affinity where ``api`` has it, else a nodeSelector), tolerations,
    service account, and the security contexts and grace period where ``api`` has them."""
    container: Json = {"name": NODE, "volumeMounts": pod.volume_mounts()}
    secrets = pod.env_from(spec)
    if secrets:  # check() refused them where the API has no envFrom
        container["envFrom"] = secrets
    if "securityContext" in api.container_fields:
        container["securityContext"] = pod.container_security()
    out: Json = {"containers": [container], "volumes": pod.volumes(spec)}
    if "affinity" in api.pod_fields:
        out["affinity"] = placement.affinity(spec)
    else:
        out["nodeSelector"] = placement.node_selector(spec, "trainjob")
    tolerations = placement.tolerations(spec)
    if tolerations:
        out["tolerations"] = tolerations
    if spec.service_account:
        out["serviceAccountName"] = spec.service_account
    if "securityContext" in api.pod_fields:
        out["securityContext"] = pod.pod_security()
    if "terminationGracePeriodSeconds" in api.pod_fields:
        out["terminationGracePeriodSeconds"] = spec.termination_grace_seconds
    return out


def pod_overrides(spec: JobSpec, job: str, api: TrainJobApi = CURRENT) -> list[Json]:
    """The value of ``spec.<api.overrides>``: :func:`pod_settings` for the ``node`` job, in
    that release's shape, with the pods' labels where it can set them."""
    settings = pod_settings(spec, api)
    meta = pod.pod_metadata(spec, {JOB_LABEL: job})
    if api.overrides == "podSpecOverrides":
        return [{"targetJobs": [{"name": NODE}], **settings}]
    if api.overrides == "podTemplateOverrides":
        return [{"targetJobs": [{"name": NODE}], "metadata": meta, "spec": settings}]
    template: Json = {"metadata": meta, "spec": settings}
    return [
        {
            "manager": MANAGER,
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": template}}}]}
                }
            },
        }
    ]


def manifests(spec: JobSpec, api: TrainJobApi = CURRENT) -> list[Json]:
    """One TrainJob, for the Trainer release ``api`` describes. Raises JobSpecError naming a
    field the TrainJob cannot carry there."""
    check(spec, api)
    pod.check_env(spec)
    job = names.job_name(spec)
    body: Json = {
        "runtimeRef": {"name": spec.runtime, "apiGroup": GROUP, "kind": "ClusterTrainingRuntime"},
        "trainer": trainer(spec),
    }
    if "labels" in api.spec_fields:
        # to the JobSet Trainer creates; not the Kueue label (Kueue would then
        # manage that JobSet too)
        body["labels"] = names.labels({**spec.labels, JOB_LABEL: job})
        if spec.annotations:
            body["annotations"] = dict(spec.annotations)
    body[api.overrides] = pod_overrides(spec, job, api)
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
