"""The ``trainjob`` kind: what a Kubeflow Trainer v2 TrainJob carries, and the JobSpecErrors
for what its (pinned) schema cannot say."""

import json
import re
from pathlib import Path

import pytest

from trainops.cluster.kubernetes import names, trainjob
from trainops.cluster.kubernetes.objects import JOB_LABEL
from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec, JobSpecError

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


def render(**kw) -> dict:
    (tj,) = render_manifests(spec(**kw))
    return tj


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
        env_from_secrets=["wandb", {"env": "AWS_SECRET_ACCESS_KEY", "secret": "s3", "key": "secret_key"}],
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
    (override,) = tj["spec"]["podSpecOverrides"]
    (container,) = override["containers"]
    assert container["name"] == "node" and "env" not in container  # Trainer refuses env there
    assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]


def test_cpu_trainjob_has_no_gpu_and_a_plain_process_when_not_distributed():
    trainer = render(distributed=False)["spec"]["trainer"]
    assert trainer["command"] + trainer["args"] == ARGS
    assert "numProcPerNode" not in trainer
    assert "nvidia.com/gpu" not in trainer["resourcesPerNode"]["limits"]


def test_pod_overrides_carry_shm_placement_tolerations_and_identity():
    tj = render(
        gpus_per_node=8,
        shm_size="32Gi",
        service_account="trainer",
        node_selector={"node.kubernetes.io/instance-type": "a3-highgpu-8g"},
        tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    )
    (override,) = tj["spec"]["podSpecOverrides"]
    assert override["targetJobs"] == [{"name": "node"}]
    shm = next(v for v in override["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in override["containers"][0]["volumeMounts"]
    assert override["nodeSelector"] == {
        "cloud.google.com/gke-spot": "true",
        "node.kubernetes.io/instance-type": "a3-highgpu-8g",
    }
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
def test_placement_is_a_node_selector(capacity, flavour, selector):
    override = render(capacity=capacity, spot_flavour=flavour)["spec"]["podSpecOverrides"][0]
    assert override["nodeSelector"] == selector
    spot_taints = [
        t for t in override.get("tolerations", []) if "spot" in t["key"] or "scalesetpriority" in t["key"]
    ]
    assert bool(spot_taints) == (capacity != "on-demand" and flavour == "aks")


def test_labels_kueue_and_suspend():
    tj = render(scheduler="kueue:team-a", labels={"team": "search"}, annotations={"example.com/owner": "ml"})
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
    assert "suspend" not in render()["spec"]


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
        ({"scheduler": "volcano:training"}, "scheduler 'volcano:training'"),
        ({"scheduler": "volcano"}, "schedulerName"),
        ({"priority_class": "batch-low"}, "priority_class 'batch-low'"),
        ({"termination_grace_seconds": 60}, "termination_grace_seconds 60"),
        ({"env": {"PET_NNODES": "3"}}, "'PET_NNODES'"),
        ({"env_from_secrets": [{"env": "PET_MASTER_ADDR", "secret": "s", "key": "k"}]}, "'PET_MASTER_ADDR'"),
        ({"env": {"AWS_SECRET_ACCESS_KEY": "x"}}, "looks like a credential"),
    ],
)
def test_what_a_trainjob_cannot_carry_is_named(fields, needle):
    with pytest.raises(JobSpecError, match=re.escape(needle)):
        render(**fields)


def test_grace_period_beyond_the_stock_runtimes_needs_a_runtime_of_ours():
    with pytest.raises(JobSpecError, match="terminationGracePeriodSeconds") as err:
        render(termination_grace_seconds=120)
    assert "runtime" in str(err.value) and "<= 30" in str(err.value)
    tj = render(termination_grace_seconds=120, runtime="trainops-torch")
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
    # Trainer's pods carry JobSet's labels, not ours: the selector is JobSet's
    pod = json.loads((DATA / "pod-trainjob-running.json").read_text())
    selector = trainjob.pod_selector("train-5f1c2a9e-a1")
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert JOB_LABEL not in pod["metadata"]["labels"]
