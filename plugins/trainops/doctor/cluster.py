"""What the doctor reads from a Kubernetes cluster, read-only, and the checks it makes of it.

``hook`` is what the backend talks to: an object with ``core_v1_client`` and
``custom_object_client`` (the Airflow ``KubernetesHook``, :class:`trainops.doctor.kube.ClientHook`
for a kubeconfig, or the simulated control plane in tests). Every call has a short timeout, so
an unreachable cluster fails the ``api`` check in seconds instead of hanging.

- ``api`` and ``namespace``: reading the namespace (404: missing; 403: not allowed to look).
- ``rbac <resource>``: a SelfSubjectAccessReview for each verb trainops uses
  (:func:`trainops.cluster.kubernetes.rbac.access_checks`, for the configured kind and
  scheduler), asked as the caller: the identity the backend runs as.
- ``crd <kind>``: the CRDs of the job kinds and queues, read by name (the version served; for
  the TrainJob, which Trainer API its schema has, :func:`.trainjob.api_of`).
- ``spot nodes``, ``gpus``: the node pools (:func:`.pools.pools`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainops.cluster.kubernetes import crd_schema, pools, rbac, trainjob
from trainops.cluster.kubernetes.api_retry import status_of
from trainops.cluster.spec import JobSpecError
from trainops.doctor import checks
from trainops.doctor.checks import Check

TIMEOUT_S = 10  # each API call's; doctor is read-only and meant to be quick
CRD_API = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
REVIEW_API = ("authorization.k8s.io", "v1", "selfsubjectaccessreviews")


@dataclass(frozen=True)
class Target:
    """What the first run will ask of the cluster."""

    namespace: str = "default"
    kind: str = "indexed-job"
    scheduler: str = "default"
    capacity: str = "spot"
    spot_flavour: str = "karpenter"
    gpus_per_node: int = 8


# (label, CRD name, needed by): a kind or scheduler that needs it ("" : informative only)
CRDS = (
    ("PyTorchJob", "pytorchjobs.kubeflow.org", "pytorchjob"),
    ("TrainJob", "trainjobs.trainer.kubeflow.org", "trainjob"),
    ("TrainingRuntime", "clustertrainingruntimes.trainer.kubeflow.org", "trainjob"),
    ("JobSet", "jobsets.jobset.x-k8s.io", "trainjob"),
    ("Kueue", "localqueues.kueue.x-k8s.io", "kueue"),
    ("Volcano", "podgroups.scheduling.volcano.sh", "volcano"),
)


def describe_error(exc: BaseException) -> str:
    """One line for an error from the client: its status and reason, or its class."""
    status = status_of(exc)
    if status is not None:
        return f"{status} {getattr(exc, 'reason', '') or ''}".strip()
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def _needed(target: Target, use: str) -> bool:
    return bool(use) and use in (target.kind, target.scheduler.partition(":")[0])


def reachability(hook: Any, server: str, target: Target) -> list[Check]:
    """``api`` and ``namespace``; an ``api`` failure stops the other cluster checks."""
    try:
        hook.core_v1_client.read_namespace(target.namespace, _request_timeout=TIMEOUT_S)
        found: bool | None = True
    except Exception as exc:
        status = status_of(exc)
        if status == 404:
            found = False
        elif status == 403:
            found = None
        else:
            return [checks.api_check(server, describe_error(exc))]
    return [checks.api_check(server, None), checks.namespace_check(target.namespace, found)]


def access(hook: Any, target: Target) -> list[Check]:
    """The ``rbac`` lines: one SelfSubjectAccessReview per verb trainops uses here."""
    uses = [target.kind] + ([target.scheduler] if target.scheduler != "default" else [])
    wanted = rbac.access_checks(uses)
    answers: dict[tuple[str, str, str], bool] = {}
    for verb, group, resource, scope, _required in wanted:
        name, _, sub = resource.partition("/")
        attributes = {"verb": verb, "group": group, "resource": name}
        if sub:
            attributes["subresource"] = sub
        if scope == rbac.NAMESPACE:
            attributes["namespace"] = target.namespace
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        try:
            review = _plain(
                hook.custom_object_client.create_cluster_custom_object(
                    *REVIEW_API, body, _request_timeout=TIMEOUT_S
                )
            )
        except Exception as exc:
            return [
                Check(
                    "rbac",
                    checks.WARN,
                    f"could not ask access reviews: {describe_error(exc)}",
                    f"kubectl auth can-i --list -n {target.namespace}",
                )
            ]
        answers[(verb, group, resource)] = bool(((review or {}).get("status") or {}).get("allowed"))
    return checks.rbac_checks(answers, wanted)


def _read_crd(hook: Any, name: str) -> dict | None:
    """The CRD ``name``; None when not installed. Raises on anything else (a 403)."""
    try:
        return _plain(
            hook.custom_object_client.get_cluster_custom_object(*CRD_API, name, _request_timeout=TIMEOUT_S)
        )
    except Exception as exc:
        if status_of(exc) == 404:
            return None
        raise


def crds(hook: Any, target: Target) -> list[Check]:
    """The ``crd`` lines: which job kinds and queues the cluster has, at which versions."""
    out: list[Check] = []
    for label, name, use in CRDS:
        try:
            crd = _read_crd(hook, name)
        except Exception as exc:
            return [
                *out,
                Check(
                    "crds",
                    checks.WARN,
                    f"cannot read CRDs: {describe_error(exc)} (optional 'get customresourcedefinitions' rule)",
                    "kubectl get crd | grep -e kubeflow -e jobset -e kueue -e volcano",
                ),
            ]
        versions = crd_schema.served_versions(crd) if crd else None
        extra = ""
        if crd and label == "TrainJob" and trainjob.VERSION not in (versions or []):
            out.append(
                Check(
                    f"crd {label}",
                    checks.FAIL if _needed(target, use) else checks.WARN,
                    f"{name}: serves {', '.join(versions or []) or 'no version'}, not {trainjob.VERSION}",
                    f"install a Kubeflow Trainer release that serves {trainjob.GROUP}/{trainjob.VERSION} (v2.0 to v2.3)",
                )
            )
            continue
        if crd and label == "TrainJob":
            schema = crd_schema.served_schema(crd, trainjob.VERSION)
            try:
                api = trainjob.api_of(schema) if schema else None
            except JobSpecError as exc:
                out.append(
                    Check(
                        f"crd {label}",
                        checks.FAIL,
                        str(exc).split(":")[0],
                        "install Kubeflow Trainer v2.0 or later",
                    )
                )
                continue
            if api is not None:
                extra = f"; pod settings in {api.overrides}"
        out.append(checks.crd_check(label, name, versions, _needed(target, use), extra))
    return out


def node_pools(hook: Any) -> list[pools.Pool] | None:
    """The node pools, or None when nodes cannot be listed (403)."""
    try:
        listed = _plain(hook.core_v1_client.list_node(_request_timeout=TIMEOUT_S))
    except Exception as exc:
        if status_of(exc) == 403:
            return None
        raise
    return pools.pools((listed or {}).get("items") or [])


def cluster_checks(hook: Any, server: str, target: Target) -> list[Check]:
    """Every cluster check, in the table's order. Once the API does not answer, the rest are
    not tried (each would time out)."""
    out = reachability(hook, server, target)
    if out[0].status == checks.FAIL:
        return out
    steps: list[Callable[[], list[Check]]] = [lambda: access(hook, target), lambda: crds(hook, target)]
    for step in steps:
        out += step()
    try:
        found = node_pools(hook)
    except Exception as exc:
        out.append(
            Check("nodes", checks.WARN, f"could not list nodes: {describe_error(exc)}", "kubectl get nodes")
        )
        return out
    out.append(checks.spot_check(found, target.capacity, target.spot_flavour))
    out.append(checks.gpu_check(found, target.gpus_per_node))
    return out
