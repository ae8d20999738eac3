"""The pod every kind runs: one torchrun agent (or one plain process) per node.

Every GPU pod gets ``nvidia.com/gpu`` limits, a memory-backed ``/dev/shm``, a node-local
cache with a ``sizeLimit`` and an ``ephemeral-storage`` request (when sized), the NCCL tuning
variables, a grace period that torchrun's shutdown timeout fits inside, and a non-root
security context. Credentials arrive only by Secret reference or through the service
account (IRSA, workload identity), never as literal values: a variable whose name or value looks
like a credential (:mod:`trainops.cluster.credentials`) is refused, naming it.
"""

from __future__ import annotations

import re
from dataclasses import replace

from trainer.contract import ENV_NODE_NAME, TORCHRUN_ENV, torchrun_argv
from trainops.cluster import credentials
from trainops.cluster.kubernetes import names, objects, placement
from trainops.cluster.kubernetes.objects import Json
from trainops.cluster.spec import JobSpec, JobSpecError

TRAINER_UID = 10001  # the trainer image's user
RDZV_PORT = 29500
SHM_PATH = "/dev/shm"
CACHE_PATH = "/var/cache/trainops"
CACHE_VOLUME = "cache"

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NCCL = ("NCCL_", "TORCH_NCCL_")
ADVICE = (
    "never pass secrets as literal values; use env_from_secrets (a Secret name, or "
    '{"env": ..., "secret": ..., "key": ...}) or a service_account (IRSA, workload identity)'
)


def literal_credentials(spec: JobSpec) -> list[str]:
    """Each literal variable of ``spec`` that looks like a credential
    (:func:`trainops.cluster.credentials.credential_reason`), as ``env 'NAME' (why)``: the
    variable and its field named, its value never."""
    return [
        f"{source} {name!r} ({reason})"
        for source, env in (("env", spec.env), ("nccl_env", spec.nccl_env))
        for name, reason in credentials.literal_credentials(env).items()
    ]


def credential_refusal(spec: JobSpec) -> str | None:
    """Why rendering refuses ``spec`` for its literal credentials, naming every such variable
    and what to do instead; None when it has none."""
    found = literal_credentials(spec)
    if not found:
        return None
    what = "looks like a credential" if len(found) == 1 else "look like credentials"
    return f"JobSpec {', '.join(found)} {what} (values not shown): {ADVICE}"


def refuse_literal_credentials(spec: JobSpec) -> None:
    """Raise JobSpecError (:func:`credential_refusal`) when ``spec`` has a literal credential."""
    refusal = credential_refusal(spec)
    if refusal:
        raise JobSpecError(refusal)


def masked(spec: JobSpec) -> JobSpec:
    """``spec`` with every credential-like literal value replaced by ``***``: what a dry run
    may show."""
    return replace(spec, env=credentials.mask_env(spec.env), nccl_env=credentials.mask_env(spec.nccl_env))


def check_env(spec: JobSpec) -> None:
    """Reject invalid and misplaced variable names (NCCL's belong in ``nccl_env``), naming the
    variable. Literal credentials are :func:`refuse_literal_credentials`'s, before any kind
    is built (:func:`trainops.cluster.kubernetes.render.render_manifests`)."""
    for source, env in (("env", spec.env), ("nccl_env", spec.nccl_env)):
        for name in env:
            if not _ENV_NAME.match(name):
                raise JobSpecError(f"JobSpec {source} name {name!r} is not a valid variable name")
    for name in spec.nccl_env:
        if not name.startswith(_NCCL):
            raise JobSpecError(
                f"JobSpec nccl_env {name!r} is not an NCCL variable (NCCL_* or TORCH_NCCL_*): put it in env"
            )


def command(spec: JobSpec, job_name: str, rdzv_endpoint: str, is_host: bool | None) -> list[str]:
    """The container's argument list: ``args``, wrapped in torchrun when distributed (with
    ``--max-restarts`` from ``restarts_in_place``)."""
    if not spec.distributed:
        return list(spec.args)
    return torchrun_argv(
        spec.args,
        nnodes=spec.nodes,
        nproc_per_node=spec.procs_per_node,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=job_name,
        shutdown_timeout_s=spec.shutdown_timeout_s,
        is_host=is_host,
        restarts_in_place=spec.restarts_in_place,
    )


def static_command(spec: JobSpec) -> list[str]:
    """The argument list for a runtime that hands torchrun its rendezvous through ``PET_*``
    variables (Kubeflow Trainer v2 sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
    ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``): torchrun's static
    rendezvous, so our c10d flags are left out; the shutdown timeout stays. ``--max-restarts``
    is 0 whatever ``restarts_in_place`` says: a static rendezvous cannot restart a node's
    workers in place together with the others (its agents never see another node waiting, and
    every round shares one store whose keys the restarted gang would race), so every failure
    relaunches the whole gang. ``args`` unchanged when not distributed."""
    argv = command(replace(spec, restarts_in_place=0), "", "", is_host=None)
    if not spec.distributed:
        return argv
    end = argv.index("-m", 3)  # torchrun's own flags end where ``-m trainer`` starts
    return [*argv[:3], *(a for a in argv[3:end] if not a.startswith("--rdzv-")), *argv[end:]]


