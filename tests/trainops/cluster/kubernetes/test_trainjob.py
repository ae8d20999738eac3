"""The ``trainjob`` kind: what a Kubeflow Trainer v2 TrainJob carries on each release's API
(v2.0 ``podSpecOverrides``, v2.1 ``podTemplateOverrides``, v2.2+ ``runtimePatches``), how the
API is read from a CRD, and the JobSpecErrors for what a release's schema cannot say."""

import json
import re
from pathlib import Path

import pytest

from trainops.cluster.kubernetes import crd_schema, names, trainjob
from trainops.cluster.kubernetes.objects import JOB_LABEL
from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec, JobSpecError

from .crds import TRAINJOB_RELEASES, trainjob_crd

ARGS = ["python", "-m", "trainer", "train", "--config", "s3://bucket/runs/r1/config.yaml"]
DATA = Path(__file__).resolve().parents[3] / "data" / "k8s"


def spec(**kw) -> JobSpec:
    return JobSpec(
        **{
            "name": "train-0123abcd-a1",
            "args": ARGS,
            "kind": "trainjob",
            "spot_flavour": "gke",
            "termination_grace_seconds": 30,
            **kw,
        }
    )


V2_0, V2_1, V2_3 = trainjob.TRAINER_V2_0, trainjob.TRAINER_V2_1, trainjob.TRAINER_V2_3
APIS = {"v2.0.0": V2_0, "v2.1.0": V2_1, "v2.3.0": V2_3}


def render(api=trainjob.CURRENT, **kw) -> dict:
    (tj,) = render_manifests(spec(**kw), api)
    return tj


def pod_parts(tj: dict) -> tuple[dict, dict | None]:
    """The pod settings a TrainJob sets on its ``node`` pods, and their metadata, whatever the
    release's shape."""
    body = tj["spec"]
    if "podSpecOverrides" in body:
        (override,) = body["podSpecOverrides"]
        assert override["targetJobs"] == [{"name": "node"}]
        return {k: v for k, v in override.items() if k != "targetJobs"}, None
    if "podTemplateOverrides" in body:
        (override,) = body["podTemplateOverrides"]
        assert override["targetJobs"] == [{"name": "node"}]
        return override["spec"], override["metadata"]
    (patch,) = body["runtimePatches"]
    assert patch["manager"] == trainjob.MANAGER
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    template = job["template"]["spec"]["template"]
    return template["spec"], template["metadata"]


def settings(tj: dict) -> dict:
    return pod_parts(tj)[0]


@pytest.mark.parametrize("release", TRAINJOB_RELEASES)
def test_the_api_is_read_from_each_releases_crd(release):
    """Each release's own CRD file gives the API this code renders for (a field added or
    dropped by a release shows here)."""
    crd = trainjob_crd(release)
    assert trainjob.api_of(crd_schema.served_schema(crd, "v1alpha1"), APIS[release].release) == APIS[release]


def test_a_crd_with_no_known_place_for_pod_settings_is_refused_naming_what_it_has():
    schema = {"properties": {"spec": {"properties": {"trainer": {}, "runtimeRef": {}, "podPatches": {}}}}}
    with pytest.raises(
        JobSpecError, match="none of podSpecOverrides, podTemplateOverrides, runtimePatches"
    ) as err:
        trainjob.api_of(schema)
    assert "podPatches, runtimeRef, trainer" in str(err.value) and "indexed-job" in str(err.value)


def test_current_trainer_gets_runtime_patches_and_never_the_old_fields():
    tj = render(
        gpus_per_node=8, service_account="trainer", termination_grace_seconds=120, labels={"team": "a"}
    )
    body = tj["spec"]
    assert "podSpecOverrides" not in body and "podTemplateOverrides" not in body
    assert "labels" not in body and "annotations" not in body  # gone from TrainJobSpec in v2.2
    pod, meta = pod_parts(tj)
    assert pod["terminationGracePeriodSeconds"] == 120  # v2.3: no runtime of ours needed
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert "nodeSelector" not in pod
    # the pods carry our labels on v2.1 and later
    assert meta["labels"] == {"team": "a", "trainops/job": "train-0123abcd-a1"}


def test_v2_1_gets_pod_template_overrides_with_affinity_but_no_security_context():
    pod, meta = pod_parts(render(V2_1, capacity="on-demand", spot_flavour="gke"))
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "cloud.google.com/gke-spot", "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    assert "securityContext" not in pod and "terminationGracePeriodSeconds" not in pod
    assert meta["labels"]["trainops/job"] == "train-0123abcd-a1"


