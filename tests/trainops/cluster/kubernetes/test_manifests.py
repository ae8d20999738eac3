"""Every generated manifest against the real schemas, across a matrix of JobSpecs.

Built-in kinds: kubernetes-validate in strict mode (unknown fields fail) for Kubernetes 1.31
and the newest version it ships. PyTorchJob and TrainJob: the CRD schema in tests/data/crds,
plus a walk that fails on fields the schema does not define (the CRDs do not forbid them: an
API server would prune them), plus the controllers' rules. Every TrainJob is rendered for each
Kubeflow Trainer release we pin (v2.0, v2.1, v2.3) and checked against that release's own CRD;
its pod-level parts also go through strict kubernetes-validate inside a Pod. PodGroup (Volcano) has no schema here: its fields are
checked by hand.
"""

import functools
import itertools
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from trainops.cluster.kubernetes import trainjob
from trainops.cluster.kubernetes.crd_schema import unknown_fields
from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec, JobSpecError

from .crds import TRAINJOB_RELEASES
from .test_trainjob import pod_parts

CRDS = Path(__file__).resolve().parents[3] / "data" / "crds"
VERSIONS = ("1.31", latest_version())
ARGS = ["python", "-m", "trainer", "train", "--config", "s3://bucket/runs/r1/config.yaml"]

EXTRAS = [
    {},
    {
        "env_from_secrets": ["s3-credentials", {"env": "HF_TOKEN", "secret": "hf", "key": "token"}],
        "service_account": "trainer",
        "priority_class": "batch-low",
        "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "topology.kubernetes.io/zone",
                                    "operator": "In",
                                    "values": ["eu-west-1a"],
                                }
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "x"}},
                        },
                    }
                ]
            },
        },
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "labels": {"team": "search", "trainops/run": "manual__2026-01-01T00_00_00_00_00"},
        "annotations": {"example.com/owner": "ml-platform"},
        "nccl_env": {"NCCL_DEBUG": "WARN"},
        "env": {"AWS_ENDPOINT_URL_S3": "http://minio:9000", "AWS_REGION": "us-east-1"},
        # sized disk, and a kept job's TTL
        "cache_size": "180Gi",
        "ephemeral_storage": "200Gi",
        "ttl_seconds_after_finished": 86400,
    },
    {"cache_size": "40Gi"},
]


# What a TrainJob can carry (no priority class, Volcano or whole-Secret envFrom: see test_trainjob).
TRAINJOB_EXTRAS = [
    {"termination_grace_seconds": 30},
    {
        "env_from_secrets": [{"env": "HF_TOKEN", "secret": "hf", "key": "token"}],
        "service_account": "trainer",
        "runtime": "trainops-torch",
        "termination_grace_seconds": 120,
        "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "labels": {"team": "search", "trainops/run": "manual__2026-01-01T00_00_00_00_00"},
        "annotations": {"example.com/owner": "ml-platform"},
        "shm_size": "64Gi",
        "nccl_env": {"NCCL_DEBUG": "WARN"},
        "env": {"AWS_ENDPOINT_URL_S3": "http://minio:9000", "AWS_REGION": "us-east-1"},
        "cache_size": "180Gi",
        "ephemeral_storage": "200Gi",
    },
    {"distributed": False, "termination_grace_seconds": 10},
]


def trainjob_matrix():
    """Every capacity x placeable flavour x scheduler TrainJob can use x node count."""
    gpus = itertools.cycle((0, 8, 8))
    extras = itertools.cycle(range(len(TRAINJOB_EXTRAS)))
    for capacity, flavour, scheduler, nodes in itertools.product(
        ("spot", "on-demand", "spot-then-on-demand"),
        ("karpenter", "eks", "gke", "aks"),
        ("default", "kueue:team-a"),
        (1, 2, 4),
    ):
        extra = next(extras)
        yield pytest.param(
            dict(
                name="train-0123abcd-a1",
                args=ARGS,
                kind="trainjob",
                capacity=capacity,
                scheduler=scheduler,
                nodes=nodes,
                gpus_per_node=next(gpus),
                spot_flavour=flavour,
                **TRAINJOB_EXTRAS[extra],
            ),
            id=f"trainjob-{capacity}-{flavour}-{scheduler}-n{nodes}-x{extra}",
        )


