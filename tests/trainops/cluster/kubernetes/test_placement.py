"""Placement: which nodes a pod may land on, checked by evaluating the node affinity the way
the scheduler does against the labels real providers put on their nodes."""

import pytest

from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec

SPOT_NODES = {
    "karpenter": {"karpenter.sh/capacity-type": "spot"},
    "eks": {"eks.amazonaws.com/capacityType": "SPOT"},
    "gke": {"cloud.google.com/gke-spot": "true"},
    "aks": {"kubernetes.azure.com/scalesetpriority": "spot"},
}
ON_DEMAND_NODES = {
    "karpenter": {"karpenter.sh/capacity-type": "on-demand"},
    "eks": {"eks.amazonaws.com/capacityType": "ON_DEMAND"},
    "gke": {"cloud.google.com/gke-nodepool": "default-pool"},
    "aks": {"kubernetes.azure.com/agentpool": "gpu"},
}
ARGS = ["python", "-m", "trainer", "train"]


def _expr(e, labels):
    op, key = e["operator"], e["key"]
    return {
        "In": lambda: labels.get(key) in e["values"],
        "NotIn": lambda: key not in labels or labels[key] not in e["values"],
        "Exists": lambda: key in labels,
        "DoesNotExist": lambda: key not in labels,
    }[op]()


def schedulable(pod_spec: dict, labels: dict) -> bool:
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return any(all(_expr(e, labels) for e in t["matchExpressions"]) for t in terms)


def pod_spec(**kw) -> dict:
    spec = JobSpec(**{"name": "train-0123abcd-a1", "args": ARGS, **kw})
    return render_manifests(spec)[-1]["spec"]["template"]["spec"]


@pytest.mark.parametrize("capacity", ["spot", "spot-then-on-demand"])
def test_spot_auto_lands_on_any_providers_spot_nodes_only(capacity):
    pod = pod_spec(capacity=capacity, spot_flavour="auto")
    assert "nodeSelector" not in pod
    assert (
        len(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
        )
        == 4
    )
    for flavour, labels in SPOT_NODES.items():
        assert schedulable(pod, labels), flavour
    for flavour, labels in ON_DEMAND_NODES.items():
        assert not schedulable(pod, labels), flavour


@pytest.mark.parametrize("flavour", list(SPOT_NODES))
def test_named_flavour_targets_that_provider_only(flavour):
    pod = pod_spec(spot_flavour=flavour)
    assert [f for f, labels in SPOT_NODES.items() if schedulable(pod, labels)] == [flavour]


@pytest.mark.parametrize("flavour", ["auto", *SPOT_NODES])
def test_on_demand_matches_no_spot_node(flavour):
    pod = pod_spec(capacity="on-demand", spot_flavour=flavour)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 1
    for name, labels in SPOT_NODES.items():
        if flavour in ("auto", name):
            assert not schedulable(pod, labels), name
    for name, labels in ON_DEMAND_NODES.items():
        assert schedulable(pod, labels), name
    assert not any(
        t["key"].startswith(("cloud.google.com/gke-spot", "kubernetes.azure"))
        for t in pod.get("tolerations", [])
    )


def test_user_selector_and_affinity_are_anded_into_every_term():
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}
    pod = pod_spec(
        node_selector={"gpu": "h100"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [zone]}]
                }
            }
        },
    )
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 4
    for term in terms:
        assert {"key": "gpu", "operator": "In", "values": ["h100"]} in term["matchExpressions"]
        assert zone in term["matchExpressions"]
    gke_h100_a = {**SPOT_NODES["gke"], "gpu": "h100", "topology.kubernetes.io/zone": "a"}
    assert schedulable(pod, gke_h100_a)
    assert not schedulable(pod, {**gke_h100_a, "gpu": "a100"})
    assert not schedulable(pod, {**gke_h100_a, "topology.kubernetes.io/zone": "c"})


def test_users_ored_terms_multiply_with_providers():
    pod = pod_spec(
        spot_flavour="auto",
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]},
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["y"]}]},
                    ]
                }
            },
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"cache": "warm"}},
                    }
                ]
            },
        },
    )
    assert (
        len(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
        )
        == 8
    )
    assert schedulable(pod, {**SPOT_NODES["aks"], "pool": "y"})
    assert not schedulable(pod, {**SPOT_NODES["aks"], "pool": "z"})
    assert pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"
    ] == {"matchLabels": {"cache": "warm"}}


def test_spot_tolerations_per_flavour_plus_users():
    mine = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    keys = [
        t["key"] for t in pod_spec(spot_flavour="auto", gpus_per_node=8, tolerations=[mine])["tolerations"]
    ]
    assert keys == [
        "cloud.google.com/gke-spot",
        "kubernetes.azure.com/scalesetpriority",
        "nvidia.com/gpu",
        "dedicated",
    ]
    assert "tolerations" not in pod_spec(spot_flavour="karpenter")
    assert [t["key"] for t in pod_spec(spot_flavour="aks")["tolerations"]] == [
        "kubernetes.azure.com/scalesetpriority"
    ]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("flavour", ["karpenter", "eks", "gke", "aks"])
def test_node_selector_placement_lands_like_the_affinity(flavour):
    """Kinds without affinity (TrainJob) place by nodeSelector: same nodes as the affinity
    wherever a selector can say it; on-demand only where the provider labels those nodes."""
    from trainops.cluster.kubernetes import placement

    spot = JobSpec(name="train-0123abcd-a1", args=ARGS, spot_flavour=flavour)
    selector = placement.node_selector(spot)
    for name, labels in {
        **{f"spot-{f}": n for f, n in SPOT_NODES.items()},
        **{f"on-demand-{f}": n for f, n in ON_DEMAND_NODES.items()},
    }.items():
        assert selects(selector, labels) == (name == f"spot-{flavour}"), name
        assert selects(selector, labels) == schedulable(pod_spec(spot_flavour=flavour), labels)
    on_demand = JobSpec(name="train-0123abcd-a1", args=ARGS, spot_flavour=flavour, capacity="on-demand")
    if flavour in ("gke", "aks"):
        with pytest.raises(ValueError, match=f"spot_flavour '{flavour}'.*needs a node affinity"):
            placement.node_selector(on_demand)
        return
    selector = placement.node_selector(on_demand)
    assert selects(selector, ON_DEMAND_NODES[flavour])
    assert not any(selects(selector, labels) for labels in SPOT_NODES.values())
