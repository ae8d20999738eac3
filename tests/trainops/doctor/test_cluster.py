"""The doctor's cluster checks against the simulated control plane: a healthy cluster passes
every line, and each fault fails exactly its own line, with the fix."""

import pytest

from trainops.doctor import checks
from trainops.doctor.cluster import Target, cluster_checks

from .scenarios import SERVER, healthy_plane

TARGET = Target(
    namespace="ml", kind="trainjob", scheduler="kueue:team-a", spot_flavour="gke", gpus_per_node=8
)


def by_name(found):
    return {c.name: c for c in found}


def failing(found):
    return [c.name for c in found if c.status == checks.FAIL]


def test_a_healthy_cluster_passes_every_line_it_needs():
    found = cluster_checks(healthy_plane(), SERVER, TARGET)
    assert failing(found) == [] and not [c for c in found if c.status == checks.WARN]
    named = by_name(found)
    assert named["api"].detail == f"{SERVER} answers"
    assert named["rbac trainjobs"].detail == "trainjobs.trainer.kubeflow.org: create get list delete"
    assert "pod settings in runtimePatches" in named["crd TrainJob"].detail
    assert named["crd Volcano"].status == checks.PASS  # installed, if unused
    assert named["crd PyTorchJob"].status == checks.PASS
    assert "2 spot node(s): spot-a100-pool (2)" in named["spot nodes"].detail
    assert named["gpus"].detail == "nvidia.com/gpu by pool: spot-a100-pool: 2 x 8"


def test_no_rbac_to_create_jobs_fails_only_that_line():
    plane = healthy_plane()
    plane.denied.add(("create", "jobs"))
    found = cluster_checks(plane, SERVER, Target(namespace="ml", spot_flavour="gke"))
    assert failing(found) == ["rbac jobs"]
    line = by_name(found)["rbac jobs"]
    assert line.detail == "jobs.batch: may not create" and "docker/deploy/overlays" in line.fix


def test_a_missing_optional_rule_is_a_warning_not_a_failure():
    plane = healthy_plane()
    plane.denied.add(("list", "nodes"))
    found = cluster_checks(plane, SERVER, Target(namespace="ml", spot_flavour="gke"))
    assert failing(found) == []
    assert by_name(found)["rbac nodes"].status == checks.WARN
    assert by_name(found)["rbac nodes"].detail == "nodes: may not list (optional)"
    # and the node checks say they could not look, instead of guessing
    assert by_name(found)["spot nodes"].status == checks.WARN


def test_no_trainjob_crd_fails_only_that_line():
    plane = healthy_plane()
    plane.crds.discard("trainjobs")
    found = cluster_checks(plane, SERVER, TARGET)
    assert failing(found) == ["crd TrainJob"]
    assert by_name(found)["crd TrainJob"].detail == "trainjobs.trainer.kubeflow.org: not installed"


def test_a_crd_the_configuration_does_not_use_is_information():
    plane = healthy_plane()
    plane.crds -= {"trainjobs", "pytorchjobs"}
    found = cluster_checks(plane, SERVER, Target(namespace="ml", spot_flavour="gke"))
    assert failing(found) == [] and by_name(found)["crd TrainJob"].status == checks.INFO


def test_no_spot_nodes_fails_only_that_line():
    plane = healthy_plane()
    for name in list(plane.nodes):
        plane.nodes[name]["metadata"]["labels"].pop("cloud.google.com/gke-spot")
    found = cluster_checks(plane, SERVER, TARGET)
    assert failing(found) == ["spot nodes"]
    assert "--spot" in by_name(found)["spot nodes"].fix and "on-demand" in by_name(found)["spot nodes"].fix


def test_no_gpu_nodes_fails_the_gpu_line():
    plane = healthy_plane()
    for node in plane.nodes.values():
        node["status"]["allocatable"].pop("nvidia.com/gpu")
    found = cluster_checks(plane, SERVER, TARGET)
    assert failing(found) == ["gpus"] and "device plugin" in by_name(found)["gpus"].fix


def test_a_missing_namespace_fails_and_the_api_still_passes():
    found = cluster_checks(healthy_plane(), SERVER, Target(namespace="nope", spot_flavour="gke"))
    assert failing(found) == ["namespace"]
    assert by_name(found)["namespace"].fix.startswith("kubectl create namespace nope")


def test_an_api_that_does_not_answer_fails_once_and_nothing_else_is_tried():
    plane = healthy_plane()
    plane.inject("*", "*", reset=True)
    found = cluster_checks(plane, SERVER, TARGET)
    assert [(c.name, c.status) for c in found] == [("api", checks.FAIL)]
    assert "ProtocolError" in found[0].detail and "kubectl cluster-info" in found[0].fix
    assert len(plane.calls) == 1


@pytest.mark.parametrize("status", [401, 500])
def test_an_api_error_on_the_first_read_is_the_api_line(status):
    plane = healthy_plane()
    plane.inject("get", "namespaces", status=status)
    (only,) = cluster_checks(plane, SERVER, TARGET)
    assert only.name == "api" and only.status == checks.FAIL and only.detail.startswith(f"{SERVER}: {status}")


def test_nothing_is_created_or_deleted():
    plane = healthy_plane()
    cluster_checks(plane, SERVER, TARGET)
    assert {(c.verb, c.resource) for c in plane.calls if c.verb in ("create", "delete")} == {
        ("create", "selfsubjectaccessreviews")  # a question, not an object
    }
    assert not plane.objects


def test_a_trainjob_crd_that_does_not_serve_v1alpha1_fails(monkeypatch):
    from tests.trainops.cluster.kubernetes.crds import trainjob_crd

    plane = healthy_plane()
    crd = trainjob_crd()
    crd["spec"]["versions"][0]["name"] = "v1beta1"
    plane.crd_objects["trainjobs"] = crd
    found = cluster_checks(plane, SERVER, TARGET)
    assert failing(found) == ["crd TrainJob"] and "not v1alpha1" in by_name(found)["crd TrainJob"].detail
