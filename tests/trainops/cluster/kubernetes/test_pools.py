"""Which node pools can hold one pod of a job, and the refusal a user reads when none can."""

from decimal import Decimal

import pytest

from trainops.cluster.kubernetes.pools import millicores, pools, quantity, refusal, whole
from trainops.cluster.spec import JobSpec

from .fake_k8s import load

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def node(name, labels, *, cpu="7910m", memory="30Gi", disk="100Gi", gpus=None, taints=(), ready=True):
    allocatable = {"cpu": cpu, "memory": memory, "ephemeral-storage": disk, "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}],
        },
    }


def eks(name, group, capacity, instance, **kw):
    labels = {
        "eks.amazonaws.com/nodegroup": group,
        "eks.amazonaws.com/capacityType": capacity,
        "node.kubernetes.io/instance-type": instance,
    }
    return node(name, labels, **kw)


def gpu_spot(name="gpu-a", **kw):
    return eks(
        name,
        "gpu-spot",
        "SPOT",
        "p4d.24xlarge",
        **{"cpu": "95690m", "memory": "1155916016Ki", "gpus": 8, "taints": [GPU_TAINT], **kw},
    )


def cpu_on_demand(name="cpu-a", **kw):
    return eks(name, "cpu", "ON_DEMAND", "m5.2xlarge", **kw)


def spec(**kw):
    return JobSpec(name="train-0a1b2c3d-a1", args=["python"], **kw)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7910m", Decimal("7.91")),
        ("30Gi", Decimal(30 * 2**30)),
        ("64Mi", Decimal(64 * 2**20)),
        ("1e3", Decimal(1000)),
        ("500M", Decimal(500 * 10**6)),
        ("8", Decimal(8)),
        (8, Decimal(8)),
        ("680371288Ki", Decimal(680371288 * 1024)),
        ("1.5", Decimal("1.5")),
        ("2E", Decimal(2 * 10**18)),
    ],
)
def test_quantities_parse_as_the_api_server_reads_them(text, value):
    assert quantity(text) == value


def test_cpu_rounds_up_to_millicores_and_bytes_to_whole_bytes():
    assert millicores("7910m") == 7910 and millicores("8") == 8000 and millicores("0.0001") == 1
    assert whole("64Mi") == 67108864 and whole("1.5Ki") == 1536


@pytest.mark.parametrize("bad", ["", "8 GiB", "Gi", "1x", None, True, [1]])
def test_what_is_not_a_quantity_is_named(bad):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity(bad)


def test_pools_group_nodes_by_pool_capacity_and_type_and_keep_the_largest_node():
    found = pools(
        [
            gpu_spot("gpu-a"),
            gpu_spot("gpu-b", ready=False),
            cpu_on_demand("cpu-a", cpu="3920m", memory="15Gi"),
            cpu_on_demand("cpu-b"),
            node("bare", {}),
        ]
    )
    by_name = {p.name: p for p in found}
    assert sorted(by_name) == ["cpu", "gpu-spot", "unlabelled"]
    gpu = by_name["gpu-spot"]
    assert (gpu.capacity_type, gpu.instance_type, gpu.nodes, gpu.ready) == ("spot", "p4d.24xlarge", 2, 1)
    assert (gpu.gpus, gpu.cpu_m, gpu.memory) == (8, 95690, 1155916016 * 1024)
    assert [(t.key, t.effect) for t in gpu.taints] == [("nvidia.com/gpu", "NoSchedule")]
    cpu = by_name["cpu"]
    assert (cpu.capacity_type, cpu.nodes, cpu.cpu_m, cpu.memory, cpu.gpus) == (
        "on-demand",
        2,
        7910,
        30 * 2**30,
        0,
    )
    assert by_name["unlabelled"].capacity_type is None


def test_each_providers_pool_label_names_the_pool():
    assert [p.name for p in pools([load("node-gke-spot-a2")])] == ["spot-a100-pool"]
    assert [p.name for p in pools([load("node-karpenter-spot-p4d")])] == ["gpu-spot"]
    aks = node("aks-1", {"kubernetes.azure.com/agentpool": "gpupool"})
    typed = node("n-1", {"node.kubernetes.io/instance-type": "n2-standard-8"})
    assert [p.name for p in pools([aks, typed])] == ["gpupool", "n2-standard-8"]


def test_a_request_every_pool_is_too_small_for_is_refused_naming_the_request_and_each_pool():
    found = pools([gpu_spot(), cpu_on_demand()])
    why = refusal(spec(gpus_per_node=8, cpu="96", memory="900Gi", spot_flavour="eks"), found)
    assert why is not None
    assert "one of its pods" in why and "One pod asks for 8 GPUs, 96 CPUs, 900Gi memory" in why
    assert "pool gpu-spot (spot, p4d.24xlarge; 1 node): 8 GPUs, 95.69 CPUs, 1102Gi memory" in why
    assert "pool cpu (on-demand, m5.2xlarge; 1 node): 0 GPUs, 7.91 CPUs, 30Gi memory" in why
    assert "[placement or taints do not match] pool cpu" in why  # a spot GPU pod cannot go there
    assert "job_options" in why and "node_selector" in why


def test_a_request_that_fits_one_node_is_not_refused():
    found = pools([gpu_spot(), cpu_on_demand()])
    assert refusal(spec(gpus_per_node=8, cpu="90", memory="900Gi"), found) is None
    assert refusal(spec(cpu="7", memory="28Gi", capacity="on-demand"), found) is None


