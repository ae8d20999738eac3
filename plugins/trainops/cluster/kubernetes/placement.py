"""Where a job's pods may run: node affinity and tolerations for spot or on-demand capacity.

No node carries every provider's spot label, so spot placement is a required node affinity
with one ORed term per provider flavour, never a nodeSelector holding all the labels.
On-demand placement is one term that matches no provider's spot nodes (``NotIn`` and
``DoesNotExist`` also match nodes without the label). The user's ``node_selector`` and
required affinity terms are ANDed into every term: (P1 or P2) and (U1 or U2) is the OR of
every Pi-and-Uj.
"""

from __future__ import annotations

import copy

from trainops.cluster.kubernetes.objects import Json
from trainops.cluster.spec import SPOT_PROVIDERS, JobSpec, JobSpecError

# Node labels each provider puts on its spot nodes.
SPOT_EXPRESSIONS: dict[str, Json] = {
    "karpenter": {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
    "eks": {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["SPOT"]},
    "gke": {"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]},
    "aks": {"key": "kubernetes.azure.com/scalesetpriority", "operator": "In", "values": ["spot"]},
}

# The negation of each, for on-demand. GKE's older preemptible VMs are spot capacity too.
ON_DEMAND_EXPRESSIONS: dict[str, list[Json]] = {
    "karpenter": [{"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]}],
    "eks": [{"key": "eks.amazonaws.com/capacityType", "operator": "NotIn", "values": ["SPOT"]}],
    "gke": [
        {"key": "cloud.google.com/gke-spot", "operator": "DoesNotExist"},
        {"key": "cloud.google.com/gke-preemptible", "operator": "DoesNotExist"},
    ],
    "aks": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "NotIn", "values": ["spot"]}],
}

# Taints providers put on spot nodes by themselves. AKS always taints spot pools; GKE
# recommends this taint and Autopilot applies it. Karpenter and EKS managed node groups add
# no spot taint of their own (a NodePool's or node group's taints are the cluster admin's
# choice: pass them in JobSpec.tolerations).
SPOT_TOLERATIONS: dict[str, list[Json]] = {
    "gke": [
        {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ],
    "aks": [
        {
            "key": "kubernetes.azure.com/scalesetpriority",
            "operator": "Equal",
            "value": "spot",
            "effect": "NoSchedule",
        }
    ],
}

# GPU node pools are commonly tainted so that only GPU pods land there (GKE does it by
# itself; Karpenter NodePools and AKS GPU pools by convention).
GPU_TOLERATION: Json = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _flavours(spot_flavour: str) -> tuple[str, ...]:
    return SPOT_PROVIDERS if spot_flavour == "auto" else (spot_flavour,)


def is_spot(capacity: str) -> bool:
    """``spot-then-on-demand`` starts on spot; the operator switches the JobSpec later."""
    return capacity in ("spot", "spot-then-on-demand")


def placement_terms(capacity: str, spot_flavour: str) -> list[Json]:
    """The capacity part of the node affinity: ORed nodeSelectorTerms."""
    flavours = _flavours(spot_flavour)
    if is_spot(capacity):
        return [{"matchExpressions": [dict(SPOT_EXPRESSIONS[f])]} for f in flavours]
    return [{"matchExpressions": [dict(e) for f in flavours for e in ON_DEMAND_EXPRESSIONS[f]]}]


def _user_terms(node_selector: dict[str, str], affinity: Json | None) -> list[Json]:
    selector = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(node_selector.items())]
    required = ((affinity or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or [{}]
    out = []
    for term in terms:
        merged: Json = {"matchExpressions": [*selector, *copy.deepcopy(term.get("matchExpressions", []))]}
        if term.get("matchFields"):
            merged["matchFields"] = copy.deepcopy(term["matchFields"])
        out.append(merged)
    return out


def and_terms(ours: list[Json], theirs: list[Json]) -> list[Json]:
    """(A1 or A2) and (B1 or B2) as ORed terms: every Ai's expressions plus every Bj's."""
    out = []
    for a in ours:
        for b in theirs:
            term: Json = {
                "matchExpressions": copy.deepcopy(
                    [*a.get("matchExpressions", []), *b.get("matchExpressions", [])]
                )
            }
            fields = copy.deepcopy([*a.get("matchFields", []), *b.get("matchFields", [])])
            if fields:
                term["matchFields"] = fields
            out.append(term)
    return out


def affinity(spec: JobSpec) -> Json:
    """The pod's ``affinity``: placement ANDed with the user's and with the nodes to avoid
    (``avoid_nodes``: ``metadata.name NotIn``, a field selector no label can fake); the user's
    other parts kept."""
    out = copy.deepcopy(spec.affinity or {})
    node = out.setdefault("nodeAffinity", {})
    terms = and_terms(
        placement_terms(spec.capacity, spec.spot_flavour), _user_terms(spec.node_selector, spec.affinity)
    )
    if spec.avoid_nodes:
        terms = and_terms(
            terms,
            [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": sorted(spec.avoid_nodes)}
                    ]
                }
            ],
        )
    node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    return out


def tolerations(spec: JobSpec) -> list[Json]:
    """Spot taints (when on spot), the GPU taint (when using GPUs), then the user's own."""
    out: list[Json] = []
    if is_spot(spec.capacity):
        for flavour in _flavours(spec.spot_flavour):
            out += SPOT_TOLERATIONS.get(flavour, [])
    if spec.gpus_per_node > 0:
        out.append(dict(GPU_TOLERATION))
    for toleration in spec.tolerations:
        if toleration not in out:
            out.append(copy.deepcopy(toleration))
    return out


# Labels that on-demand nodes carry, where the provider sets one. A nodeSelector can only
# require a value, never exclude one, so this is how on-demand reads without affinity (GKE
# and AKS label only their spot nodes). Karpenter's ``on-demand`` excludes ``reserved``
# capacity, which the NotIn affinity above admits.
ON_DEMAND_LABELS: dict[str, tuple[str, str]] = {
    "karpenter": ("karpenter.sh/capacity-type", "on-demand"),
    "eks": ("eks.amazonaws.com/capacityType", "ON_DEMAND"),
}


def _selector_for(capacity: str, spot_flavour: str, kind: str, what: str = "") -> dict[str, str]:
    if spot_flavour == "auto":
        raise JobSpecError(
            f"JobSpec spot_flavour 'auto' cannot be placed by kind {kind!r}: its pods take only "
            "a nodeSelector (no affinity), and no node carries every provider's spot label; "
            f"name the provider: spot_flavour one of {SPOT_PROVIDERS}"
        )
    if is_spot(capacity):
        expression = SPOT_EXPRESSIONS[spot_flavour]
        return {expression["key"]: expression["values"][0]}
    if spot_flavour not in ON_DEMAND_LABELS:
        raise JobSpecError(
            f"JobSpec capacity {capacity!r}{what} with spot_flavour {spot_flavour!r} cannot be "
            f"placed by kind {kind!r}: {spot_flavour} labels only its spot nodes, and excluding "
            "them needs a node affinity, which this kind cannot set; use capacity 'spot', "
            f"spot_flavour {tuple(ON_DEMAND_LABELS)}, or another kind"
        )
    key, value = ON_DEMAND_LABELS[spot_flavour]
    return {key: value}


def node_selector(spec: JobSpec, kind: str = "trainjob") -> dict[str, str]:
    """Placement as a plain ``nodeSelector``, for a kind whose pods take no affinity (a
    TrainJob's ``podSpecOverrides``): the provider's spot label, or its on-demand label, plus
    the user's ``node_selector``. Raises JobSpecError naming what a nodeSelector cannot say:
    ``spot_flavour: auto`` (an OR), on-demand on GKE or AKS (a NotIn), a user ``affinity``, a
    user selector that contradicts the placement. ``spot-then-on-demand`` is checked for its
    on-demand fallback too, so the fallback cannot fail later."""
    if spec.affinity:
        raise JobSpecError(
            f"JobSpec affinity cannot be set for kind {kind!r}: its pods take a nodeSelector but "
            "no affinity; use node_selector, or set the affinity in the runtime's pod template"
        )
    if spec.capacity == "spot-then-on-demand":
        _selector_for("on-demand", spec.spot_flavour, kind, " (the fallback of 'spot-then-on-demand')")
    out = _selector_for(spec.capacity, spec.spot_flavour, kind)
    for key, value in sorted(spec.node_selector.items()):
        if key in out and out[key] != value:
            raise JobSpecError(
                f"JobSpec node_selector {key}={value!r} contradicts the "
                f"placement's {key}={out[key]!r} (capacity {spec.capacity!r})"
            )
        out[key] = value
    return out
