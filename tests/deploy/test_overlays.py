"""The kit's one-command installs (``kubectl apply -k docker/deploy/overlays/<cloud>``): the
Python rendering equals kubectl's, each overlay binds the trainer to its cloud's identity, and
the spot GPU pools (a Karpenter NodePool; the gcloud and az scripts, run against stand-in
commands that record their arguments) carry the labels and taints trainops's spot placement
selects and tolerates. Object validity is test_kit.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.kustomize import KustomizeError, by_id, kubectl, kubectl_render, render
from trainops.cluster.kubernetes.names import labels
from trainops.cluster.kubernetes.placement import GPU_TOLERATION, SPOT_EXPRESSIONS, SPOT_TOLERATIONS

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "docker" / "deploy"
OVERLAYS = ("eks", "gke", "aks")
IDENTITY = {
    "eks": "eks.amazonaws.com/role-arn",
    "gke": "iam.gke.io/gcp-service-account",
    "aks": "azure.workload.identity/client-id",
}
# Taints each provider puts on spot GPU nodes by itself (docker/deploy/overlays/*/spot-gpu-nodepool.sh)
PROVIDER_TAINTS = {
    "gke": ["nvidia.com/gpu=present:NoSchedule"],
    "aks": ["kubernetes.azure.com/scalesetpriority=spot:NoSchedule"],
}
needs_kubectl = pytest.mark.skipif(kubectl() is None, reason="kubectl is not installed")


def trainer_account(objects: list[dict]) -> dict:
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    return account


# ----------------------------------------------------------------------------- rendering


RENDERINGS = [
    ("base", None),
    *((f"overlays/{o}", None) for o in OVERLAYS),
    *((f"overlays/{o}", "kueue") for o in OVERLAYS),
    ("overlays/gke", "volcano"),
]


@needs_kubectl
@pytest.mark.parametrize(("folder", "component"), RENDERINGS)
def test_the_python_rendering_is_kubectls(folder, component, tmp_path):
    components = (KIT / "components" / component,) if component else ()
    assert by_id(render(KIT / folder, components)) == by_id(
        kubectl_render(KIT / folder, components, tmp_path)
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_is_the_base_plus_the_trainers_cloud_identity(overlay):
    base, rendered = by_id(render(KIT / "base")), by_id(render(KIT / "overlays" / overlay))
    assert set(base) <= set(rendered)
    changed = [key for key in base if base[key] != rendered[key]]
    assert [key[1:] for key in changed] == [("ServiceAccount", "ml", "trainops-trainer")]
    annotations = trainer_account(list(rendered.values()))["metadata"]["annotations"]
    assert list(annotations) == [IDENTITY[overlay]]
    assert "annotations" not in trainer_account(list(base.values()))["metadata"]


def test_the_renderer_refuses_what_it_cannot_render(tmp_path):
    (tmp_path / "sa.yaml").write_text((KIT / "base" / "trainer-serviceaccount.yaml").read_text())
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}

    def attempt(**fields):
        (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({**kustomization, **fields}))
        return render(tmp_path)

    assert attempt(resources=["sa.yaml"])[0]["metadata"]["name"] == "trainops-trainer"
    with pytest.raises(KustomizeError, match="namespace"):
        attempt(resources=["sa.yaml"], namespace="other")  # kustomize's namespace rules are not here
    (tmp_path / "p.yaml").write_text(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: nobody, namespace: ml}\n"
    )
    with pytest.raises(KustomizeError, match="no object"):
        attempt(resources=["sa.yaml"], patches=[{"path": "p.yaml"}])
    (tmp_path / "p.yaml").write_text(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: trainops-trainer, namespace: ml}\n"
        "imagePullSecrets: [{name: x}]\n"
    )
    with pytest.raises(KustomizeError, match="list in a patch"):
        attempt(resources=["sa.yaml"], patches=[{"path": "p.yaml"}])
    with pytest.raises(KustomizeError, match="twice"):
        attempt(resources=["sa.yaml", "sa.yaml"])


# ----------------------------------------------------------------------------- spot GPU pools


def tolerated(taint: str, tolerations: list[dict]) -> bool:
    """Whether a ``key=value:Effect`` (or ``key:Effect``) taint is tolerated, by Kubernetes' rule."""
    key_value, effect = taint.rsplit(":", 1)
    key, _, value = key_value.partition("=")
    return any(
        t["key"] == key
        and t.get("effect", effect) == effect
        and (t["operator"] == "Exists" or t.get("value", "") == value)
        for t in tolerations
    )


