"""The Kubernetes API access trainops needs, in one place: what the deploy kit grants
(``docker/deploy/base/rbac.yaml`` is rendered from :data:`RULES`), what the docs list, and what
``trainops doctor`` asks the cluster about (one SelfSubjectAccessReview per
:func:`access_checks` entry). ``tests/deploy/test_rbac_kit.py`` reads the API calls out of the
source and fails when a call has no rule here, or a rule no call.

Pure and stdlib only, so the command line can import it without Airflow or the Kubernetes
client. Regenerate the kit's file after changing a rule::

    python -m trainops.cluster.kubernetes.rbac > docker/deploy/base/rbac.yaml
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

NAMESPACE = "namespace"
CLUSTER = "cluster"
# What a rule may be needed for: the JobSpec kinds, and the schedulers (the part of
# ``job_options["scheduler"]`` before ``:``).
USES = ("indexed-job", "pytorchjob", "trainjob", "kueue", "volcano")
LABELS = {"app.kubernetes.io/part-of": "trainops"}
# The kit's job namespace and the Airflow Helm chart's service accounts that call the API
# (release ``airflow`` in namespace ``airflow``: task pods under the KubernetesExecutor, and the
# triggerer polling deferred jobs). docker/deploy/values.yaml names the same accounts.
KIT_NAMESPACE = "ml"
KIT_SUBJECTS = [
    {"kind": "ServiceAccount", "name": "airflow-worker", "namespace": "airflow"},
    {"kind": "ServiceAccount", "name": "airflow-triggerer", "namespace": "airflow"},
]
# YAML 1.1 words a plain scalar must not be (they read as booleans or null)
_KEYWORDS = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}
REGENERATE = "python -m trainops.cluster.kubernetes.rbac > docker/deploy/base/rbac.yaml"


@dataclass(frozen=True)
class Rule:
    """One grant: ``verbs`` on ``group``/``resource``.

    :param group: the API group, ``""`` for the core group.
    :param resource: as RBAC spells it (``jobs``, ``pods/log``).
    :param scope: ``"namespace"`` (a Role in the job namespace) or ``"cluster"`` (a ClusterRole).
    :param required: False when the code works without it, degraded (a 403 is caught once).
    :param why: which code path makes the call, in one line.
    :param needs: the kinds and schedulers (:data:`USES`) that all have to be in use for the
        call to happen; empty: always.
    """

    group: str
    resource: str
    verbs: tuple[str, ...]
    scope: str
    required: bool
    why: str
    needs: tuple[str, ...] = ()


RULES: tuple[Rule, ...] = (
    Rule(
        "batch", "jobs", ("create", "get", "list", "delete"), NAMESPACE, True,
        "kind indexed-job (the default): launch, poll, find a task's jobs, retire",
        ("indexed-job",),
    ),
    Rule(
        "", "services", ("create", "delete"), NAMESPACE, True,
        "kind indexed-job: the headless Service of the rendezvous", ("indexed-job",),
    ),
    Rule(
        "", "pods", ("list",), NAMESPACE, True,
        "every kind: the pods' state (preemption, eviction, image errors)",
    ),
    Rule("", "pods/log", ("get",), NAMESPACE, True, "every kind: node 0's log in the task log"),
    Rule(
        "kubeflow.org", "pytorchjobs", ("create", "get", "list", "delete"), NAMESPACE, True,
        "kind pytorchjob (Training Operator v1)", ("pytorchjob",),
    ),
    Rule(
        "trainer.kubeflow.org", "trainjobs", ("create", "get", "list", "delete"), NAMESPACE, True,
        "kind trainjob (Trainer v2)", ("trainjob",),
    ),
    Rule(
        "scheduling.volcano.sh", "podgroups", ("create", "get", "list", "delete"), NAMESPACE, True,
        'scheduler="volcano" with kind indexed-job: the gang\'s PodGroup', ("indexed-job", "volcano"),
    ),
    Rule(
        "", "nodes", ("get",), CLUSTER, False,
        "the instance type and spot label for the cost report, and a node that vanished",
    ),
    Rule(
        "", "nodes", ("list",), CLUSTER, False,
        "the node pools: a pod request no node can hold is refused before launch; doctor lists them",
    ),
    Rule(
        "apiextensions.k8s.io", "customresourcedefinitions", ("get",), CLUSTER, False,
        "which job CRDs are installed (the TrainJob's version; doctor)",
    ),
    Rule("", "namespaces", ("get",), CLUSTER, False, "doctor: the job namespace exists"),
)  # fmt: skip


def _use(name: str) -> str:
    use = name.partition(":")[0]  # "volcano:trainops" is the scheduler volcano
    if use not in USES:
        raise ValueError(f"unknown kind or scheduler {name!r}: one of {', '.join(USES)}")
    return use


def access_checks(kinds: Iterable[str] | None = None) -> list[tuple[str, str, str, str, bool]]:
    """``(verb, group, resource, scope, required)``, one per verb of :data:`RULES`: what to ask
    in a SelfSubjectAccessReview each (the review's ``resourceAttributes`` take the
    ``pods/log`` form as resource ``pods``, subresource ``log``).

    :param kinds: only the rules these JobSpec kinds and schedulers (:data:`USES`, a scheduler
        may carry its queue: ``"volcano:trainops"``) need, plus those every job needs; None:
        every rule.
    :raises ValueError: a name that is neither a kind nor a scheduler.
    """
    used = None if kinds is None else {_use(k) for k in kinds}
    return [
        (verb, rule.group, rule.resource, rule.scope, rule.required)
        for rule in RULES
        if used is None or set(rule.needs) <= used
        for verb in rule.verbs
    ]


def _rbac_rule(rule: Rule) -> dict[str, Any]:
    return {"apiGroups": [rule.group], "resources": [rule.resource], "verbs": list(rule.verbs)}


def _role_pair(
    kind: str, name: str, namespace: str | None, rules: list[Rule], subjects: list[dict]
) -> list[dict]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {}), "labels": LABELS}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "rules": [_rbac_rule(r) for r in rules],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": f"{kind}Binding",
        "metadata": dict(meta),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [dict(s) for s in subjects],
    }
    return [role, binding]


def role_manifests(namespace: str, subjects: list[dict]) -> list[dict]:
    """The Role and RoleBinding ``trainops`` in ``namespace`` (the namespace-scope rules), and
    the ClusterRole and ClusterRoleBinding ``trainops`` (the cluster-scope ones, all optional),
    binding ``subjects`` (RBAC subjects: ``{"kind": "ServiceAccount", "name", "namespace"}``).
    One RBAC rule per :class:`Rule`, in :data:`RULES` order."""
    namespaced = [r for r in RULES if r.scope == NAMESPACE]
    cluster = [r for r in RULES if r.scope == CLUSTER]
    return _role_pair("Role", "trainops", namespace, namespaced, subjects) + _role_pair(
        "ClusterRole", "trainops", None, cluster, subjects
    )


# -- the kit's file ------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    """A name as it is when YAML reads it back as that string; anything else as JSON."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z][\w./-]*", value) and value.lower() not in _KEYWORDS:
        return value
    return json.dumps(value)