def matrix():
    """Every kind x capacity x scheduler x node count; the other dimensions rotate through
    all their values (each value meets every kind and capacity), to keep the run short.
    TrainJob: ``trainjob_matrix``."""
    flavours = itertools.cycle(("karpenter", "eks", "gke", "aks", "auto"))
    gpus = itertools.cycle((0, 8, 8))
    extras = itertools.cycle(range(len(EXTRAS)))
    for kind, capacity, scheduler, nodes in itertools.product(
        ("pytorchjob", "indexed-job"),
        ("spot", "on-demand", "spot-then-on-demand"),
        ("default", "volcano", "volcano:training", "kueue:team-a"),
        (1, 2, 4),
    ):
        extra = next(extras)
        yield pytest.param(
            dict(
                name="train-0123abcd-a1",
                args=ARGS,
                kind=kind,
                capacity=capacity,
                scheduler=scheduler,
                nodes=nodes,
                gpus_per_node=next(gpus),
                spot_flavour=next(flavours),
                **EXTRAS[extra],
            ),
            id=f"{kind}-{capacity}-{scheduler}-n{nodes}-x{extra}",
        )


SPECS = [*matrix(), *trainjob_matrix()]


@functools.cache
def crd_schema(filename: str, version: str) -> dict:
    crd = yaml.safe_load((CRDS / filename).read_text())
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)


@functools.cache
def crd_validator(filename: str, version: str):
    schema = crd_schema(filename, version)
    return jsonschema.validators.validator_for(schema)(schema)


def check_pytorchjob(manifest: dict) -> None:
    schema = crd_schema("kubeflow.org_pytorchjobs.yaml", "v1")
    crd_validator("kubeflow.org_pytorchjobs.yaml", "v1").validate(manifest)
    assert unknown_fields(manifest, schema) == []
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) <= {"Master", "Worker"} and replicas, replicas
    for replica in replicas.values():
        names = [c["name"] for c in replica["template"]["spec"]["containers"]]
        assert "pytorch" in names


def check_pod_group(manifest: dict, spec: JobSpec) -> None:
    assert manifest["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert set(manifest["spec"]) <= {"minMember", "queue", "priorityClassName"}
    assert manifest["spec"]["minMember"] == spec.nodes


TRAINJOB_CRD = (TRAINJOB_RELEASES["v2.0.0"], "v1alpha1")  # the recorded objects' release
RELEASE_APIS = {
    "v2.0.0": trainjob.TRAINER_V2_0,
    "v2.1.0": trainjob.TRAINER_V2_1,
    "v2.3.0": trainjob.TRAINER_V2_3,
}


def trainjob_pod(manifest: dict) -> dict:
    """The pod-level parts of a TrainJob as one Pod, for strict kubernetes-validate: the
    trainer container (image, command, args, env, resources) merged with its override
    (envFrom, volumeMounts), and the override's volumes, placement and identity."""
    trainer = manifest["spec"]["trainer"]
    override, _ = pod_parts(manifest)
    (container,) = override["containers"]
    merged = {
        "image": trainer["image"],
        "command": trainer["command"],
        "args": trainer["args"],
        "env": trainer["env"],
        "resources": trainer["resourcesPerNode"],
        **container,
    }
    pod = {"containers": [merged], "volumes": override["volumes"], "restartPolicy": "Never"}
    for key in ("nodeSelector", "affinity", "tolerations", "serviceAccountName", "securityContext"):
        if key in override:
            pod[key] = override[key]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "node", "namespace": manifest["metadata"]["namespace"]},
        "spec": pod,
    }


def check_trainjob(manifest: dict, spec: JobSpec, release: str) -> None:
    crd = (TRAINJOB_RELEASES[release], "v1alpha1")
    crd_validator(*crd).validate(manifest)
    assert unknown_fields(manifest, crd_schema(*crd)) == []
    body = manifest["spec"]
    assert body["runtimeRef"]["name"] == spec.runtime
    assert body["trainer"]["numNodes"] == spec.nodes
    # Trainer's webhook: overrides name the runtime's jobs and containers, never set env on
    # the node container, and the trainer's env leaves torchrun's PET_* to Trainer
    pod, _ = pod_parts(manifest)
    assert all(c["name"] == "node" and "env" not in c for c in pod["containers"])
    assert not any(e["name"].startswith("PET_") for e in body["trainer"]["env"])
    for version in VERSIONS:
        kubernetes_validate.validate(trainjob_pod(manifest), version, strict=True)