def spot_gpu_tolerations(flavour: str) -> list[dict]:
    """What a spot GPU job's pods tolerate with ``spot_flavour=flavour`` (placement.py)."""
    return [GPU_TOLERATION, *SPOT_TOLERATIONS.get(flavour, [])]


def test_the_karpenter_pool_is_spot_gpu_capacity_that_spot_jobs_land_on():
    (pool,) = [o for o in render(KIT / "overlays" / "eks") if o["kind"] == "NodePool"]
    spec = pool["spec"]["template"]["spec"]
    requirements = {r["key"]: r for r in spec["requirements"]}
    spot = SPOT_EXPRESSIONS["karpenter"]
    assert (
        requirements[spot["key"]]["operator"] == "In"
        and requirements[spot["key"]]["values"] == spot["values"]
    )
    assert {"p4d", "p5", "g5"} <= set(requirements["karpenter.k8s.aws/instance-family"]["values"])
    taints = [f"{t['key']}{'=' + t['value'] if 'value' in t else ''}:{t['effect']}" for t in spec["taints"]]
    assert taints and all(tolerated(t, spot_gpu_tolerations("karpenter")) for t in taints)
    nodeclass = next(o for o in render(KIT / "overlays" / "eks") if o["kind"] == "EC2NodeClass")
    assert spec["nodeClassRef"] == {
        "group": "karpenter.k8s.aws",
        "kind": "EC2NodeClass",
        "name": nodeclass["metadata"]["name"],
    }


def test_the_toleration_check_catches_a_taint_no_pod_tolerates():
    assert tolerated("nvidia.com/gpu=present:NoSchedule", spot_gpu_tolerations("gke"))
    assert not tolerated("example.com/reserved=ml:NoSchedule", spot_gpu_tolerations("gke"))
    assert not tolerated(
        "kubernetes.azure.com/scalesetpriority=spot:NoSchedule", spot_gpu_tolerations("karpenter")
    )


