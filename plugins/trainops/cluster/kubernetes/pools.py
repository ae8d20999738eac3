"""Whether any node pool can hold one pod of a job, from the cluster's Node objects. Pure.

A request no node can satisfy leaves its pods Pending until ``unschedulable_deadline_s``
runs out, and a training task then burns its infrastructure retries on it. The backend
reads the nodes once before a launch and refuses such a request at once, naming the pools'
largest nodes (:func:`refusal`).

What the nodes can and cannot say, and so when this refuses:

- **Pools.** Nodes are grouped by their provider's pool label (Karpenter's NodePool, an EKS
  node group, a GKE node pool, an AKS agent pool; else the instance type), capacity type and
  instance type (:func:`pools`). A pool's size is its largest node's ``allocatable``.
- **Placement.** A pod fits a pool when the pool's labels can meet the pod's node affinity
  (spot or on-demand, as :mod:`.placement` renders it, with the JobSpec's ``node_selector`` and
  ``affinity``; ``spot-then-on-demand`` starts on spot), every taint its nodes carry is
  tolerated (:func:`.placement.tolerations`), and its largest node's allocatable cpu, memory,
  ephemeral storage and ``nvidia.com/gpu`` hold the pod's requests (:func:`.pod.resources`).
  Conditions that come and go (``node.kubernetes.io/not-ready``, a cordon, the autoscaler's
  scale-down marks) are not the pool's and are ignored.
- **A pool scaled to zero has no nodes, so it is not seen.** Idle GPU pools usually are. So
  the check never refuses when no node is visible at all, nor when no visible pool matches the
  pod's placement (the pool it targets may be at zero: the on-demand pool of a
  ``spot-then-on-demand`` fallback, the GPU pool of an idle cluster), nor a GPU pod when no
  matching pool has GPUs. It refuses only when pools that match the placement are visible and
  none is large enough: asking for ``cpu: "96"`` on 96-vCPU machines whose allocatable is
  95.69, or 900Gi on nodes of 640Gi.
- **Karpenter** picks each node's instance type for the pods pending at the time, among all
  its NodePool allows: the nodes it made so far say nothing of the next one. When any node is
  Karpenter's, this never refuses.
- **Node count** is never refused: a pool's autoscaler (or Karpenter) adds nodes on demand,
  and nothing in a Node says how many it may add. Only one pod's size is checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from trainops.cluster.kubernetes.nodes import capacity_type, instance_type
from trainops.cluster.kubernetes.placement import affinity, tolerations
from trainops.cluster.kubernetes.pod import resources
from trainops.cluster.spec import JobSpec

# The first of these labels a node carries names its pool.
POOL_LABELS = (
    "karpenter.sh/nodepool",
    "eks.amazonaws.com/nodegroup",
    "cloud.google.com/gke-nodepool",
    "kubernetes.azure.com/agentpool",
)
KARPENTER_LABEL = "karpenter.sh/nodepool"
GPU_RESOURCE = "nvidia.com/gpu"
# Taints that say what state a node is in, not what its pool admits.
TRANSIENT_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
TRANSIENT_TAINTS = (
    "ToBeDeletedByClusterAutoscaler",
    "DeletionCandidateOfClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "karpenter.sh/unregistered",
)
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only steers the scheduler

_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(\d+(\.\d*)?|\.\d+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][-+]?\d+)?$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}


def quantity(value: object) -> Decimal:
    """The value of a Kubernetes quantity (``"7910m"`` is 7.91, ``"30Gi"`` 32212254720,
    ``"1e3"`` 1000, ``"500M"`` 5e8; a plain number is itself), exactly. Used for the JobSpec's
    requests and the nodes' allocatable alike. ValueError names a value that is not one."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (such as '8', '500m' or '64Gi')")
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    try:
        return number * Decimal(f"1{suffix}") if suffix else number
    except InvalidOperation as exc:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from exc


def millicores(value: object) -> int:
    """CPU in millicores, rounded up as the API server does (``"7910m"`` -> 7910, ``"8"`` -> 8000)."""
    return math.ceil(quantity(value) * 1000)


