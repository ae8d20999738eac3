"""The access rules: what each job kind needs, the checks doctor asks about, and the Role and
ClusterRole they become. Whether the rules match the code's calls, the kit's file and the docs
is tests/deploy/test_rbac_kit.py."""

import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from trainops.cluster.kubernetes import rbac

SUBJECTS = [{"kind": "ServiceAccount", "name": "airflow-worker", "namespace": "airflow"}]


def checks(kinds=None):
    return {(verb, group, resource) for verb, group, resource, _, _ in rbac.access_checks(kinds)}


def test_one_check_per_verb_of_every_rule():
    all_checks = rbac.access_checks()
    assert len(all_checks) == sum(len(r.verbs) for r in rbac.RULES)
    assert ("create", "batch", "jobs", "namespace", True) in all_checks
    assert ("get", "", "pods/log", "namespace", True) in all_checks
    assert ("get", "", "nodes", "cluster", False) in all_checks  # optional: the backend degrades


def test_the_rules_doctor_and_the_node_pool_check_need_are_optional_cluster_rules():
    cluster = {(v, g, r): req for v, g, r, scope, req in rbac.access_checks() if scope == "cluster"}
    assert cluster == {
        ("get", "", "nodes"): False,
        ("list", "", "nodes"): False,
        ("get", "apiextensions.k8s.io", "customresourcedefinitions"): False,
        ("get", "", "namespaces"): False,
    }


def test_no_rule_grants_watch_patch_events_or_pod_delete():
    """The backend polls and deletes jobs, never pods: a wider grant would be unused power."""
    everything = checks()
    assert not {v for v, _, _ in everything} & {"watch", "patch", "update", "deletecollection", "*"}
    assert not {r for _, _, r in everything} & {"events", "secrets", "*"}
    assert ("delete", "", "pods") not in everything


def test_a_kind_needs_its_own_objects_and_what_every_kind_needs():
    pytorch = checks(["pytorchjob"])
    assert ("create", "kubeflow.org", "pytorchjobs") in pytorch
    assert ("list", "", "pods") in pytorch and ("get", "", "pods/log") in pytorch
    assert ("create", "batch", "jobs") not in pytorch
    assert ("create", "trainer.kubeflow.org", "trainjobs") not in pytorch
    assert ("create", "", "services") in checks(["indexed-job"])


def test_the_podgroup_rule_needs_both_volcano_and_an_indexed_job():
    podgroup = ("create", "scheduling.volcano.sh", "podgroups")
    assert podgroup in checks(["indexed-job", "volcano:trainops"])  # the queue is no kind
    assert podgroup not in checks(["indexed-job"])
    assert podgroup not in checks(["pytorchjob", "volcano"])  # the Training Operator makes its own
    assert checks(["indexed-job", "kueue"]) == checks(["indexed-job"])  # Kueue needs no rule


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'pytorch-job'.*indexed-job, pytorchjob, trainjob"):
        rbac.access_checks(["pytorch-job"])


def test_role_manifests_split_the_rules_by_scope_and_bind_the_subjects():
    role, binding, cluster_role, cluster_binding = rbac.role_manifests("jobs-ns", SUBJECTS)
    assert (role["kind"], role["metadata"]["namespace"]) == ("Role", "jobs-ns")
    assert "namespace" not in cluster_role["metadata"]
    granted = {
        (verb, group, resource, doc["kind"])
        for doc in (role, cluster_role)
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    expected = {
        (v, g, r, "Role" if s == "namespace" else "ClusterRole") for v, g, r, s, _ in rbac.access_checks()
    }
    assert granted == expected
    for bound, kind in ((binding, "Role"), (cluster_binding, "ClusterRole")):
        assert bound["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": "trainops"}
        assert bound["subjects"] == SUBJECTS


@pytest.mark.parametrize("doc", rbac.role_manifests("ml", SUBJECTS), ids=lambda d: d["kind"])
def test_role_manifests_are_valid_kubernetes_objects(doc):
    kubernetes_validate.validate(doc, "1.31", strict=True)


def test_the_yaml_file_reads_back_as_the_manifests_with_a_reason_per_rule():
    text = rbac.rbac_yaml("ml", SUBJECTS)
    assert [d for d in yaml.safe_load_all(text) if d] == rbac.role_manifests("ml", SUBJECTS)
    for rule in rbac.RULES:
        assert f"# {'' if rule.required else 'optional: '}{rule.why}\n" in text
    assert rbac.REGENERATE in text


def test_the_yaml_quotes_what_would_not_read_back_as_a_string():
    text = "\n".join(rbac._yaml({"a": "on", "b": "", "c": "x y", "d": "plain-name/v1"}, 0))
    assert yaml.safe_load(text) == {"a": "on", "b": "", "c": "x y", "d": "plain-name/v1"}


def test_the_module_prints_the_kits_file():
    result = subprocess.run(
        [sys.executable, "-m", "trainops.cluster.kubernetes.rbac"], capture_output=True, text=True, check=True
    )
    assert result.stdout == rbac.rbac_yaml()


def test_rbac_imports_nothing_but_the_standard_library():
    code = "import sys, trainops.cluster.kubernetes.rbac; print(sorted(m for m in ('airflow', 'kubernetes', 'torch', 'yaml') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
