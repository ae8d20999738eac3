"""The deploy kit (docker/deploy/): every manifest is valid for the Kubernetes versions we
support (built-in kinds with kubernetes-validate, Kueue and Volcano objects with their CRD
schemas in tests/data/crds/), the Helm values are valid for the official chart's
values.schema.json (tests/data/helm/), the Role grants exactly the API calls the Kubernetes
backend makes (read from its source, so a new call fails here until a rule covers it), and the
S3 policy grants exactly the operations the storage client performs."""

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

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "docker" / "deploy"
DATA = REPO / "tests" / "data"
K8S_SOURCE = REPO / "plugins" / "trainops" / "cluster" / "kubernetes"
VERSIONS = ("1.31", latest_version())
CRDS = {
    ("kueue.x-k8s.io", "ResourceFlavor"): "kueue.x-k8s.io_resourceflavors.yaml",
    ("kueue.x-k8s.io", "ClusterQueue"): "kueue.x-k8s.io_clusterqueues.yaml",
    ("kueue.x-k8s.io", "LocalQueue"): "kueue.x-k8s.io_localqueues.yaml",
    ("scheduling.volcano.sh", "Queue"): "scheduling.volcano.sh_queues.yaml",
}
# The kubernetes client's API group of each client the hook hands out.
CLIENT_GROUPS = {"core_v1_client": "", "batch_v1_client": "batch"}
# A method's resource (its name between the verb and the end) as RBAC spells it.
RESOURCES = {"pod": "pods", "pod_log": "pods/log", "service": "services", "job": "jobs", "node": "nodes"}
VERBS = {"create": "create", "read": "get", "get": "get", "list": "list", "delete": "delete"}
METHOD = re.compile(r"^(?P<verb>[a-z]+)_(?P<namespaced>namespaced_)?(?P<resource>[a-z_]+)$")


def manifests() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(KIT.glob("*.yaml")):
        if path.name == "values.yaml":
            continue
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


@functools.cache
def crd_validator(filename: str, version: str):
    crd = yaml.safe_load((DATA / "crds" / filename).read_text())
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.validators.validator_for(schema)(schema), schema


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Paths in ``obj`` that ``schema`` does not define (neither schema forbids unknown keys
    everywhere, and a misspelt key would otherwise pass)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return []
    if "$ref" in schema:  # the chart's schema points into its Kubernetes definitions
        return []
    out = []
    if isinstance(obj, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None or extra is False:
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


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


@pytest.mark.parametrize(("name", "doc"), manifests(), ids=lambda v: v if isinstance(v, str) else v["kind"])
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


def test_validation_catches_a_misspelt_field():
    """The checks above can fail, for a built-in kind and for a CRD kind alike."""
    role = next(doc for _, doc in manifests() if doc["kind"] == "Role")
    with pytest.raises(kubernetes_validate.ValidationError, match="verb"):
        validate({**role, "rules": [{**role["rules"][0], "verb": ["get"]}]})
    queue = next(doc for _, doc in manifests() if doc["kind"] == "LocalQueue")
    with pytest.raises(AssertionError):
        validate({**queue, "spec": {"clusterQueues": "trainops"}})


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


@pytest.mark.parametrize("path", sorted(KIT.iterdir()), ids=lambda p: p.name)
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


# ----------------------------------------------------------------------------- RBAC


def api_calls() -> set[tuple[str, str, str]]:
    """``(api group, resource, verb)`` of every Kubernetes API method the backend's source
    names (``hook.<client>.<method>``), custom objects once per kind it knows."""
    from trainops.cluster.kubernetes.backend import CUSTOM_KINDS

    calls = set()
    for path in sorted(K8S_SOURCE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)):
                continue
            client, method = node.value.attr, node.attr
            if client == "custom_object_client":
                match = re.fullmatch(r"([a-z]+)_namespaced_custom_object", method)
                assert match, f"{path.name}: unknown custom-object method {method}"
                calls |= {(group, plural, VERBS[match[1]]) for group, _, plural in CUSTOM_KINDS.values()}
            elif client in CLIENT_GROUPS:
                match = METHOD.match(method)
                assert match and match["resource"] in RESOURCES and match["verb"] in VERBS, (
                    f"{path.name}: {client}.{method} is not mapped to an RBAC rule in this test"
                )
                calls.add((CLIENT_GROUPS[client], RESOURCES[match["resource"]], VERBS[match["verb"]]))
    return calls


def granted(kind: str) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for _, doc in manifests()
        if doc["kind"] == kind
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_role_grants_exactly_the_calls_the_backend_makes():
    calls = api_calls()
    assert ("", "pods/log", "get") in calls and ("batch", "jobs", "create") in calls  # the scan sees them
    namespaced = {c for c in calls if c[1] != "nodes"}
    assert granted("Role") == namespaced
    assert granted("ClusterRole") == {c for c in calls if c[1] == "nodes"}


def test_the_rbac_check_fails_on_a_call_no_rule_covers():
    calls = api_calls() | {("", "pods", "delete")}
    assert granted("Role") != {c for c in calls if c[1] != "nodes"}


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