@pytest.mark.parametrize("fields", SPECS)
def test_every_manifest_is_valid(fields):
    spec = JobSpec(**fields)
    manifests = render_manifests(spec)
    kinds = [m["kind"] for m in manifests]
    if spec.kind == "pytorchjob":
        assert kinds == ["PyTorchJob"]
    elif spec.kind == "trainjob":
        assert kinds == ["TrainJob"]
    else:
        assert kinds[-1] == "Job" and kinds.count("Service") == 1
    for manifest in manifests:
        if manifest["kind"] == "PyTorchJob":
            check_pytorchjob(manifest)
        elif manifest["kind"] == "TrainJob":
            for release, api in RELEASE_APIS.items():
                try:
                    (for_release,) = render_manifests(spec, api)
                except JobSpecError as exc:  # placement or grace a release cannot carry
                    assert api is not trainjob.CURRENT, exc
                    continue
                check_trainjob(for_release, spec, release)
        elif manifest["kind"] == "PodGroup":
            check_pod_group(manifest, spec)
        else:
            for version in VERSIONS:
                kubernetes_validate.validate(manifest, version, strict=True)


def test_strict_validation_catches_a_misspelled_field():
    """The check above can fail: a typo in a pod spec is reported, in both schema sources."""
    spec = JobSpec(name="train-0123abcd-a1", args=ARGS, nodes=2)
    job = render_manifests(spec)[-1]
    job["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError, match="terminationGracePeriod"):
        kubernetes_validate.validate(job, "1.31", strict=True)
    pj = render_manifests(JobSpec(name="train-0123abcd-a1", args=ARGS, kind="pytorchjob"))[0]
    pj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["restartPolicyy"] = "Never"
    schema = crd_schema("kubeflow.org_pytorchjobs.yaml", "v1")
    bad = {**pj, "spec": {**pj["spec"], "nprocPerNode": 8}}
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        crd_validator("kubeflow.org_pytorchjobs.yaml", "v1").validate(bad)
    assert unknown_fields(pj, schema) == [".spec.pytorchReplicaSpecs.Master.template.spec.restartPolicyy"]
    # Trainer v2.0's TrainJob schema has no affinity or grace period in its pod overrides:
    # were they rendered, the walk would say so
    (tj,) = render_manifests(
        JobSpec(
            name="train-0123abcd-a1",
            args=ARGS,
            kind="trainjob",
            spot_flavour="gke",
            termination_grace_seconds=30,
        ),
        trainjob.TRAINER_V2_0,
    )
    tj["spec"]["podSpecOverrides"][0]["affinity"] = {"nodeAffinity": {}}
    tj["spec"]["podSpecOverrides"][0]["terminationGracePeriodSeconds"] = 60
    assert unknown_fields(tj, crd_schema(*TRAINJOB_CRD)) == [
        ".spec.podSpecOverrides[0].affinity",
        ".spec.podSpecOverrides[0].terminationGracePeriodSeconds",
    ]
    tj["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'integer'"):
        crd_validator(*TRAINJOB_CRD).validate(tj)


@pytest.mark.parametrize("name", ["trainjob-running", "trainjob-succeeded", "trainjob-failed"])
def test_recorded_trainjobs_fit_the_pinned_schema(name):
    """The recorded objects (tests/data/k8s) are shaped as the pinned CRD says."""
    obj = json.loads((Path(__file__).resolve().parents[3] / "data" / "k8s" / f"{name}.json").read_text())
    crd_validator(*TRAINJOB_CRD).validate(obj)
    assert unknown_fields(obj, crd_schema(*TRAINJOB_CRD)) == []


def test_a_trainjob_for_an_old_release_is_pruned_by_a_new_one_and_the_walk_says_so():
    """Why the release matters: a v2.0 TrainJob sent to a v2.3 cluster would lose its pod
    settings (placement, volumes, service account) and its JobSet labels in silence."""
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=ARGS,
        kind="trainjob",
        service_account="trainer",
        termination_grace_seconds=30,
        spot_flavour="karpenter",
    )
    (old,) = render_manifests(spec, trainjob.TRAINER_V2_0)
    assert unknown_fields(old, crd_schema(TRAINJOB_RELEASES["v2.3.0"], "v1alpha1")) == [
        ".spec.labels",
        ".spec.podSpecOverrides",
    ]
    (new,) = render_manifests(spec)
    assert unknown_fields(new, crd_schema(TRAINJOB_RELEASES["v2.0.0"], "v1alpha1")) == [
        ".spec.runtimePatches"
    ]