def whole(value: object) -> int:
    """Bytes (or a count), rounded up (``"64Mi"`` -> 67108864)."""
    return math.ceil(quantity(value))


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Pool:
    """Nodes of one pool, capacity type and instance type, and the size of the largest.

    :param name: the provider's pool label (``karpenter.sh/nodepool``,
        ``eks.amazonaws.com/nodegroup``, ``cloud.google.com/gke-nodepool``,
        ``kubernetes.azure.com/agentpool``), else the instance type, else ``unlabelled``.
    :param capacity_type: ``spot``, ``on-demand`` or None (:func:`.nodes.capacity_type`).
    :param cpu_m: the largest node's allocatable CPU in millicores; ``memory``,
        ``ephemeral_storage`` in bytes; ``gpus`` its ``nvidia.com/gpu``.
    :param taints: the taints every node of the pool carries that keep pods off (transient
        ones left out).
    :param labels: each label key any node carries -> the values its nodes have (None: a node
        without it), so an expression matches when one of the pool's nodes can meet it.
    :param karpenter: the nodes are Karpenter's (their size says nothing of the next one's).
    """

    name: str
    capacity_type: str | None
    instance_type: str | None
    nodes: int
    ready: int
    cpu_m: int
    memory: int
    ephemeral_storage: int
    gpus: int
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, frozenset[str | None]] = field(default_factory=dict, hash=False, compare=False)
    karpenter: bool = False

    def describe(self) -> str:
        """``pool gpu-spot (spot, p4d.24xlarge): 8 GPUs, 95.69 CPUs, 1102Gi memory, ...``."""
        kind = ", ".join(k for k in (self.capacity_type or "capacity unknown", self.instance_type) if k)
        nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        return f"pool {self.name} ({kind}; {nodes}): {_size(self.gpus, self.cpu_m, self.memory, self.ephemeral_storage)}"


def _size(gpus: int, cpu_m: int, memory: int, disk: int | None) -> str:
    parts = [f"{gpus} GPU{'s' if gpus != 1 else ''}", f"{_cpus(cpu_m)} CPUs", f"{_bytes(memory)} memory"]
    if disk is not None:
        parts.append(f"{_bytes(disk)} disk")
    return ", ".join(parts)


def _cpus(cpu_m: int) -> str:
    return f"{cpu_m // 1000}" if cpu_m % 1000 == 0 else f"{cpu_m / 1000:.3f}".rstrip("0")


def _bytes(n: int) -> str:
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20)):
        if n >= size * (10 if unit == "Ti" else 1):  # 1102Gi reads better than 1.1Ti
            value = n / size
            return f"{value:.0f}{unit}" if value >= 100 or value == int(value) else f"{value:.1f}{unit}"
    return f"{n}B"


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def _allocatable(node: Mapping[str, Any], name: str, parse: Any) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(name)
    try:
        return int(parse(value)) if value is not None else 0
    except ValueError:
        return 0


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _taints(node: Mapping[str, Any]) -> set[Taint]:
    out = set()
    for t in (node.get("spec") or {}).get("taints") or []:
        key, effect = str(t.get("key") or ""), str(t.get("effect") or "")
        if (
            effect not in BLOCKING_EFFECTS
            or key in TRANSIENT_TAINTS
            or key.startswith(TRANSIENT_TAINT_PREFIXES)
        ):
            continue
        out.add(Taint(key, str(t.get("value") or ""), effect))
    return out


def pool_name(labels: Mapping[str, str]) -> str:
    """The node's pool: its provider's pool label, else its instance type, else ``unlabelled``."""
    for key in POOL_LABELS:
        if labels.get(key):
            return labels[key]
    return instance_type(labels) or "unlabelled"


def pools(nodes: Iterable[Mapping[str, Any]]) -> list[Pool]:
    """The pools of ``nodes`` (Node objects in the API's JSON form), sorted by name."""
    groups: dict[tuple[str, str | None, str | None], list[Mapping[str, Any]]] = {}
    for node in nodes:
        labels = _labels(node)
        key = (pool_name(labels), capacity_type(labels), instance_type(labels))
        groups.setdefault(key, []).append(node)
    return [_pool(key, members) for key, members in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def _pool(key: tuple[str, str | None, str | None], members: Sequence[Mapping[str, Any]]) -> Pool:
    def size(node: Mapping[str, Any]) -> tuple[int, int, int, int]:
        return (
            _allocatable(node, GPU_RESOURCE, whole),
            _allocatable(node, "cpu", millicores),
            _allocatable(node, "memory", whole),
            _allocatable(node, "ephemeral-storage", whole),
        )

    gpus, cpu_m, memory, disk = max(size(n) for n in members)
    every = [_labels(n) for n in members]
    labels = {k: frozenset(node.get(k) for node in every) for k in {k for node in every for k in node}}
    taints = set.intersection(*(_taints(n) for n in members))
    return Pool(
        name=key[0],
        capacity_type=key[1],
        instance_type=key[2],
        nodes=len(members),
        ready=sum(1 for n in members if _ready(n)),
        cpu_m=cpu_m,
        memory=memory,
        ephemeral_storage=disk,
        gpus=gpus,
        taints=tuple(sorted(taints, key=lambda t: (t.key, t.effect, t.value))),
        labels=labels,
        karpenter=any(KARPENTER_LABEL in node for node in every),
    )


# -- placement --------------------------------------------------------------------------


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, frozenset[str | None]]) -> bool:
    """Whether one of the pool's nodes can meet ``expression`` (a nodeSelectorRequirement)."""
    key, op, values = expression.get("key"), expression.get("operator"), list(expression.get("values") or [])
    have = labels.get(str(key), frozenset({None}))
    present = {v for v in have if v is not None}
    if op == "In":
        return bool(present & set(values))
    if op == "NotIn":
        return None in have or bool(present - set(values))
    if op == "Exists":
        return bool(present)
    if op == "DoesNotExist":
        return None in have
    if op in ("Gt", "Lt") and values:
        try:
            bound = int(values[0])
            return any((int(v) > bound) if op == "Gt" else (int(v) < bound) for v in present)
        except ValueError:
            return False
    return True  # an operator this does not know: do not refuse on it


