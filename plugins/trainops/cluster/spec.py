"""JobSpec: what to run, on how many nodes, with what resources. Plain data with a JSON form.

Every backend takes the same JobSpec. The local backend uses the fields that mean something on
one host (args, nodes, gpus_per_node, env, termination_grace_seconds, distributed,
restarts_in_place); the
Kubernetes backend (:mod:`trainops.cluster.kubernetes`) turns the rest into manifests.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

CAPACITIES = ("spot", "on-demand", "spot-then-on-demand")
SPOT_PROVIDERS = ("karpenter", "eks", "gke", "aks")  # each labels its spot nodes its own way
SPOT_FLAVOURS = (*SPOT_PROVIDERS, "auto")  # auto: any provider's spot nodes
KINDS = ("pytorchjob", "indexed-job", "trainjob")
TTL_KINDS = ("pytorchjob", "indexed-job")  # the kinds with a ttlSecondsAfterFinished
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SCHEDULER = re.compile(r"^(default|volcano|volcano:[a-z0-9][-a-z0-9.]*|kueue:[a-z0-9][-a-z0-9.]*)$")
# A Kubernetes quantity without a sign (so never negative): a number, then a binary or decimal
# SI suffix or an exponent (k8s.io/apimachinery/pkg/api/resource).
_QUANTITY = re.compile(r"^\+?(?P<number>\d+(\.\d*)?|\.\d+)(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][-+]?\d+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
QUANTITY_EXAMPLES = {
    "cpu": "'8' or '500m'",
    "memory": "'64Gi'",
    "shm_size": "'1Gi'",
    "cache_size": "'200Gi'",
    "ephemeral_storage": "'220Gi'",
}
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
# torchrun's restarts of a node's workers in place: past a few, the failure is not passing and a
# whole-gang relaunch (on other nodes, against the operator's budgets) is the better next step.
MAX_RESTARTS_IN_PLACE = 10


class JobSpecError(ValueError):
    """A JobSpec field holds a value no backend can run."""


class SecretKeyRef(TypedDict):
    """One variable from one key of a Secret (``valueFrom.secretKeyRef``)."""

    env: str
    secret: str
    key: str


@dataclass
class JobSpec:
    """One training (or evaluation) job: N nodes x G processes running ``args``.

    :param name: DNS-1123 label; the operator builds ``train-<8 hex>-a<attempt>``. Kubernetes
        objects are named after it (see ``kubernetes.names.job_name``: shortened with a hash
        suffix when the pod names Kubernetes derives from it would be too long).
    :param args: the trainer command line, ``python -m trainer ...`` as an argument list
        (``trainer.contract.trainer_argv``); never a shell string.
    :param nodes: number of nodes (pods); each runs one torchrun agent.
    :param gpus_per_node: GPUs per node (``nvidia.com/gpu``, requests = limits); 0 means one
        CPU process per node.
    :param distributed: wrap ``args`` in torchrun (training); False runs it as one plain process.
    :param image: container image holding the trainer; it runs as uid 10001 (non-root).
    :param namespace: Kubernetes namespace of the job, its pods and its Service.
    :param cpu: CPU request per pod (a Kubernetes quantity such as ``"8"`` or ``"500m"``).
    :param memory: memory request and limit per pod (a quantity such as ``"64Gi"``).
    :param env: plain environment variables, e.g. the S3 endpoint (``AWS_ENDPOINT_URL_S3``) and
        region (``AWS_REGION``). Never credentials: the Kubernetes backend rejects a variable
        whose name (``AWS_SECRET_ACCESS_KEY``, ``DB_PASS``, ``*_TOKEN``) or value (a URL with
        a password, a token in a well-known format) looks like one
        (:mod:`trainops.cluster.credentials`), naming it; use ``env_from_secrets``.
    :param env_from_secrets: credentials by Secret reference. Each entry is either a Secret
        name (every key becomes a variable, ``envFrom.secretRef``) or
        ``{"env": NAME, "secret": SECRET, "key": KEY}`` (one variable, ``secretKeyRef``).
    :param service_account: Kubernetes service account of the pods; the way to IRSA (EKS) or
        workload identity (GKE, AKS) credentials. None: the namespace's default.
    :param labels: labels on the job and its pods (values are shortened to 63 characters with
        a hash suffix when longer, see ``kubernetes.names.label_value``). ``trainjob``: on the
        TrainJob and the JobSet Trainer derives from it, not on the pods (its schema has no
        pod labels).
    :param annotations: annotations on the job and its pods (``trainjob``: as for labels).
    :param node_selector: node labels every pod requires; ANDed into each node affinity term.
    :param tolerations: extra pod tolerations (Kubernetes form), added to the spot ones.
    :param affinity: extra pod affinity (Kubernetes form). Its required node selector terms are
        ANDed with the placement terms; everything else is kept as given.
    :param avoid_nodes: Node names no pod may run on (``metadata.name NotIn``, ANDed into each
        node affinity term): the nodes earlier attempts failed on for the node's sake
        (:mod:`trainops.recovery.bad_nodes`). Kinds placed by a nodeSelector alone (a TrainJob
        on Kubeflow Trainer v2.0) cannot exclude a node and ignore it.
    :param capacity: ``spot``, ``on-demand`` or ``spot-then-on-demand`` (starts as spot; the
        operator switches the JobSpec to on-demand after repeated preemptions).
    :param spot_flavour: which provider's spot labels to target: ``karpenter``, ``eks``,
        ``gke``, ``aks`` or ``auto`` (any of them). On-demand excludes the same labels.
    :param scheduler: ``default``, ``volcano``, ``volcano:<queue>`` (gang scheduling) or
        ``kueue:<queue>`` (the job is created suspended in that Kueue LocalQueue).
        ``trainjob`` takes ``default`` or ``kueue:<queue>``: gang scheduling belongs in its
        runtime.
    :param priority_class: Kubernetes PriorityClass of the pods (and of the Volcano gang).
    :param shm_size: size of the memory-backed ``/dev/shm`` (NCCL and data loader workers).
    :param termination_grace_seconds: time between SIGTERM and SIGKILL; the trainer's
        emergency-checkpoint budget. torchrun's shutdown timeout is set to fit inside it.
        ``trainjob`` cannot set it: the pods get the runtime's grace period, and this field
        must say what that is (at most 30, Kubernetes' default, with ``torch-distributed``).
    :param nccl_env: NCCL tuning variables (``NCCL_*``, ``TORCH_NCCL_*``) passed to every pod.
    :param kind: ``indexed-job`` (a batch/v1 Indexed Job + headless Service; no operator
        needed), ``pytorchjob`` (Kubeflow Training Operator v1) or ``trainjob`` (Kubeflow
        Trainer v2, ``kubernetes.trainjob``: placement by nodeSelector only, and the runtime's pod
        template supplies grace period, security context and restart policy).
    :param cluster_domain: the cluster's DNS domain; the Indexed Job's rendezvous address is
        ``<job>-0.<service>.<namespace>.svc.<cluster_domain>``.
    :param runtime: ``trainjob`` only: the ClusterTrainingRuntime the TrainJob names
        (``runtimeRef``); its ``node`` job and container run the trainer.
    :param cache_size: ``sizeLimit`` of the node-local cache volume (shard cache, checkpoint
        staging; a quantity such as ``"200Gi"``). None: no limit, so a full cache fills the
        node's disk and the kubelet evicts whatever it picks. The training operator sizes it
        from the checkpoint and the dataset (``trainops.operators.sizing``).
    :param ephemeral_storage: the pod's ``ephemeral-storage`` request, so the scheduler puts
        it on a node with that much local disk. None: ``cache_size`` (no request without it).
    :param ttl_seconds_after_finished: seconds after it finished before Kubernetes deletes the
        job object (``ttlSecondsAfterFinished`` of a Job, a PyTorchJob's run policy; a
        TrainJob has none: its runtime's JobSet template may set one). None: never; the
        training operator deletes finished attempts itself unless ``keep_finished_jobs``.
    :param restarts_in_place: torchrun's ``--max-restarts`` (``distributed`` jobs), 0 to
        :data:`MAX_RESTARTS_IN_PLACE`: how often a node's agent restarts its worker processes in
        the same pod after one of them died or raised; the gang re-forms and resumes from the
        newest checkpoint (from the node-local tier where the node holds it). Once they are
        spent torchrun exits and the operator relaunches the whole gang. 0: every failure is a
        whole-gang relaunch.
    """

    name: str
    args: list[str]
    nodes: int = 1
    gpus_per_node: int = 0
    distributed: bool = True
    image: str = "trainops-trainer:latest"
    namespace: str = "default"
    cpu: str = "1"
    memory: str = "4Gi"
    env: dict[str, str] = field(default_factory=dict)
    env_from_secrets: list[str | SecretKeyRef] = field(default_factory=list)
    service_account: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] | None = None
    avoid_nodes: list[str] = field(default_factory=list)
    capacity: str = "spot"
    spot_flavour: str = "auto"
    scheduler: str = "default"
    priority_class: str | None = None
    shm_size: str = "1Gi"
    termination_grace_seconds: int = 60
    nccl_env: dict[str, str] = field(default_factory=dict)
    kind: str = "indexed-job"
    cluster_domain: str = "cluster.local"
    runtime: str = "torch-distributed"
    cache_size: str | None = None
    ephemeral_storage: str | None = None
    ttl_seconds_after_finished: int | None = None
    restarts_in_place: int = 0

    def __post_init__(self) -> None:
        validate(self)

    @property
    def procs_per_node(self) -> int:
        """Processes per node: one per GPU, or one CPU process."""
        return max(1, self.gpus_per_node)

    @property
    def shutdown_timeout_s(self) -> int:
        """torchrun's SIGTERM->SIGKILL wait: inside the grace period, with room to exit."""
        return shutdown_timeout(self.termination_grace_seconds)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``spec.json``, ``job.json``); :meth:`from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The JobSpec of a JSON form; JobSpecError names a field JobSpec does not have."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobSpecError(f"unknown JobSpec field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)


def shutdown_timeout(grace_seconds: int) -> int:
    """torchrun's SIGTERM->SIGKILL wait for a grace period of ``grace_seconds``: the grace
    less a quarter of it (at most 10 s less), so the workers are killed before the pod is.
    It is what an emergency checkpoint really has."""
    return max(1, grace_seconds - min(10, grace_seconds // 4))


def validate(spec: JobSpec) -> None:
    """Raise JobSpecError naming the first field no backend can run, and what to use."""
    _check_workload(spec)
    _check_resources(spec)
    _check_pod(spec)


def _check_workload(spec: JobSpec) -> None:
    """The job's name, command, shape and image."""
    if not isinstance(spec.name, str) or not _NAME.match(spec.name):
        raise JobSpecError(
            f"JobSpec name {spec.name!r} is not a DNS-1123 label: use lowercase letters, digits and '-'"
        )
    if not isinstance(spec.args, list) or not spec.args or not all(isinstance(a, str) for a in spec.args):
        raise JobSpecError(f"JobSpec args must be a non-empty list of strings, got {spec.args!r}")
    if not _is_int(spec.nodes) or spec.nodes < 1:
        raise JobSpecError(f"JobSpec nodes must be an integer >= 1, got {spec.nodes!r}")
    if not _is_int(spec.gpus_per_node) or spec.gpus_per_node < 0:
        raise JobSpecError(f"JobSpec gpus_per_node must be an integer >= 0, got {spec.gpus_per_node!r}")
    if not isinstance(spec.distributed, bool):
        raise JobSpecError(f"JobSpec distributed must be true or false, got {spec.distributed!r}")
    if not _is_int(spec.restarts_in_place) or not 0 <= spec.restarts_in_place <= MAX_RESTARTS_IN_PLACE:
        raise JobSpecError(
            f"JobSpec restarts_in_place must be an integer from 0 to {MAX_RESTARTS_IN_PLACE}, got "
            f"{spec.restarts_in_place!r}: use 0 (every failure relaunches the whole gang) or a few, "
            "such as 2"
        )
    if not isinstance(spec.image, str) or not spec.image or any(c.isspace() for c in spec.image):
        raise JobSpecError(
            f"JobSpec image {spec.image!r} is not an image reference: use one such as 'trainops-trainer:latest'"
        )
    if not isinstance(spec.namespace, str) or not _NAME.match(spec.namespace):
        raise JobSpecError(
            f"JobSpec namespace {spec.namespace!r} is not a DNS-1123 label: use lowercase letters, digits and '-'"
        )


def _check_resources(spec: JobSpec) -> None:
    """Quantities, lifetimes and the choices among capacities, kinds and schedulers."""
    for name in ("cpu", "memory", "shm_size"):
        _check_quantity(name, getattr(spec, name))
    for name in ("cache_size", "ephemeral_storage"):
        if getattr(spec, name) is not None:
            _check_quantity(name, getattr(spec, name))
    ttl = spec.ttl_seconds_after_finished
    if ttl is not None and (not _is_int(ttl) or ttl < 0):
        raise JobSpecError(
            f"JobSpec ttl_seconds_after_finished must be None or an integer >= 0 (seconds), got {ttl!r}"
        )
    if spec.capacity not in CAPACITIES:
        raise JobSpecError(f"JobSpec capacity {spec.capacity!r} is not one of {CAPACITIES}")
    if spec.spot_flavour not in SPOT_FLAVOURS:
        raise JobSpecError(f"JobSpec spot_flavour {spec.spot_flavour!r} is not one of {SPOT_FLAVOURS}")
    if spec.kind not in KINDS:
        raise JobSpecError(f"JobSpec kind {spec.kind!r} is not one of {KINDS}")
    if not isinstance(spec.scheduler, str) or not _SCHEDULER.match(spec.scheduler):
        raise JobSpecError(
            f"JobSpec scheduler {spec.scheduler!r}: use 'default', 'volcano', "
            "'volcano:<queue>' or 'kueue:<queue>' (queue: a DNS-1123 name)"
        )
    if not _is_int(spec.termination_grace_seconds) or spec.termination_grace_seconds < 1:
        raise JobSpecError(
            f"JobSpec termination_grace_seconds must be an integer >= 1, got {spec.termination_grace_seconds!r}"
        )


def _check_pod(spec: JobSpec) -> None:
    """What goes into the pods: environment, metadata, placement, names and Secrets."""
    for source in ("env", "nccl_env"):
        _check_env(source, getattr(spec, source))
    for source in ("labels", "annotations", "node_selector"):
        _check_string_map(source, getattr(spec, source))
    for source in ("service_account", "priority_class"):
        value = getattr(spec, source)
        if value is not None and (not isinstance(value, str) or not _SUBDOMAIN.match(value)):
            raise JobSpecError(
                f"JobSpec {source} {value!r} is not a DNS-1123 name: use None or a name such as 'trainer'"
            )
    _check_tolerations(spec.tolerations)
    if not isinstance(spec.avoid_nodes, list) or not all(
        isinstance(n, str) and _SUBDOMAIN.match(n) for n in spec.avoid_nodes
    ):
        raise JobSpecError(
            f"JobSpec avoid_nodes {spec.avoid_nodes!r}: use a list of Node names such as ['ip-10-0-1-2.ec2.internal']"
        )
    if spec.affinity is not None and (
        not isinstance(spec.affinity, dict) or not set(spec.affinity) <= set(AFFINITY_KEYS)
    ):
        raise JobSpecError(
            f"JobSpec affinity {spec.affinity!r}: use None or a Kubernetes affinity, a dict of "
            f"{', '.join(AFFINITY_KEYS)}"
        )
    if not isinstance(spec.cluster_domain, str) or not _SUBDOMAIN.match(spec.cluster_domain):
        raise JobSpecError(
            f"JobSpec cluster_domain {spec.cluster_domain!r} is not a DNS name "
            "(the default is 'cluster.local')"
        )
    if not isinstance(spec.runtime, str) or not _SUBDOMAIN.match(spec.runtime):
        raise JobSpecError(
            f"JobSpec runtime {spec.runtime!r} is not a DNS-1123 name (the "
            "ClusterTrainingRuntime of a trainjob; default 'torch-distributed')"
        )
    if not isinstance(spec.env_from_secrets, list):
        raise JobSpecError(
            f"JobSpec env_from_secrets must be a list of Secret names or references, got {spec.env_from_secrets!r}"
        )
    for ref in spec.env_from_secrets:
        _check_secret_ref(ref)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def quantity_problem(value: object) -> str | None:
    """Why ``value`` is not a positive Kubernetes quantity (``"8"``, ``"500m"``, ``"64Gi"``,
    or a positive number), or None when it is one."""
    if isinstance(value, str):
        match = _QUANTITY.match(value.strip())
        if match is None:
            return "negative" if value.strip().startswith("-") else "not a Kubernetes quantity"
        number = float(match["number"])
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        return "not a quantity"
    return None if math.isfinite(number) and number > 0 else "not a positive number"


def _check_quantity(name: str, value: object) -> None:
    problem = quantity_problem(value)
    if problem:
        raise JobSpecError(
            f"JobSpec {name} {value!r} is not a positive Kubernetes quantity ({problem}): use a number "
            f"with an optional suffix such as {QUANTITY_EXAMPLES[name]}"
        )


def _check_env(source: str, env: object) -> None:
    if not isinstance(env, dict):
        raise JobSpecError(f"JobSpec {source} must be a dict of variable names to strings, got {env!r}")
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise JobSpecError(
                f"JobSpec {source} name {key!r} is not a valid variable name: use letters, digits and '_'"
            )
        if not isinstance(value, str):
            raise JobSpecError(f"JobSpec {source} {key!r} must be a string, got {value!r}")


def _check_string_map(source: str, values: object) -> None:
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in values.items()
    ):
        raise JobSpecError(f"JobSpec {source} must be a dict of strings to strings, got {values!r}")


def _check_tolerations(tolerations: object) -> None:
    if not isinstance(tolerations, list):
        raise JobSpecError(
            f"JobSpec tolerations must be a list of Kubernetes tolerations, got {tolerations!r}"
        )
    for toleration in tolerations:
        if (
            not isinstance(toleration, dict)
            or not set(toleration) <= set(TOLERATION_KEYS)
            or toleration.get("operator", "Equal") not in TOLERATION_OPERATORS
            or toleration.get("effect", "NoSchedule") not in (*TOLERATION_EFFECTS, "")
        ):
            raise JobSpecError(
                f"JobSpec toleration {toleration!r}: use a dict of {', '.join(TOLERATION_KEYS)} with operator "
                f"{' or '.join(TOLERATION_OPERATORS)} and effect {', '.join(TOLERATION_EFFECTS)}"
            )


def _check_secret_ref(ref: object) -> None:
    if isinstance(ref, str) and _SUBDOMAIN.match(ref):
        return
    if (
        isinstance(ref, dict)
        and set(ref) == {"env", "secret", "key"}
        and all(isinstance(v, str) and v for v in ref.values())
        and _SUBDOMAIN.match(ref["secret"])
    ):
        return
    raise JobSpecError(
        f"JobSpec env_from_secrets entry {ref!r}: use a Secret name, or "
        '{"env": NAME, "secret": SECRET_NAME, "key": KEY} for one key'
    )
