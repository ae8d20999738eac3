"""One source of RBAC truth: ``trainops.cluster.kubernetes.rbac.RULES`` covers exactly the
Kubernetes API calls in the source (read from it, so a new call fails here until a rule covers
it), the kit's ``base/rbac.yaml`` is what ``rbac.py`` renders, and the docs list the rules as
they are."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path

import pytest
import yaml

from trainops.cluster.kubernetes import rbac

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "plugins" / "trainops"
RBAC_YAML = REPO / "docker" / "deploy" / "base" / "rbac.yaml"
# Kubernetes client method -> (api group, resource, verb) it needs. None: allowed to every
# authenticated user by the default ClusterRole system:basic-user, so no rule.
METHODS: dict[str, tuple[str, str, str] | None] = {
    "create_namespaced_job": ("batch", "jobs", "create"),
    "read_namespaced_job": ("batch", "jobs", "get"),
    "list_namespaced_job": ("batch", "jobs", "list"),
    "delete_namespaced_job": ("batch", "jobs", "delete"),
    "create_namespaced_service": ("", "services", "create"),
    "delete_namespaced_service": ("", "services", "delete"),
    "list_namespaced_pod": ("", "pods", "list"),
    "read_namespaced_pod_log": ("", "pods/log", "get"),
    "read_node": ("", "nodes", "get"),
    "list_node": ("", "nodes", "list"),
    "read_namespace": ("", "namespaces", "get"),
    "read_custom_resource_definition": ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
    "create_self_subject_access_review": None,
}
# Custom-object methods: the verb; the group and plural come from the kinds the backend knows
# (namespaced) or from the call's arguments (cluster-scoped).
CUSTOM_VERBS = {"create": "create", "get": "get", "list": "list", "delete": "delete"}
# Calls that need no rule: every authenticated user may ask what it may do (the default
# ClusterRole system:basic-user), however the client makes the call.
NO_RULE = {("authorization.k8s.io", "selfsubjectaccessreviews", "create")}


@functools.cache
def kubernetes_methods() -> frozenset[str]:
    """Every method of the kubernetes client's API classes: what makes an attribute a call."""
    import kubernetes.client.api

    return frozenset(
        name
        for _, cls in inspect.getmembers(kubernetes.client.api, inspect.isclass)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_") and not name.endswith("_with_http_info")
    )


def _module_constant(path: Path, name: str):
    module = ast.parse(path.read_text())
    for node in module.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name}: cannot read {name}")


def _cluster_object(call: ast.Call, path: Path) -> tuple[str, str]:
    """(group, plural) of a ``*_cluster_custom_object(group, version, plural, ...)`` call, the
    first three either literal or a module-level tuple passed as ``*NAME``."""
    first = call.args[0]
    if isinstance(first, ast.Starred) and isinstance(first.value, ast.Name):
        group, _, plural = _module_constant(path, first.value.id)[:3]
    else:
        group, _, plural = (ast.literal_eval(a) for a in call.args[:3])
    return group, plural


def calls_in(path: Path) -> set[tuple[str, str, str]]:
    """``(group, resource, verb)`` of every Kubernetes API method ``path`` names."""
    from trainops.cluster.kubernetes.backend import CUSTOM_KINDS

    tree = ast.parse(path.read_text())
    found: set[tuple[str, str, str]] = set()
    # calls made through a wrapper (``self._call(what, client.method, *args)``) pass the method
    # as an argument: map each method attribute to the call that carries its arguments
    carriers = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for i, arg in enumerate(node.args):
                if isinstance(arg, ast.Attribute):
                    carriers[id(arg)] = ast.Call(func=arg, args=node.args[i + 1 :], keywords=node.keywords)
            if isinstance(node.func, ast.Attribute):
                carriers.setdefault(id(node.func), node)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in kubernetes_methods():
            continue
        method = node.attr
        namespaced = re.fullmatch(r"([a-z]+)_namespaced_custom_object", method)
        cluster = re.fullmatch(r"([a-z]+)_cluster_custom_object", method)
        if namespaced:
            found |= {(g, plural, CUSTOM_VERBS[namespaced[1]]) for g, _, plural in CUSTOM_KINDS.values()}
        elif cluster:
            assert id(node) in carriers, f"{path.name}: {method} without its arguments"
            group, plural = _cluster_object(carriers[id(node)], path)
            found.add((group, plural, CUSTOM_VERBS[cluster[1]]))
        else:
            assert method in METHODS, f"{path.name}: {method} is not mapped to an RBAC rule in this test"
            if METHODS[method] is not None:
                found.add(METHODS[method])
    return found


def api_calls() -> set[tuple[str, str, str]]:
    """The calls of every module of the Airflow side (the backend, the command line, ...)."""
    return set().union(*(calls_in(p) for p in sorted(SOURCE.rglob("*.py")))) - NO_RULE


def rules() -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for verb, group, resource, _, _ in rbac.access_checks()}


def test_every_api_call_in_the_source_has_a_rule():
    calls = api_calls()
    assert ("", "pods/log", "get") in calls and ("batch", "jobs", "create") in calls  # the scan sees them
    assert ("kubeflow.org", "pytorchjobs", "delete") in calls  # and the custom objects
    missing = calls - rules()
    assert not missing, f"add these to RULES in rbac.py, then run `{rbac.REGENERATE}`: {sorted(missing)}"


def test_every_rule_is_a_call_the_source_makes():
    unused = rules() - api_calls()
    assert not unused, f"RULES grants what no code calls; remove it from rbac.py: {sorted(unused)}"