def env_vars(spec: JobSpec) -> list[Json]:
    """The container's ``env``: cache dir, unbuffered output, torchrun's own settings
    (``TORCHRUN_ENV``, when distributed), ``env``, ``nccl_env``, the Node's name (the downward
    API: a spot notice names the node that is going away), then the single-key Secret
    references (``valueFrom.secretKeyRef``)."""
    torchrun = TORCHRUN_ENV if spec.distributed else {}
    plain = {
        "TRAINOPS_CACHE_DIR": CACHE_PATH,
        "PYTHONUNBUFFERED": "1",
        **torchrun,
        **spec.env,
        **spec.nccl_env,
    }
    out: list[Json] = [{"name": k, "value": v} for k, v in plain.items()]
    out.append({"name": ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    for ref in spec.env_from_secrets:
        if not isinstance(ref, str):
            out.append(
                {
                    "name": ref["env"],
                    "valueFrom": {"secretKeyRef": {"name": ref["secret"], "key": ref["key"]}},
                }
            )
    return out


def env_from(spec: JobSpec) -> list[Json]:
    """``envFrom`` for the whole-Secret entries of ``env_from_secrets`` (every key a variable)."""
    return [{"secretRef": {"name": ref}} for ref in spec.env_from_secrets if isinstance(ref, str)]


def ephemeral_storage(spec: JobSpec) -> str | None:
    """The pod's ``ephemeral-storage`` request: ``ephemeral_storage``, else ``cache_size``."""
    return spec.ephemeral_storage or spec.cache_size


def resources(spec: JobSpec) -> Json:
    """Requests cpu, memory (and GPUs, and ephemeral storage when sized); limits memory (and
    GPUs): GPU requests = limits. Ephemeral storage has no limit: the cache's ``sizeLimit``
    bounds what the trainer writes, and a limit would also count logs and the image layer."""
    out: dict[str, dict[str, str]] = {
        "requests": {"cpu": spec.cpu, "memory": spec.memory},
        "limits": {"memory": spec.memory},
    }
    disk = ephemeral_storage(spec)
    if disk:
        out["requests"]["ephemeral-storage"] = disk
    if spec.gpus_per_node > 0:
        out["requests"]["nvidia.com/gpu"] = str(spec.gpus_per_node)
        out["limits"]["nvidia.com/gpu"] = str(spec.gpus_per_node)
    return out


def volumes(spec: JobSpec) -> list[Json]:
    """The memory-backed ``/dev/shm`` (``shm_size``) and the node-local cache (``cache_size``:
    over it, the kubelet evicts this pod alone, naming the volume, rather than filling the
    node's disk until it evicts pods for node pressure)."""
    cache: Json = {"sizeLimit": spec.cache_size} if spec.cache_size else {}
    return [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        {"name": CACHE_VOLUME, "emptyDir": cache},
    ]


def volume_mounts() -> list[Json]:
    """Where the trainer container sees ``volumes``."""
    return [{"name": "dshm", "mountPath": SHM_PATH}, {"name": CACHE_VOLUME, "mountPath": CACHE_PATH}]


def container_security() -> Json:
    """The trainer container's security context: the image's non-root user, no privilege
    escalation, no capabilities, the runtime's default seccomp profile."""
    return {
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "runAsGroup": TRAINER_UID,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security() -> Json:
    """The pod's security context: non-root, and the volumes writable by the trainer's group."""
    return {
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "runAsGroup": TRAINER_UID,
        "fsGroup": TRAINER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container(spec: JobSpec, name: str, argv: list[str], port_name: str = "rendezvous") -> Json:
    """The trainer container: image, ``argv``, env, resources, mounts, a non-root security
    context, and the rendezvous port (named ``port_name``) when distributed."""
    out: Json = {
        "name": name,
        "image": spec.image,
        "command": argv,
        "env": env_vars(spec),
        "resources": resources(spec),
        "volumeMounts": volume_mounts(),
        "securityContext": container_security(),
    }
    secrets = env_from(spec)
    if secrets:
        out["envFrom"] = secrets
    if spec.distributed:
        out["ports"] = [{"name": port_name, "containerPort": RDZV_PORT, "protocol": "TCP"}]
    return out


def pod_metadata(
    spec: JobSpec, extra_labels: dict[str, str] | None = None, extra_annotations: dict[str, str] | None = None
) -> Json:
    """A pod template's metadata: the user's labels and annotations, plus the kind's own."""
    meta: Json = {"labels": names.labels({**spec.labels, **(extra_labels or {})})}
    annotations = {**spec.annotations, **(extra_annotations or {})}
    if annotations:
        meta["annotations"] = annotations
    return meta


def pod_spec(spec: JobSpec, container_spec: Json, *, subdomain: str | None = None) -> Json:
    """The pod spec around one container: placement, grace, volumes, identity."""
    check_env(spec)
    out: Json = {
        # torchrun restarts failed workers inside the container (restarts_in_place); past that,
        # recovery is a whole-gang relaunch by the operator, never a pod restart
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": spec.termination_grace_seconds,
        "containers": [container_spec],
        "volumes": volumes(spec),
        "affinity": placement.affinity(spec),
        "securityContext": pod_security(),
        "enableServiceLinks": False,
        # The trainer never calls the Kubernetes API. IRSA and workload identity inject their
        # own tokens, independent of this setting.
        "automountServiceAccountToken": False,
    }
    tolerations = placement.tolerations(spec)
    if tolerations:
        out["tolerations"] = tolerations
    if spec.service_account:
        out["serviceAccountName"] = spec.service_account
    if spec.priority_class:
        out["priorityClassName"] = spec.priority_class
    if objects.is_volcano(spec):
        out["schedulerName"] = "volcano"
    if subdomain:
        out["subdomain"] = subdomain
    return out
