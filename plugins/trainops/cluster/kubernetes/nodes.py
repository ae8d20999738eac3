"""What kind of machine a pod ran on, from its Node's labels: the instance type and whether it
was spot (preemptible) or on-demand capacity, for the cost report. Pure: a label dict in.

Each provider says "spot" in its own label; none of them is a Kubernetes standard. A node
whose labels say nothing we know (or whose labels could not be read) gets None, not a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
# label -> {value: capacity type}; the first label with a known value decides. Values not listed (e.g.
# Karpenter's "reserved", EKS's "CAPACITY_BLOCK") are neither spot nor on-demand: None.
CAPACITY_LABELS = (
    ("karpenter.sh/capacity-type", {"spot": "spot", "on-demand": "on-demand"}),
    ("eks.amazonaws.com/capacityType", {"SPOT": "spot", "ON_DEMAND": "on-demand"}),
    ("cloud.google.com/gke-spot", {"true": "spot"}),
    ("cloud.google.com/gke-preemptible", {"true": "spot"}),
    ("kubernetes.azure.com/scalesetpriority", {"spot": "spot", "regular": "on-demand"}),
)


class NodeType(TypedDict):
    """What kind of machine a node is (both None: unknown)."""

    instance_type: str | None
    capacity_type: str | None


def instance_type(labels: Mapping[str, str] | None) -> str | None:
    """The node's machine type (``p4d.24xlarge``, ``a2-highgpu-8g``), or None."""
    for key in INSTANCE_TYPE_LABELS:
        value = (labels or {}).get(key)
        if value:
            return value
    return None


def capacity_type(labels: Mapping[str, str] | None) -> str | None:
    """``spot``, ``on-demand`` or None (unknown) from the provider's capacity label."""
    for key, values in CAPACITY_LABELS:
        value = (labels or {}).get(key)
        if value is not None and values.get(str(value)):
            return values[str(value)]
    return None


def node_type(labels: Mapping[str, str] | None) -> NodeType:
    """``{"instance_type", "capacity_type"}`` of a node; both None when ``labels`` is None."""
    return {"instance_type": instance_type(labels), "capacity_type": capacity_type(labels)}