def run_script(
    script: Path, env: dict[str, str], tmp_path: Path
) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run a kit script with ``gcloud`` and ``az`` replaced by stand-ins that record their
    arguments (and answer ``--query`` questions with a URL); returns the commands it ran."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir(exist_ok=True)
    for name in ("gcloud", "az"):
        stub = bin_dir / name
        stub.write_text(
            f"#!{sys.executable}\nimport json, os, sys\n"
            f"open({str(calls)!r}, 'a').write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + '\\n')\n"
            "if '--query' in sys.argv: print('https://issuer.example/abc/')\n"
        )
        stub.chmod(0o755)
    result = subprocess.run(
        ["bash", str(script)],
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    recorded = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return result, recorded


def flag(argv: list[str], name: str) -> str:
    """The value of ``--name=value`` or ``--name value``."""
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return argv[i + 1]
    raise AssertionError(f"{name} missing from {argv}")


SCRIPT_ENV = {
    "gke": {
        "PROJECT_ID": "my-project",
        "CLUSTER": "my-cluster",
        "LOCATION": "us-central1",
        "BUCKET": "my-trainops-bucket",
    },
    "aks": {"RESOURCE_GROUP": "my-rg", "CLUSTER": "my-cluster"},
}


@pytest.mark.parametrize("cloud", ["gke", "aks"])
def test_the_spot_gpu_pool_script_makes_a_scale_from_zero_spot_pool_spot_jobs_land_on(cloud, tmp_path):
    result, calls = run_script(KIT / "overlays" / cloud / "spot-gpu-nodepool.sh", SCRIPT_ENV[cloud], tmp_path)
    assert result.returncode == 0, result.stderr
    (argv,) = calls
    if cloud == "gke":
        assert argv[:4] == ["gcloud", "container", "node-pools", "create"] and "--spot" in argv
        assert "gpu-driver-version=latest" in flag(argv, "--accelerator")
        assert flag(argv, "--workload-metadata") == "GKE_METADATA"  # Workload Identity on the nodes
        min_nodes, taints = flag(argv, "--min-nodes"), flag(argv, "--node-taints").split(",")
    else:
        assert argv[:4] == ["az", "aks", "nodepool", "add"] and flag(argv, "--priority") == "Spot"
        assert flag(argv, "--eviction-policy") == "Delete"
        min_nodes, taints = flag(argv, "--min-count"), flag(argv, "--node-taints").split(",")
    assert min_nodes == "0"  # no GPU node bills while no job runs
    for taint in taints + PROVIDER_TAINTS[cloud]:
        assert tolerated(taint, spot_gpu_tolerations(cloud)), f"{taint}: spot jobs would never land"


@pytest.mark.parametrize("cloud", ["gke", "aks"])
def test_the_scripts_stop_before_any_command_when_a_setting_is_missing(cloud, tmp_path):
    for script in sorted((KIT / "overlays" / cloud).glob("*.sh")):
        result, calls = run_script(script, {}, tmp_path)
        assert result.returncode != 0 and calls == [], script.name
        assert "set " in result.stderr  # "RESOURCE_GROUP: set RESOURCE_GROUP"


def test_gke_workload_identity_binds_the_overlays_service_account_to_its_annotated_google_account(tmp_path):
    result, calls = run_script(KIT / "overlays" / "gke" / "workload-identity.sh", SCRIPT_ENV["gke"], tmp_path)
    assert result.returncode == 0, result.stderr
    meta = trainer_account(render(KIT / "overlays" / "gke"))["metadata"]
    google_account = meta["annotations"][IDENTITY["gke"]]
    bindings = {
        (argv[4], flag(argv, "--member"))
        for argv in calls
        if argv[1:4] == ["iam", "service-accounts", "add-iam-policy-binding"]
        and flag(argv, "--role") == "roles/iam.workloadIdentityUser"
    }
    assert (
        google_account,
        f"serviceAccount:my-project.svc.id.goog[{meta['namespace']}/{meta['name']}]",
    ) in bindings
    # the chart's accounts (values.yaml) get the Airflow one
    values = yaml.safe_load((KIT / "values.yaml").read_text())
    for component in ("workers", "triggerer", "apiServer"):
        member = (
            f"serviceAccount:my-project.svc.id.goog[airflow/{values[component]['serviceAccount']['name']}]"
        )
        assert ("trainops-airflow@my-project.iam.gserviceaccount.com", member) in bindings
    storage = [a for a in calls if a[1:4] == ["storage", "buckets", "add-iam-policy-binding"]]
    assert {flag(a, "--role") for a in storage} == {"roles/storage.objectUser"}


def test_aks_workload_identity_trusts_the_overlays_service_account(tmp_path):
    result, calls = run_script(KIT / "overlays" / "aks" / "workload-identity.sh", SCRIPT_ENV["aks"], tmp_path)
    assert result.returncode == 0, result.stderr
    meta = trainer_account(render(KIT / "overlays" / "aks"))["metadata"]
    (federation,) = [a for a in calls if a[1:4] == ["identity", "federated-credential", "create"]]
    assert flag(federation, "--subject") == f"system:serviceaccount:{meta['namespace']}:{meta['name']}"
    assert flag(federation, "--issuer") == "https://issuer.example/abc/"  # the cluster's, as az printed it
    assert flag(federation, "--audience") == "api://AzureADTokenExchange"


def test_the_pod_label_azure_workload_identity_needs_passes_the_label_check():
    """AKS injects the identity only into pods labelled azure.workload.identity/use: "true",
    which the docs have users set through job_options labels."""
    assert labels({"azure.workload.identity/use": "true"}) == {"azure.workload.identity/use": "true"}
    docs = (REPO / "docs" / "deploying.md").read_text()
    assert '"labels": {"azure.workload.identity/use": "true"}' in docs