def _yaml(value: Any, indent: int) -> list[str]:
    """Block YAML for the manifests above: maps, lists of maps, scalars, and lists of scalars
    as JSON (which YAML reads as they are)."""
    pad = " " * indent
    lines = []
    for key, item in value.items():
        if isinstance(item, dict):
            lines += [f"{pad}{key}:", *_yaml(item, indent + 2)]
        elif isinstance(item, list) and item and isinstance(item[0], dict):
            lines.append(f"{pad}{key}:")
            for entry in item:
                first, *rest = _yaml(entry, indent + 4)
                lines += [f"{pad}  - {first.lstrip()}", *rest]
        else:
            lines.append(f"{pad}{key}: {json.dumps(item) if isinstance(item, list) else _scalar(item)}")
    return lines


def rbac_yaml(namespace: str = KIT_NAMESPACE, subjects: list[dict] | None = None) -> str:
    """:func:`role_manifests` as the kit's YAML file, each rule under a comment saying why."""
    rules = iter(r for scope in (NAMESPACE, CLUSTER) for r in RULES if r.scope == scope)
    out = [
        "# Generated from plugins/trainops/cluster/kubernetes/rbac.py (RULES): edit the rules there and",
        f"# run `{REGENERATE}`.",
        "# What the Airflow worker and triggerer may do: exactly the calls trainops makes. No watch,",
        "# patch or events: the backend polls with get and list. The ClusterRole is optional: without",
        "# it the backend gets a 403 once, stops asking, and does without (docs/deploying.md).",
    ]
    for manifest in role_manifests(namespace, subjects if subjects is not None else KIT_SUBJECTS):
        out += ["---", *_yaml({k: v for k, v in manifest.items() if k != "rules"}, 0)]
        if "rules" in manifest:
            out.append("rules:")
            for entry in manifest["rules"]:
                rule = next(rules)
                out.append(f"  # {'' if rule.required else 'optional: '}{rule.why}")
                first, *rest = _yaml(entry, 4)
                out += [f"  - {first.lstrip()}", *rest]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(rbac_yaml())
