"""What a cluster's CRD says about a manifest: the pure schema walk, and the backend rendering
for the CRD the (simulated) cluster serves, refusing before launch what it would prune."""

import pytest

from trainops.cluster.kubernetes import crd_schema
from trainops.cluster.kubernetes.backend import KubernetesCluster
from trainops.cluster.spec import JobSpec, JobSpecError

from .control_plane import ControlPlane
from .crds import trainjob_crd

SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"name": {"type": "string"}}},
                },
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        }
    },
}


def test_unknown_fields_are_named_by_path_through_lists_and_maps():
    obj = {
        "apiVersion": "x/v1",
        "kind": "X",
        "metadata": {"name": "a", "anything": 1},  # ObjectMeta: the API server's, not the CRD's
        "spec": {
            "items": [{"name": "a"}, {"name": "b", "nmae": "typo"}],
            "labels": {"any": "key"},
            "free": {"whatever": {"deep": 1}},
            "extra": True,
        },
    }
    assert crd_schema.unknown_fields(obj, SCHEMA) == [".spec.items[1].nmae", ".spec.extra"]


def test_properties_at_steps_through_arrays_and_says_nothing_for_a_missing_path():
    assert crd_schema.properties_at(SCHEMA, ["spec", "items"]) == {"name"}
    assert crd_schema.properties_at(SCHEMA, ["spec", "nope", "deeper"]) == frozenset()


def test_served_schema_and_versions():
    crd = trainjob_crd()
    assert crd_schema.served_versions(crd) == ["v1alpha1"]
    assert "spec" in crd_schema.served_schema(crd, "v1alpha1")["properties"]
    assert crd_schema.served_schema(crd, "v1") is None
    crd["spec"]["versions"][0]["served"] = False
    assert crd_schema.served_versions(crd) == [] and crd_schema.served_schema(crd, "v1alpha1") is None


# -- the backend, against the CRD a simulated cluster serves ------------------------------


def trainjob_spec(**kw):
    return JobSpec(
        **{
            "name": "train-0a1b2c3d-a1",
            "args": ["python", "-m", "trainer", "train"],
            "nodes": 2,
            "namespace": "ml",
            "kind": "trainjob",
            "gpus_per_node": 8,
            "spot_flavour": "karpenter",
            "service_account": "trainer",
            "termination_grace_seconds": 30,
            **kw,
        }
    )


@pytest.fixture
def plane():
    return ControlPlane()


def on(plane):
    return KubernetesCluster(hook=plane, clock=plane.clock, sleep=plane.sleep)


def created_trainjob(plane):
    ((_, _, _), obj), *_ = [(k, o) for k, o in plane.objects.items() if k[0] == "TrainJob"]
    return obj


@pytest.mark.parametrize(
    "release,field",
    [("v2.0.0", "podSpecOverrides"), ("v2.1.0", "podTemplateOverrides"), ("v2.3.0", "runtimePatches")],
)
def test_the_trainjob_is_rendered_for_the_trainer_release_the_cluster_serves(plane, release, field):
    plane.crd_objects["trainjobs"] = trainjob_crd(release)
    cluster = on(plane)
    cluster.launch(trainjob_spec())
    cluster.launch(trainjob_spec(name="train-0a1b2c3d-a2"))
    body = created_trainjob(plane)["spec"]
    others = {"podSpecOverrides", "podTemplateOverrides", "runtimePatches"} - {field}
    assert field in body and not others & set(body)
    # the CRD is read once per backend, not per launch
    assert [c.name for c in plane.calls if c.resource == "customresourcedefinitions"] == [
        "trainjobs.trainer.kubeflow.org"
    ]


def test_a_missing_crd_is_refused_before_anything_is_created(plane):
    plane.crds.discard("trainjobs")
    with pytest.raises(
        JobSpecError, match=r"no TrainJob CRD \(trainjobs.trainer.kubeflow.org\).*Kubeflow Trainer"
    ):
        on(plane).launch(trainjob_spec())
    assert not [c for c in plane.calls if c.verb == "create"]


def test_a_field_the_clusters_crd_does_not_define_is_refused_naming_it(plane):
    """A Trainer whose schema lacks a field we need (here: pod volumes) would prune it: the
    launch is refused, naming the field, and nothing is created."""
    crd = trainjob_crd("v2.1.0")
    pod = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "podTemplateOverrides"
    ]["items"]["properties"]["spec"]["properties"]
    del pod["volumes"]
    plane.crd_objects["trainjobs"] = crd
    with pytest.raises(JobSpecError) as err:
        on(plane).launch(trainjob_spec())
    assert ".spec.podTemplateOverrides[0].spec.volumes" in str(err.value)
    assert "drop silently" in str(err.value) and "Kubeflow Trainer" in str(err.value)
    assert not [c for c in plane.calls if c.verb == "create"]


def test_without_rights_to_read_crds_the_api_servers_strict_validation_names_the_field(plane, caplog):
    """No RBAC to read the CRD: the newest shape is sent with strict field validation, and an
    older Trainer's API server refuses the unknown field instead of dropping it."""
    caplog.set_level("INFO")
    plane.crd_objects["trainjobs"] = trainjob_crd("v2.0.0")
    plane.denied.add(("get", "customresourcedefinitions"))
    with pytest.raises(
        JobSpecError, match=r'refused TrainJob ml/train-0a1b2c3d-a1: .*unknown field "spec.runtimePatches"'
    ):
        on(plane).launch(trainjob_spec())
    assert "cannot read the TrainJob CRD" in caplog.text
    assert not plane.objects


def test_a_crd_that_does_not_serve_our_version_is_refused(plane):
    crd = trainjob_crd()
    crd["spec"]["versions"][0]["name"] = "v1beta1"
    plane.crd_objects["trainjobs"] = crd
    with pytest.raises(JobSpecError, match=r"serves \['v1beta1'\], not v1alpha1"):
        on(plane).launch(trainjob_spec())


def test_a_blip_on_the_crd_read_is_retried_and_an_outage_creates_nothing(plane):
    """A 503 on reading the CRD is ridden out; an outage past the retry budget fails the
    launch before anything is created (the next launch reads the CRD again)."""
    from trainops.cluster.kubernetes.api_retry import ApiUnavailable

    plane.inject("get", "customresourcedefinitions", status=503, times=1)
    on(plane).launch(trainjob_spec())
    reads = [c for c in plane.calls if c.resource == "customresourcedefinitions"]
    assert [c.fault for c in reads] == ["503", None] and "runtimePatches" in created_trainjob(plane)["spec"]

    down = ControlPlane()
    down.inject("get", "customresourcedefinitions", status=503)
    cluster = KubernetesCluster(hook=down, clock=down.clock, sleep=down.sleep, api_retry_s=30)
    with pytest.raises(ApiUnavailable):
        cluster.launch(trainjob_spec())
    assert not [c for c in down.calls if c.verb == "create"] and not down.objects