def placement_matches(spec: JobSpec, pool: Pool) -> bool:
    """Whether the pod's required node affinity (placement, ``node_selector``, ``affinity``)
    can hold on one of ``pool``'s nodes. ``matchFields`` (node names) are not checked."""
    required = affinity(spec)["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(
        all(_expression_matches(e, pool.labels) for e in term.get("matchExpressions") or [])
        for term in required["nodeSelectorTerms"]
    )


def _tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.key
    return key == taint.key and str(toleration.get("value") or "") == taint.value


def tolerated(spec: JobSpec, pool: Pool) -> bool:
    """Whether the pod tolerates every taint of ``pool`` (:func:`.placement.tolerations`)."""
    ours = tolerations(spec)
    return all(any(_tolerates(t, taint) for t in ours) for taint in pool.taints)


# -- size -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One pod's requests: GPUs, CPU in millicores, memory and ephemeral storage in bytes."""

    gpus: int
    cpu_m: int
    memory: int
    ephemeral_storage: int

    def describe(self) -> str:
        disk = self.ephemeral_storage or None
        return _size(self.gpus, self.cpu_m, self.memory, disk)


def request(spec: JobSpec) -> Request:
    """One pod's requests, as :func:`.pod.resources` renders them."""
    asked = resources(spec)["requests"]
    return Request(
        gpus=whole(asked.get(GPU_RESOURCE, 0)),
        cpu_m=millicores(asked["cpu"]),
        memory=whole(asked["memory"]),
        ephemeral_storage=whole(asked.get("ephemeral-storage", 0)),
    )


def holds(pool: Pool, asked: Request) -> bool:
    """Whether ``pool``'s largest node has room for one pod asking ``asked``."""
    return (
        pool.gpus >= asked.gpus
        and pool.cpu_m >= asked.cpu_m
        and pool.memory >= asked.memory
        and pool.ephemeral_storage >= asked.ephemeral_storage
    )


def refusal(spec: JobSpec, found: Sequence[Pool]) -> str | None:
    """Why no pool can hold one pod of ``spec``, in one paragraph, or None when one can or
    when the nodes cannot tell (see the module's docstring: no node visible, Karpenter's,
    no visible pool the placement matches, a GPU pod and no matching pool with GPUs)."""
    if not found or any(p.karpenter for p in found):
        return None
    matching = [p for p in found if placement_matches(spec, p) and tolerated(spec, p)]
    asked = request(spec)
    if not matching or (asked.gpus and not any(p.gpus for p in matching)):
        return None  # the pool it targets may be scaled to zero
    if any(holds(p, asked) for p in matching):
        return None
    where = f"{spec.capacity} capacity" + (
        f", node_selector {spec.node_selector}" if spec.node_selector else ""
    )
    fits = {id(p) for p in matching}
    return (
        f"job {spec.name}: no node pool can hold one of its pods. One pod asks for {asked.describe()} "
        f"({where}); the largest node of each pool allows "
        + "; ".join(
            ("" if id(p) in fits else "[placement or taints do not match] ") + p.describe() for p in found
        )
        + ". Ask for less (job_options cpu, memory, ephemeral_storage, or fewer gpus_per_node), add a "
        "node pool with larger machines, or point the job at one with job_options node_selector and "
        "tolerations; a pool scaled to zero has no nodes to see, so name it in node_selector (such as "
        "{'cloud.google.com/gke-nodepool': 'big-pool'}) and the job is launched for it to scale up."
    )