def test_the_scan_finds_a_call_no_rule_covers_and_one_it_cannot_map(tmp_path):
    uncovered = tmp_path / "uncovered.py"
    uncovered.write_text("def f(hook):\n    hook.core_v1_client.delete_namespaced_pod('p', 'ml')\n")
    with pytest.raises(AssertionError, match="delete_namespaced_pod is not mapped"):
        calls_in(uncovered)
    wrapped = tmp_path / "wrapped.py"
    wrapped.write_text(
        "CRD = ('apiextensions.k8s.io', 'v1', 'customresourcedefinitions')\n"
        "def f(self):\n    self._call('x', self.hook.custom_object_client.get_cluster_custom_object, *CRD, 'n')\n"
        "    self.hook.core_v1_client.list_node()\n"
    )
    assert calls_in(wrapped) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
        ("", "nodes", "list"),
    }
    assert not calls_in(wrapped) <= rules() - {("", "nodes", "list")}  # a call without its rule shows


# ----------------------------------------------------------------------------- the kit's file


def test_the_kits_rbac_yaml_is_what_rbac_py_renders():
    text = RBAC_YAML.read_text()
    fix = f"docker/deploy/base/rbac.yaml is stale: run `{rbac.REGENERATE}`"
    kit = [doc for doc in yaml.safe_load_all(text) if doc]
    assert kit == rbac.role_manifests(rbac.KIT_NAMESPACE, rbac.KIT_SUBJECTS), fix
    assert text == rbac.rbac_yaml(), fix  # the comments too


def test_a_rule_added_without_regenerating_the_kit_fails(monkeypatch):
    extra = rbac.Rule("", "configmaps", ("get",), rbac.NAMESPACE, True, "a new call")
    monkeypatch.setattr(rbac, "RULES", (*rbac.RULES, extra))
    kit = [doc for doc in yaml.safe_load_all(RBAC_YAML.read_text()) if doc]
    assert kit != rbac.role_manifests(rbac.KIT_NAMESPACE, rbac.KIT_SUBJECTS)


# ----------------------------------------------------------------------------- the docs

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VERBS = ("create", "get", "list", "watch", "delete", "patch", "update", "deletecollection")
_VERB_LIST = rf"(?:{'|'.join(VERBS)})(?:(?:, | and |/| or )(?:{'|'.join(VERBS)}))*"


def rbac_table() -> str:
    """The table docs/deploying.md holds between ``<!-- rbac:begin -->`` and ``<!-- rbac:end -->``:
    one row per scope, group and resource, its verbs and why."""
    rows: dict[tuple[str, str, str], tuple[list[str], list[str]]] = {}
    for rule in rbac.RULES:
        verbs, whys = rows.setdefault((rule.scope, rule.group, rule.resource), ([], []))
        verbs += [v for v in rule.verbs if v not in verbs]
        whys.append(rule.why if rule.required else f"optional: {rule.why}")
    lines = ["| rule | for |", "| --- | --- |"]
    for (scope, group, resource), (verbs, whys) in rows.items():
        prefix = "ClusterRole " if scope == rbac.CLUSTER else ""
        group_part = f"`{group}` " if group else ""
        lines.append(f"| {prefix}{group_part}`{resource}`: {', '.join(verbs)} | {'; '.join(whys)} |")
    return "\n".join(lines)


def test_the_deploying_guide_shows_the_rules_table_rendered_from_rbac_py():
    text = (REPO / "docs" / "deploying.md").read_text()
    match = re.search(r"<!-- rbac:begin -->\n(.*?)\n<!-- rbac:end -->", text, re.S)
    assert match, "docs/deploying.md has no <!-- rbac:begin --> ... <!-- rbac:end --> table"
    assert match[1] == rbac_table(), f"replace the table in docs/deploying.md with:\n{rbac_table()}"


def verb_mentions(text: str) -> list[tuple[str, set[str]]]:
    """``(resource, verbs)`` wherever a doc says ```resource`: verbs`` or ``verbs on `resource```."""
    text = re.sub(r"\s+", " ", text)
    found = [
        (r, set(re.findall("|".join(VERBS), v)))
        for r, v in re.findall(rf"`([a-z/]+)`:? ({_VERB_LIST})\b", text)
    ]
    found += [
        (r, set(re.findall("|".join(VERBS), v)))
        for v, r in re.findall(rf"\b({_VERB_LIST}) on `([a-z/]+)`", text)
    ]
    return found


def granted_verbs() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for verb, _, resource, _, _ in rbac.access_checks():
        out.setdefault(resource, set()).add(verb)
    return out


def wrong_mentions(text: str) -> list[str]:
    granted = granted_verbs()
    return [
        f"`{resource}`: {sorted(verbs)}, RULES grant {sorted(granted.get(resource, ()))}"
        for resource, verbs in verb_mentions(text)
        if not verbs <= granted.get(resource, set())
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_doc_grants_a_verb_the_rules_do_not(doc):
    assert wrong_mentions(doc.read_text()) == []


def test_the_doc_check_catches_watch_events_and_pod_delete():
    """What the issue found in an old README: verbs the backend never uses."""
    assert wrong_mentions("create/get/list/watch/delete on `pods`, and get, list on `events`") == [
        "`pods`: ['create', 'delete', 'get', 'list', 'watch'], RULES grant ['list']",
        "`events`: ['get', 'list'], RULES grant []",
    ]
    assert wrong_mentions("| `batch` `jobs`: create, get, list, delete | kind |") == []