def test_runtime_trainer_and_torchrun_without_rendezvous_flags():
    tj = render(
        nodes=4,
        gpus_per_node=8,
        namespace="ml",
        image="reg/trainer:1",
        runtime="trainops-torch",
        termination_grace_seconds=120,
    )
    assert (tj["apiVersion"], tj["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert tj["metadata"]["namespace"] == "ml"
    assert tj["spec"]["runtimeRef"] == {
        "name": "trainops-torch",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    trainer = tj["spec"]["trainer"]
    assert (trainer["image"], trainer["numNodes"], trainer["numProcPerNode"]) == ("reg/trainer:1", 4, 8)
    argv = trainer["command"] + trainer["args"]
    assert trainer["command"] == ["python"]  # args set too: a runtime's args never get appended
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert argv[-5:] == ["-m", "trainer", "train", "--config", "s3://bucket/runs/r1/config.yaml"]
    assert "--max-restarts=0" in argv and "--nnodes=4" in argv and "--nproc-per-node=8" in argv
    # rendezvous comes from Trainer's PET_MASTER_ADDR/PORT and PET_NODE_RANK (static backend)
    assert not any(a.startswith("--rdzv") for a in argv)
    timeout = int(next(a for a in argv if a.startswith("--shutdown-timeout=")).split("=")[1])
    assert 0 < timeout < 120


def test_resources_env_and_secret_references():
    tj = render(
        gpus_per_node=8,
        cpu="90",
        memory="640Gi",
        env={"AWS_REGION": "eu-west-1"},
        nccl_env={"NCCL_DEBUG": "WARN"},
        env_from_secrets=[{"env": "AWS_SECRET_ACCESS_KEY", "secret": "s3", "key": "secret_key"}],
    )
    trainer = tj["spec"]["trainer"]
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "90", "memory": "640Gi", "nvidia.com/gpu": "8"},
        "limits": {"memory": "640Gi", "nvidia.com/gpu": "8"},
    }
    env = {e["name"]: e for e in trainer["env"]}
    assert env["AWS_REGION"]["value"] == "eu-west-1" and env["NCCL_DEBUG"]["value"] == "WARN"
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret_key"}},
    }
    (container,) = settings(tj)["containers"]
    assert container["name"] == "node" and "env" not in container  # Trainer refuses env there
    assert "envFrom" not in container  # no release's container patch has it


def test_cpu_trainjob_has_no_gpu_and_a_plain_process_when_not_distributed():
    trainer = render(distributed=False)["spec"]["trainer"]
    assert trainer["command"] + trainer["args"] == ARGS
    assert "numProcPerNode" not in trainer
    assert "nvidia.com/gpu" not in trainer["resourcesPerNode"]["limits"]


