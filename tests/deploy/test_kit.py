"""The deploy kit (docker/deploy/): every object the kustomizations render (base, each cloud's
overlay, each optional component; see tests/deploy/kustomize.py) and the Airflow Secret template
is valid for the Kubernetes versions we support (built-in kinds with kubernetes-validate; Kueue,
Volcano and Karpenter objects with their CRD schemas in tests/data/crds/), the Helm values are
valid for the official chart's values.schema.json (tests/data/helm/), the IAM policies grant
exactly what the storage client does and trust exactly the service accounts that use them, and
the Secret has one name everywhere. RBAC: test_rbac_kit.py; the overlays: test_overlays.py."""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from tests.deploy.kustomize import render
from trainops.cluster.kubernetes.crd_schema import unknown_fields

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "docker" / "deploy"
DATA = REPO / "tests" / "data"
VERSIONS = ("1.31", latest_version())
CRDS = {
    ("kueue.x-k8s.io", "ResourceFlavor"): "kueue.x-k8s.io_resourceflavors.yaml",
    ("kueue.x-k8s.io", "ClusterQueue"): "kueue.x-k8s.io_clusterqueues.yaml",
    ("kueue.x-k8s.io", "LocalQueue"): "kueue.x-k8s.io_localqueues.yaml",
    ("scheduling.volcano.sh", "Queue"): "scheduling.volcano.sh_queues.yaml",
    ("karpenter.sh", "NodePool"): "karpenter.sh_nodepools.yaml",
    ("karpenter.k8s.aws", "EC2NodeClass"): "karpenter.k8s.aws_ec2nodeclasses.yaml",
}
OVERLAYS = ("eks", "gke", "aks")
COMPONENTS = ("kueue", "volcano")
SECRET_TEMPLATE = KIT / "airflow-secret.yaml"


def renderings() -> dict[str, list[dict]]:
    """What each way to install the kit applies: the base, each overlay, each overlay with each
    component, and the Airflow Secret template."""
    out = {"base": render(KIT / "base")}
    for overlay in OVERLAYS:
        out[overlay] = render(KIT / "overlays" / overlay)
        for component in COMPONENTS:
            out[f"{overlay}+{component}"] = render(
                KIT / "overlays" / overlay, (KIT / "components" / component,)
            )
    out["airflow-secret"] = [doc for doc in yaml.safe_load_all(SECRET_TEMPLATE.read_text()) if doc]
    return out