def test_memory_and_disk_count_as_the_pod_requests_them():
    found = pools([cpu_on_demand(disk="100Gi")])
    assert refusal(spec(capacity="on-demand", memory="31Gi"), found) is not None
    assert refusal(spec(capacity="on-demand", cache_size="200Gi"), found) is not None  # ephemeral request
    why = refusal(spec(capacity="on-demand", ephemeral_storage="150Gi"), found)
    assert why is not None and "150Gi disk" in why and "100Gi disk" in why
    assert refusal(spec(capacity="on-demand", ephemeral_storage="90Gi"), found) is None


def test_a_pool_whose_taint_the_pod_does_not_tolerate_is_no_fit():
    tainted = cpu_on_demand(taints=[{"key": "dedicated", "value": "etl", "effect": "NoSchedule"}])
    small = cpu_on_demand("small", cpu="2", memory="8Gi")
    small["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = "small"
    found = pools([tainted, small])
    asked = {"capacity": "on-demand", "cpu": "6", "memory": "16Gi"}
    why = refusal(spec(**asked), found)
    assert why is not None and "[placement or taints do not match] pool cpu" in why
    toleration = {"key": "dedicated", "operator": "Equal", "value": "etl", "effect": "NoSchedule"}
    assert refusal(spec(**asked, tolerations=[toleration]), found) is None
    exists = {"key": "dedicated", "operator": "Exists"}
    assert refusal(spec(**asked, tolerations=[exists]), found) is None


def test_passing_states_of_a_node_are_not_its_pools_taints():
    cordoned = cpu_on_demand(
        taints=[
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
            {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"},
            {"key": "prefer", "value": "x", "effect": "PreferNoSchedule"},
        ],
        ready=False,
    )
    assert pools([cordoned])[0].taints == ()
    assert refusal(spec(capacity="on-demand", cpu="7"), pools([cordoned])) is None


def test_a_gpu_pod_gets_the_gpu_toleration_so_a_gpu_tainted_pool_fits():
    found = pools([gpu_spot()])
    assert refusal(spec(gpus_per_node=8, cpu="90", memory="500Gi"), found) is None
    # a CPU pod does not tolerate the GPU taint: no visible pool matches, so nothing is known
    assert refusal(spec(cpu="200"), found) is None


def test_node_selector_narrows_the_pools_that_count():
    big = cpu_on_demand("big", cpu="64", memory="256Gi")
    big["metadata"]["labels"].update({"eks.amazonaws.com/nodegroup": "big", "team": "research"})
    found = pools([cpu_on_demand(), big])
    asked = {"capacity": "on-demand", "cpu": "32", "memory": "64Gi"}
    assert refusal(spec(**asked), found) is None
    why = refusal(spec(**asked, node_selector={"eks.amazonaws.com/nodegroup": "cpu"}), found)
    assert why is not None and "node_selector {'eks.amazonaws.com/nodegroup': 'cpu'}" in why


def test_a_selector_on_a_label_that_differs_between_a_pools_nodes_matches_one_of_them():
    found = pools([cpu_on_demand("cpu-a"), cpu_on_demand("cpu-b")])
    asked = {"capacity": "on-demand", "cpu": "7", "node_selector": {"kubernetes.io/hostname": "cpu-b"}}
    assert refusal(spec(**asked), found) is None
    assert refusal(spec(**{**asked, "cpu": "9"}), found) is not None


def test_spot_then_on_demand_is_checked_against_spot_pools_first():
    spot_small = eks("s", "spot-cpu", "SPOT", "m5.large", cpu="1930m", memory="7Gi")
    found = pools([spot_small, cpu_on_demand()])
    why = refusal(spec(capacity="spot-then-on-demand", cpu="4", spot_flavour="eks"), found)
    assert why is not None and "spot-then-on-demand capacity" in why
    assert refusal(spec(capacity="on-demand", cpu="4", spot_flavour="eks"), found) is None


def test_nothing_is_refused_when_the_nodes_cannot_tell():
    huge = spec(gpus_per_node=16, cpu="400", memory="4Ti", spot_flavour="eks")
    assert refusal(huge, []) is None  # no node at all: autoscaled from zero
    # only CPU pools visible: the GPU pool may be scaled to zero
    assert refusal(huge, pools([eks("s", "spot-cpu", "SPOT", "m5.large")])) is None
    # no visible pool matches the placement: the on-demand pool may be at zero
    assert refusal(spec(capacity="on-demand", cpu="400"), pools([gpu_spot()])) is None
    # a pool named in node_selector that has no nodes
    named = spec(capacity="on-demand", cpu="400", node_selector={"eks.amazonaws.com/nodegroup": "big"})
    assert refusal(named, pools([cpu_on_demand()])) is None


def test_karpenter_makes_nodes_of_the_size_pending_pods_need_so_it_is_never_refused():
    found = pools([load("node-karpenter-spot-p4d")])
    assert found[0].karpenter
    assert refusal(spec(gpus_per_node=8, cpu="190", memory="2Ti", spot_flavour="karpenter"), found) is None


def test_the_recorded_gke_node_holds_what_it_allows_and_no_more():
    found = pools([load("node-gke-spot-a2")])
    assert refusal(spec(gpus_per_node=8, cpu="95", memory="640Gi", spot_flavour="gke"), found) is None
    why = refusal(spec(gpus_per_node=8, cpu="96", memory="640Gi", spot_flavour="gke"), found)
    assert why is not None and "95.69 CPUs" in why and "96 CPUs" in why
