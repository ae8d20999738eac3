"""Node labels -> instance type and spot/on-demand, on recorded nodes and each provider's label."""

import json
from pathlib import Path

import pytest

from trainops.cluster.kubernetes.nodes import capacity_type, instance_type, node_type

DATA = Path(__file__).resolve().parents[3] / "data" / "k8s"


def labels_of(name):
    return json.loads((DATA / f"{name}.json").read_text())["metadata"]["labels"]


def test_recorded_spot_nodes_of_karpenter_and_gke():
    assert node_type(labels_of("node-karpenter-spot-p4d")) == {
        "instance_type": "p4d.24xlarge",
        "capacity_type": "spot",
    }
    assert node_type(labels_of("node-gke-spot-a2")) == {
        "instance_type": "a2-highgpu-8g",
        "capacity_type": "spot",
    }


@pytest.mark.parametrize(
    "labels, expected",
    [
        ({"karpenter.sh/capacity-type": "on-demand"}, "on-demand"),
        ({"karpenter.sh/capacity-type": "reserved"}, None),  # a capacity reservation: neither
        ({"eks.amazonaws.com/capacityType": "SPOT"}, "spot"),  # EKS managed node group
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, "on-demand"),
        ({"eks.amazonaws.com/capacityType": "CAPACITY_BLOCK"}, None),
        ({"cloud.google.com/gke-preemptible": "true"}, "spot"),
        ({"cloud.google.com/gke-spot": "false"}, None),
        ({"cloud.google.com/gke-nodepool": "default-pool"}, None),  # says nothing about spot
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, "spot"),
        ({"kubernetes.azure.com/scalesetpriority": "regular"}, "on-demand"),
        ({"kubernetes.io/hostname": "worker-1"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_capacity_type_from_each_providers_label(labels, expected):
    assert capacity_type(labels) == expected


def test_instance_type_falls_back_to_the_beta_label():
    assert instance_type({"beta.kubernetes.io/instance-type": "Standard_ND96asr_v4"}) == "Standard_ND96asr_v4"
    assert (
        instance_type(
            {"node.kubernetes.io/instance-type": "a3-highgpu-8g", "beta.kubernetes.io/instance-type": "old"}
        )
        == "a3-highgpu-8g"
    )
    assert node_type(None) == {"instance_type": None, "capacity_type": None}
