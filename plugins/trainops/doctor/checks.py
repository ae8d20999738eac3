"""The doctor's checks as pure functions: facts in, one :class:`Check` out each.

Each failing check names what it found and the fix. A check that could not be made (the
facts could not be read) is ``warn``, with what would let it run; only ``fail`` makes the
doctor exit non-zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainops.cluster.kubernetes.pools import Pool
from trainops.cluster.spec import shutdown_timeout
from trainops.recovery.notice import needed_seconds

PASS, FAIL, WARN, INFO = "pass", "fail", "warn", "info"
APPLY_KIT = "kubectl apply -k docker/deploy/overlays/<eks|gke|aks> (docs/deploying.md)"

# The seconds a spot pod has between SIGTERM and the VM going, by spot flavour, when the
# provider's notice is turned into SIGTERM (docs/kubernetes.md, "Spot notice windows").
PROVIDER_WINDOW_S = {
    "gke": (15, "GKE Spot gives non-system pods 15 s by default"),
    "karpenter": (120, "EC2 Spot's 2-minute notice, through Karpenter's interruption queue"),
    "eks": (120, "EC2 Spot's 2-minute notice, through the Node Termination Handler"),
    "aks": (30, "Azure's Preempt event comes at least 30 s ahead"),
}
SPOT_NODE_FIX = {
    "karpenter": "a Karpenter NodePool allowing karpenter.sh/capacity-type spot (docker/deploy/overlays/eks)",
    "eks": "an EKS managed node group with capacityType SPOT",
    "gke": "a GKE node pool with --spot (docker/deploy/overlays/gke)",
    "aks": "an AKS node pool with --priority Spot (docker/deploy/overlays/aks)",
}


@dataclass(frozen=True)
class Check:
    """One line of the doctor's table."""

    name: str
    status: str  # pass, fail, warn, info
    detail: str
    fix: str = ""

    def line(self, width: int = 18) -> str:
        text = f"{self.status.upper():<5} {self.name:<{width}} {self.detail}"
        return f"{text}\n{'':<{width + 6}}fix: {self.fix}" if self.fix else text


def failed(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL]


def api_check(server: str, error: str | None) -> Check:
    """The API server answered (``error`` None) or not."""
    if error is None:
        return Check("api", PASS, f"{server} answers")
    return Check(
        "api",
        FAIL,
        f"{server}: {error}",
        "check the kubeconfig's server and credentials (kubectl cluster-info), or the Airflow "
        "Kubernetes connection; a VPN or a private endpoint may be needed",
    )


def namespace_check(namespace: str, found: bool | None) -> Check:
    """``found``: True, False (404), None (not allowed to read namespaces)."""
    if found:
        return Check("namespace", PASS, f"{namespace} exists")
    if found is None:
        return Check(
            "namespace",
            WARN,
            f"{namespace}: not allowed to read namespaces (optional 'get namespaces' rule)",
            f"kubectl get namespace {namespace}",
        )
    return Check(
        "namespace",
        FAIL,
        f"{namespace} does not exist",
        f"kubectl create namespace {namespace}, or {APPLY_KIT}",
    )


def rbac_checks(
    reviews: Mapping[tuple[str, str, str], bool], wanted: Sequence[tuple[str, str, str, str, bool]]
) -> list[Check]:
    """One line per resource: the verbs the service account may not use. ``reviews``: the
    SelfSubjectAccessReview answer for each ``(verb, group, resource)`` of ``wanted``
    (:func:`trainops.cluster.kubernetes.rbac.access_checks`)."""
    by_resource: dict[tuple[str, str], list[tuple[str, bool]]] = {}
    for verb, group, resource, _scope, required in wanted:
        by_resource.setdefault((group, resource), []).append((verb, required))
    out = []
    for (group, resource), verbs in by_resource.items():
        name = f"rbac {resource}"
        where = f"{resource}.{group}" if group else resource
        missing = [(v, r) for v, r in verbs if not reviews.get((v, group, resource), False)]
        if not missing:
            out.append(Check(name, PASS, f"{where}: {' '.join(v for v, _ in verbs)}"))
            continue
        must = [v for v, r in missing if r]
        names = " ".join(v for v, _ in missing)
        if must:
            out.append(
                Check(
                    name,
                    FAIL,
                    f"{where}: may not {names}",
                    f"grant trainops' Role: {APPLY_KIT}, or python -m trainops.cluster.kubernetes.rbac",
                )
            )
        else:
            out.append(
                Check(
                    name,
                    WARN,
                    f"{where}: may not {names} (optional)",
                    "docker/deploy/base/rbac.yaml has the rule",
                )
            )
    return out


def crd_check(kind: str, what: str, versions: list[str] | None, needed: bool, extra: str = "") -> Check:
    """One CRD: installed (``versions`` served) or not (None). ``needed``: the configured kind
    or scheduler uses it (missing: fail), else missing is information."""
    name = f"crd {kind}"
    if versions:
        return Check(name, PASS, f"{what}: serves {', '.join(versions)}{extra}")
    if needed:
        return Check(name, FAIL, f"{what}: not installed", "install it, or choose another kind/scheduler")
    return Check(name, INFO, f"{what}: not installed (not needed by this configuration)")