@pytest.mark.parametrize("api", APIS.values(), ids=APIS)
def test_pod_settings_carry_shm_placement_tolerations_and_identity(api):
    tj = render(
        api,
        gpus_per_node=8,
        shm_size="32Gi",
        service_account="trainer",
        node_selector={"node.kubernetes.io/instance-type": "a3-highgpu-8g"},
        tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    )
    override = settings(tj)
    shm = next(v for v in override["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in override["containers"][0]["volumeMounts"]
    wanted = [
        {"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]},
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["a3-highgpu-8g"]},
    ]
    if api is V2_0:  # no affinity there: a nodeSelector
        assert override["nodeSelector"] == {
            "cloud.google.com/gke-spot": "true",
            "node.kubernetes.io/instance-type": "a3-highgpu-8g",
        }
    else:
        (term,) = override["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert sorted(term["matchExpressions"], key=str) == sorted(wanted, key=str)
    assert override["tolerations"] == [
        {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert override["serviceAccountName"] == "trainer"


@pytest.mark.parametrize(
    "capacity,flavour,selector",
    [
        ("spot", "karpenter", {"karpenter.sh/capacity-type": "spot"}),
        ("spot", "eks", {"eks.amazonaws.com/capacityType": "SPOT"}),
        ("spot", "aks", {"kubernetes.azure.com/scalesetpriority": "spot"}),
        ("spot-then-on-demand", "karpenter", {"karpenter.sh/capacity-type": "spot"}),
        ("on-demand", "karpenter", {"karpenter.sh/capacity-type": "on-demand"}),
        ("on-demand", "eks", {"eks.amazonaws.com/capacityType": "ON_DEMAND"}),
    ],
)
def test_placement_is_a_node_selector_on_v2_0(capacity, flavour, selector):
    override = settings(render(V2_0, capacity=capacity, spot_flavour=flavour))
    assert override["nodeSelector"] == selector
    spot_taints = [
        t for t in override.get("tolerations", []) if "spot" in t["key"] or "scalesetpriority" in t["key"]
    ]
    assert bool(spot_taints) == (capacity != "on-demand" and flavour == "aks")


@pytest.mark.parametrize("api", [V2_0, V2_1], ids=["v2.0", "v2.1"])
def test_labels_kueue_and_suspend(api):
    tj = render(
        api, scheduler="kueue:team-a", labels={"team": "search"}, annotations={"example.com/owner": "ml"}
    )
    meta, body = tj["metadata"], tj["spec"]
    assert meta["name"] == "train-0123abcd-a1"
    assert meta["labels"] == {
        "team": "search",
        "trainops/job": "train-0123abcd-a1",
        "kueue.x-k8s.io/queue-name": "team-a",
    }
    assert meta["annotations"] == {"example.com/owner": "ml"}
    assert body["suspend"] is True
    # the JobSet gets our labels, but not Kueue's: Kueue would then manage that JobSet too
    assert body["labels"] == {"team": "search", "trainops/job": "train-0123abcd-a1"}
    assert body["annotations"] == {"example.com/owner": "ml"}
    assert "suspend" not in render(api)["spec"]


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"spot_flavour": "auto"}, "spot_flavour 'auto'"),
        ({"capacity": "on-demand", "spot_flavour": "gke"}, "capacity 'on-demand' with spot_flavour 'gke'"),
        ({"capacity": "on-demand", "spot_flavour": "aks"}, "spot_flavour 'aks'"),
        # the fallback a spot-then-on-demand attempt would need later is checked now
        (
            {"capacity": "spot-then-on-demand", "spot_flavour": "gke"},
            "capacity 'on-demand' (the fallback of 'spot-then-on-demand')",
        ),
        ({"affinity": {"podAntiAffinity": {}}}, "JobSpec affinity"),
        (
            {"node_selector": {"cloud.google.com/gke-spot": "false"}},
            "node_selector cloud.google.com/gke-spot='false'",
        ),
        ({"termination_grace_seconds": 60}, "termination_grace_seconds 60"),
    ],
)
def test_what_a_v2_0_trainjob_cannot_carry_is_named_and_later_releases_carry_it(fields, needle):
    """Placement that needs an affinity, and a grace period: refused on v2.0, carried by the
    current release (affinity from v2.1, the grace period from v2.3)."""
    with pytest.raises(JobSpecError, match=re.escape(needle)):
        render(V2_0, **fields)
    if "node_selector" not in fields:  # a contradiction is one in every shape... of affinity too
        assert settings(render(V2_3, **fields))


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"scheduler": "volcano:training"}, "scheduler 'volcano:training'"),
        ({"scheduler": "volcano"}, "schedulerName"),
        ({"priority_class": "batch-low"}, "priority_class 'batch-low'"),
        ({"env": {"PET_NNODES": "3"}}, "'PET_NNODES'"),
        ({"env_from_secrets": [{"env": "PET_MASTER_ADDR", "secret": "s", "key": "k"}]}, "'PET_MASTER_ADDR'"),
        ({"env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "looks like a credential"),
        ({"env_from_secrets": ["wandb"]}, "env_from_secrets 'wandb' (a whole Secret)"),
    ],
)
@pytest.mark.parametrize("api", APIS.values(), ids=APIS)
def test_what_no_trainjob_can_carry_is_named(fields, needle, api):
    with pytest.raises(JobSpecError, match=re.escape(needle)):
        render(api, **fields)


def test_grace_period_beyond_the_stock_runtimes_needs_a_runtime_of_ours_before_v2_3():
    with pytest.raises(JobSpecError, match="terminationGracePeriodSeconds") as err:
        render(V2_1, termination_grace_seconds=120)
    assert "runtime" in str(err.value) and "<= 30" in str(err.value) and "Trainer v2.1" in str(err.value)
    tj = render(V2_1, termination_grace_seconds=120, runtime="trainops-torch")
    args = tj["spec"]["trainer"]["args"]
    assert "--shutdown-timeout=110" in args  # sized from the runtime's stated grace period


def test_bad_runtime_name_is_named():
    with pytest.raises(JobSpecError, match="runtime 'Torch_Distributed'"):
        spec(runtime="Torch_Distributed")


def test_pod_names_fit_and_pods_are_found_by_their_jobset_labels():
    long = spec(name="evaluate-" + "x" * 50 + "-a1", nodes=12)
    job = names.job_name(long)
    hosts = names.pod_hostnames(long)
    assert hosts[0] == f"{job}-node-0-0" and hosts[-1] == f"{job}-node-0-11"
    assert all(len(h) <= 63 for h in hosts) and job[0].isalpha()
    assert render_manifests(long)[0]["metadata"]["name"] == job
    # on v2.0 Trainer's pods carry JobSet's labels, not ours: the selector is JobSet's
    pod = json.loads((DATA / "pod-trainjob-running.json").read_text())
    selector = trainjob.pod_selector("train-5f1c2a9e-a1")
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert JOB_LABEL not in pod["metadata"]["labels"]
