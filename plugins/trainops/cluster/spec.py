"""JobSpec: what to run, on how many nodes, with what resources. Plain data with a JSON form.

Every backend takes the same JobSpec. The local backend uses the fields that mean something on
one host (args, nodes, gpus_per_node, env, termination_grace_seconds, distributed); the
Kubernetes backend (:mod:`trainops.cluster.kubernetes`) turns the rest into manifests.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

CAPACITIES = ("spot", "on-demand", "spot-then-on-demand")
SPOT_PROVIDERS = ("karpenter", "eks", "gke", "aks")  # each labels its spot nodes its own way
SPOT_FLAVOURS = (*SPOT_PROVIDERS, "auto")  # auto: any provider's spot nodes
KINDS = ("pytorchjob", "indexed-job", "trainjob")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SCHEDULER = re.compile(r"^(default|volcano|volcano:[a-z0-9][-a-z0-9.]*|kueue:[a-z0-9][-a-z0-9.]*)$")


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
        region (``AWS_REGION``). Never credentials: the Kubernetes backend rejects names such as
        ``AWS_SECRET_ACCESS_KEY`` or ``*_TOKEN``; use ``env_from_secrets``.
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

    def __post_init__(self) -> None:
        validate(self)

    @property
    def procs_per_node(self) -> int:
        """Processes per node: one per GPU, or one CPU process."""
        return max(1, self.gpus_per_node)

    @property
    def shutdown_timeout_s(self) -> int:
        """torchrun's SIGTERM->SIGKILL wait: inside the grace period, with room to exit."""
        return max(1, self.termination_grace_seconds - min(10, self.termination_grace_seconds // 4))

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


def validate(spec: JobSpec) -> None:
    """Raise JobSpecError naming the first field no backend can run, and what to use."""
    if not _NAME.match(spec.name):
        raise JobSpecError(
            f"JobSpec name {spec.name!r} is not a DNS-1123 label: use lowercase letters, digits and '-'"
        )
    if not spec.args or not all(isinstance(a, str) for a in spec.args):
        raise JobSpecError(f"JobSpec args must be a non-empty list of strings, got {spec.args!r}")
    if not isinstance(spec.nodes, int) or spec.nodes < 1:
        raise JobSpecError(f"JobSpec nodes must be an integer >= 1, got {spec.nodes!r}")
    if not isinstance(spec.gpus_per_node, int) or spec.gpus_per_node < 0:
        raise JobSpecError(f"JobSpec gpus_per_node must be an integer >= 0, got {spec.gpus_per_node!r}")
    if spec.capacity not in CAPACITIES:
        raise JobSpecError(f"JobSpec capacity {spec.capacity!r} is not one of {CAPACITIES}")
    if spec.spot_flavour not in SPOT_FLAVOURS:
        raise JobSpecError(f"JobSpec spot_flavour {spec.spot_flavour!r} is not one of {SPOT_FLAVOURS}")
    if spec.kind not in KINDS:
        raise JobSpecError(f"JobSpec kind {spec.kind!r} is not one of {KINDS}")
    if not _SCHEDULER.match(spec.scheduler):
        raise JobSpecError(
            f"JobSpec scheduler {spec.scheduler!r}: use 'default', 'volcano', "
            "'volcano:<queue>' or 'kueue:<queue>' (queue: a DNS-1123 name)"
        )
    if spec.termination_grace_seconds < 1:
        raise JobSpecError(
            f"JobSpec termination_grace_seconds must be >= 1, got {spec.termination_grace_seconds}"
        )
    for key, value in {**spec.env, **spec.nccl_env}.items():
        if not isinstance(value, str):
            raise JobSpecError(f"JobSpec env {key!r} must be a string, got {value!r}")
    if not _SUBDOMAIN.match(spec.cluster_domain):
        raise JobSpecError(
            f"JobSpec cluster_domain {spec.cluster_domain!r} is not a DNS name "
            "(the default is 'cluster.local')"
        )
    if not isinstance(spec.runtime, str) or not _SUBDOMAIN.match(spec.runtime):
        raise JobSpecError(
            f"JobSpec runtime {spec.runtime!r} is not a DNS-1123 name (the "
            "ClusterTrainingRuntime of a trainjob; default 'torch-distributed')"
        )
    for ref in spec.env_from_secrets:
        _check_secret_ref(ref)


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