def spot_check(pools: list[Pool] | None, capacity: str, flavour: str) -> Check:
    """Spot nodes for ``flavour``, when the configuration starts on spot."""
    if capacity == "on-demand":
        return Check("spot nodes", INFO, "capacity on-demand: spot not used")
    if pools is None:
        return Check(
            "spot nodes",
            WARN,
            "cannot list nodes (optional 'list nodes' rule)",
            "kubectl get nodes -L karpenter.sh/capacity-type,cloud.google.com/gke-spot,kubernetes.azure.com/scalesetpriority",
        )
    spot = [p for p in pools if p.capacity_type == "spot"]
    if spot:
        names = ", ".join(f"{p.name} ({p.nodes})" for p in spot)
        return Check("spot nodes", PASS, f"{sum(p.nodes for p in spot)} spot node(s): {names}")
    if flavour == "karpenter" and any(p.karpenter for p in pools):
        return Check(
            "spot nodes",
            WARN,
            "no spot node now; Karpenter makes them when a pod waits",
            "check that a NodePool allows karpenter.sh/capacity-type spot and nvidia.com/gpu",
        )
    fixes = [SPOT_NODE_FIX[f] for f in ((flavour,) if flavour in SPOT_NODE_FIX else SPOT_NODE_FIX)]
    return Check(
        "spot nodes",
        FAIL,
        f"no node carries a spot label ({len(pools)} pool(s), {sum(p.nodes for p in pools)} node(s); "
        "a pool scaled to zero has no node to see)",
        f"add {' or '.join(fixes)}, or set capacity 'on-demand'",
    )


def gpu_check(pools: list[Pool] | None, gpus_per_node: int) -> Check:
    """``nvidia.com/gpu`` allocatable, by pool."""
    if pools is None:
        return Check(
            "gpus",
            WARN,
            "cannot list nodes (optional 'list nodes' rule)",
            "kubectl describe nodes | grep nvidia.com/gpu",
        )
    with_gpus = [p for p in pools if p.gpus]
    listed = "; ".join(f"{p.name}: {p.nodes} x {p.gpus}" for p in with_gpus)
    if gpus_per_node == 0:
        return Check("gpus", INFO, f"CPU jobs; GPU pools: {listed or 'none'}")
    if any(p.gpus >= gpus_per_node for p in with_gpus):
        return Check("gpus", PASS, f"nvidia.com/gpu by pool: {listed}")
    if not pools or any(p.karpenter for p in pools):
        return Check(
            "gpus",
            WARN,
            f"no node with {gpus_per_node} GPUs now ({listed or 'none'}); an autoscaler may add one",
        )
    return Check(
        "gpus",
        FAIL,
        f"no node has {gpus_per_node} allocatable nvidia.com/gpu ({listed or 'no GPU node'}; "
        "a pool scaled to zero has no node to see)",
        "add a GPU node pool with the NVIDIA device plugin, or ask for fewer GPUs per node",
    )


def notice_check(grace_s: int, flavour: str, capacity: str, save_s: float | None, source: str) -> Check:
    """Does the emergency checkpoint (``save_s`` seconds, from ``source``) fit between SIGTERM
    and the VM going: the grace period, cut to the provider's window?"""
    if capacity == "on-demand":
        return Check("notice window", INFO, "capacity on-demand: no spot notice")
    window, why = PROVIDER_WINDOW_S.get(
        flavour, (min(w for w, _ in PROVIDER_WINDOW_S.values()), "the shortest provider window")
    )
    pods_get = min(grace_s, window)
    usable = shutdown_timeout(pods_get)
    detail = f"pods get {pods_get} s (grace {grace_s} s; {why}), the save {usable} s of it"
    if save_s is None:
        return Check(
            "notice window",
            WARN,
            f"{detail}; save time unknown",
            "pass --save-seconds: an attempt record's emergency_save_s, or the estimate of docs/deploying.md section 7",
        )
    needed = needed_seconds(save_s)
    if usable >= needed:
        return Check("notice window", PASS, f"{detail}; the emergency save needs {needed} s ({source})")
    return Check(
        "notice window",
        FAIL,
        f"{detail}, shorter than the emergency save: {save_s:.0f} s ({source}), {needed} s with the margin",
        "checkpoint to faster storage or across more nodes, lengthen the window "
        "(termination_grace_seconds, and the provider's where it can be set), or accept losing "
        "the steps since the last regular checkpoint (checkpoint.every_steps)",
    )


def storage_checks(root: str, result: Mapping[str, object]) -> list[Check]:
    """The storage probe's findings (:func:`trainops.doctor.storage.probe`)."""
    error = result.get("error")
    if error:
        return [
            Check(
                "storage",
                FAIL,
                f"{root}: {error}",
                str(result.get("fix") or "check the root and its credentials"),
            )
        ]
    out = [
        Check(
            "storage",
            PASS,
            f"{root}: write, read, list and delete work; round trip {result['latency_ms']:.0f} ms",
        )
    ]
    ignored = [
        header
        for key, header in (
            ("create_only", "If-None-Match (create-only)"),
            ("compare_and_swap", "If-Match (compare-and-swap)"),
        )
        if not result.get(key)
    ]
    if not ignored:
        out.append(
            Check(
                "conditional writes",
                PASS,
                "create-only and compare-and-swap writes are refused when they must be",
            )
        )
    else:
        errors = [str(result[k]) for k in ("create_only_error", "compare_and_swap_error") if result.get(k)]
        what = (
            f"the store refused {' and '.join(ignored)} outright: {'; '.join(errors)}"
            if errors
            else f"the store ignored {' and '.join(ignored)}: a conditional write that must fail succeeded"
        )
        out.append(
            Check(
                "conditional writes",
                FAIL,
                what,
                "use AWS S3, or a store that honours S3 conditional writes (MinIO 2024-11 or later); "
                "without them two runs can overwrite each other's markers and pointers",
            )
        )
    return out