def manifests() -> list[tuple[str, dict]]:
    """Each distinct object once, named by the first rendering it is in."""
    found, seen = [], set()
    for name, docs in renderings().items():
        for doc in docs:
            key = json.dumps(doc, sort_keys=True)
            if key not in seen:
                seen.add(key)
                found.append((f"{name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


@functools.cache
def crd_validator(filename: str, version: str):
    crd = yaml.safe_load((DATA / "crds" / filename).read_text())
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.validators.validator_for(schema)(schema), schema


def validate(doc: dict) -> None:
    group, _, version = doc["apiVersion"].rpartition("/")
    crd = CRDS.get((group, doc["kind"]))
    if crd is None:
        for k8s in VERSIONS:
            kubernetes_validate.validate(doc, k8s, strict=True)
        return
    validator, schema = crd_validator(crd, version)
    validator.validate(doc)
    assert unknown_fields(doc, schema) == [], doc["metadata"]["name"]


@pytest.mark.parametrize(("name", "doc"), manifests(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_manifest_validates(name, doc):
    validate(doc)


def test_the_kit_has_every_object_the_docs_promise():
    kinds = {doc["kind"] for _, doc in manifests()}
    assert {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    } <= kinds
    assert {"ResourceFlavor", "ClusterQueue", "LocalQueue", "Queue"} <= kinds
    assert {"NodePool", "EC2NodeClass", "Secret"} <= kinds


def test_validation_catches_a_misspelt_field():
    """The checks above can fail, for a built-in kind and for a CRD kind alike."""
    role = next(doc for _, doc in manifests() if doc["kind"] == "Role")
    with pytest.raises(kubernetes_validate.ValidationError, match="verb"):
        validate({**role, "rules": [{**role["rules"][0], "verb": ["get"]}]})
    queue = next(doc for _, doc in manifests() if doc["kind"] == "LocalQueue")
    with pytest.raises(AssertionError):
        validate({**queue, "spec": {"clusterQueues": "trainops"}})
    pool = next(doc for _, doc in manifests() if doc["kind"] == "NodePool")
    template = {
        **pool["spec"]["template"],
        "spec": {**pool["spec"]["template"]["spec"], "expiresAfter": "720h"},
    }
    with pytest.raises(AssertionError):  # Karpenter v1 calls it expireAfter
        validate({**pool, "spec": {**pool["spec"], "template": template}})
    with pytest.raises(jsonschema.ValidationError):
        validate(
            {
                **pool,
                "spec": {
                    **pool["spec"],
                    "disruption": {"consolidationPolicy": "Sometimes", "consolidateAfter": "1m"},
                },
            }
        )


# ----------------------------------------------------------------------------- Helm values


@functools.cache
def chart_schema() -> dict:
    return json.loads((DATA / "helm" / "airflow-values.schema.json").read_text())


def values() -> dict:
    return yaml.safe_load((KIT / "values.yaml").read_text())


def test_the_helm_values_validate_against_the_chart_schema():
    schema = chart_schema()
    jsonschema.Draft7Validator(schema).validate(values())
    assert unknown_fields(values(), schema) == []


def test_the_helm_values_check_can_fail():
    schema = chart_schema()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({**values(), "executor": 3})
    assert unknown_fields({**values(), "workerz": {}}, schema) == [".workerz"]


def test_the_helm_values_install_the_trainops_image_and_hold_no_credential():
    v = values()
    assert v["images"]["airflow"]["repository"].endswith("/trainops-airflow")
    # the chart's Airflow version is the image's (docker/airflow.Dockerfile's base)
    dockerfile = (REPO / "docker" / "airflow.Dockerfile").read_text()
    assert f"apache/airflow:{v['airflowVersion']}-" in dockerfile
    plain = {e["name"] for e in v["env"]}
    assert "AIRFLOW_CONN_AWS_DEFAULT" not in plain  # a connection that may hold keys: a Secret
    assert {s["envName"] for s in v["secret"]} >= {"AIRFLOW_CONN_AWS_DEFAULT"}


@pytest.mark.parametrize(
    "path", sorted(p for p in KIT.rglob("*") if p.is_file()), ids=lambda p: str(p.relative_to(KIT))
)
def test_no_file_of_the_kit_holds_a_credential(path):
    text = path.read_text().lower()
    for word in ("aws_secret_access_key", "aws_access_key_id", "password", "private_key", "-----begin"):
        assert word not in text, f"{path.name} holds {word!r}: credentials come from Secrets"
    assert not re.search(r"(?<![a-z])(token|secret)[ \t]*:[ \t]*\S", text), path.name


def test_the_service_accounts_the_role_binds_are_the_charts():
    v = values()
    bound = {
        (s["name"], s["namespace"])
        for _, doc in manifests()
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in doc["subjects"]
    }
    assert bound == {
        (v["workers"]["serviceAccount"]["name"], "airflow"),
        (v["triggerer"]["serviceAccount"]["name"], "airflow"),
    }


# ----------------------------------------------------------------------------- S3 policy

# boto3 client operation -> the IAM action it needs. The managed ``copy`` is GetObject on the
# source and PutObject (multipart upload parts above its threshold) on the destination.
S3_ACTIONS = {
    "put_object": {"s3:PutObject"},
    "get_object": {"s3:GetObject"},
    "head_object": {"s3:GetObject"},
    "delete_object": {"s3:DeleteObject"},
    "delete_objects": {"s3:DeleteObject"},
    "create_multipart_upload": {"s3:PutObject"},
    "upload_part": {"s3:PutObject"},
    "complete_multipart_upload": {"s3:PutObject"},
    "abort_multipart_upload": {"s3:AbortMultipartUpload"},
    "copy": {"s3:GetObject", "s3:PutObject"},
    "list_objects_v2": {"s3:ListBucket"},
}


def s3_operations() -> set[str]:
    """The boto3 operations the storage client calls (``<client>.<operation>(...)``)."""
    source = (REPO / "trainer" / "storage" / "s3.py").read_text()
    ops = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in ("_client", "client"):
                ops.add(node.func.attr)
    return ops


def test_the_s3_policy_grants_exactly_what_the_storage_client_does():
    ops = s3_operations()
    assert {"put_object", "list_objects_v2", "upload_part"} <= ops  # the scan sees them
    unmapped = ops - set(S3_ACTIONS)
    assert not unmapped, f"map these boto3 operations to IAM actions: {sorted(unmapped)}"
    needed = set().union(*(S3_ACTIONS[op] for op in ops))
    policy = json.loads((KIT / "s3-policy.json").read_text())
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert actions == needed


# ----------------------------------------------------------------------------- IAM trust (IRSA)


def annotated_role(account: dict) -> str:
    return account["annotations"]["eks.amazonaws.com/role-arn"]


def users_of_roles() -> dict[str, set[str]]:
    """IAM role ARN -> the ``system:serviceaccount:NS:NAME`` subjects annotated with it: the
    chart's accounts in values.yaml (namespace airflow) and the kit's in the EKS overlay."""
    users: dict[str, set[str]] = {}
    for component in ("workers", "triggerer", "apiServer"):
        account = values()[component]["serviceAccount"]
        users.setdefault(annotated_role(account), set()).add(
            f"system:serviceaccount:airflow:{account['name']}"
        )
    for doc in render(KIT / "overlays" / "eks"):
        if doc["kind"] == "ServiceAccount":
            meta = doc["metadata"]
            users.setdefault(annotated_role(meta), set()).add(
                f"system:serviceaccount:{meta['namespace']}:{meta['name']}"
            )
    return users


def trusted(policy: dict) -> tuple[str, set[str]]:
    """(OIDC provider, service-account subjects) an IRSA trust policy admits."""
    (statement,) = policy["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity" and statement["Effect"] == "Allow"
    provider = statement["Principal"]["Federated"].split(":oidc-provider/", 1)[1]
    condition = statement["Condition"]["StringEquals"]
    assert condition[f"{provider}:aud"] == "sts.amazonaws.com"
    return provider, set(condition[f"{provider}:sub"])


def trust_policies() -> dict[str, dict]:
    """Role ARN (the account of the policy's provider, the role named by the file) -> policy."""
    out = {}
    for path in sorted(KIT.glob("trust-policy-*.json")):
        policy = json.loads(path.read_text())
        account = policy["Statement"][0]["Principal"]["Federated"].split(":")[4]
        out[f"arn:aws:iam::{account}:role/trainops-{path.stem.removeprefix('trust-policy-')}"] = policy
    return out


def trust_problems(policies: dict[str, dict]) -> list[str]:
    users = users_of_roles()
    problems = [f"{arn}: no trust policy" for arn in users if arn not in policies]
    for arn, policy in policies.items():
        provider, subjects = trusted(policy)
        if subjects != users.get(arn, set()):
            problems.append(f"{arn} trusts {sorted(subjects)}, used by {sorted(users.get(arn, ()))}")
        if not re.fullmatch(r"oidc\.eks\.[a-z0-9-]+\.amazonaws\.com/id/[A-Z0-9]+", provider):
            problems.append(f"{arn}: {provider} is not an EKS OIDC provider")
    return problems


def test_each_irsa_role_trusts_exactly_the_service_accounts_annotated_with_it():
    policies = trust_policies()
    assert set(policies) == {
        "arn:aws:iam::111122223333:role/trainops-airflow",
        "arn:aws:iam::111122223333:role/trainops-trainer",
    }
    assert trust_problems(policies) == []


def test_the_trust_check_catches_a_service_account_the_policy_forgets():
    policies = json.loads(json.dumps(trust_policies()))
    airflow = policies["arn:aws:iam::111122223333:role/trainops-airflow"]["Statement"][0]["Condition"]
    subjects = next(v for k, v in airflow["StringEquals"].items() if k.endswith(":sub"))
    subjects.remove("system:serviceaccount:airflow:airflow-triggerer")
    assert len(trust_problems(policies)) == 1
    assert "airflow-triggerer" in trust_problems(policies)[0]


# ----------------------------------------------------------------------------- the Airflow Secret

SECRET_NAME = "trainops-airflow"


def test_the_secret_template_holds_every_key_the_chart_reads_and_no_credential():
    (secret,) = [doc for doc in yaml.safe_load_all(SECRET_TEMPLATE.read_text()) if doc]
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (SECRET_NAME, "airflow")
    wanted = {(s["secretName"], s["secretKey"]) for s in values()["secret"]}
    assert wanted == {(SECRET_NAME, key) for key in secret["stringData"]}
    connection = json.loads(secret["stringData"]["aws_default"])  # Airflow's JSON connection form
    assert connection == {"conn_type": "aws", "extra": {"region_name": "REGION"}}  # a placeholder


def secret_names(text: str) -> set[str]:
    """The names a text gives the Airflow Secret: ``Secret trainops-...``, ``secretName:``,
    ``create secret generic NAME``."""
    text = re.sub(r"\s+", " ", text)
    return set(
        re.findall(r"Secret `?(trainops-[a-z0-9-]+)", text)
        + re.findall(r"secretName: (\S+)", text)
        + re.findall(r"create secret generic (\S+)", text)
    )


def test_the_airflow_secret_has_one_name_everywhere():
    texts = [p for p in KIT.rglob("*") if p.is_file()] + [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    names = {str(p.relative_to(REPO)): secret_names(p.read_text()) for p in texts}
    assert {n for found in names.values() for n in found} == {SECRET_NAME}, names
    assert secret_names("the connections come from the Secret trainops-connections") == {
        "trainops-connections"
    }
