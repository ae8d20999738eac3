"""JobSpec: what to run, on how many nodes, with what resources. Plain data with a JSON form.

Every backend takes the same JobSpec. The local backend uses the fields that mean something on
one host (args, nodes, gpus_per_node, env, termination_grace_seconds, distributed); the
Kubernetes backend (issue #4) turns the rest into manifests.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

CAPACITIES = ("spot", "on-demand", "spot-then-on-demand")
SPOT_FLAVOURS = ("karpenter", "eks", "gke", "aks", "auto")
KINDS = ("pytorchjob", "indexed-job", "trainjob")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class JobSpecError(ValueError):
    """A JobSpec field holds a value no backend can run."""


@dataclass
class JobSpec:
    """One training (or evaluation) job: N nodes x G processes running ``args``.

    :param name: DNS-1123 label; the backend adds the attempt number.
    :param args: the trainer command line, ``python -m trainer ...`` (an argument list).
    :param nodes: number of nodes (pods); each runs one torchrun agent.
    :param gpus_per_node: GPUs per node; 0 means one CPU process per node.
    :param distributed: wrap ``args`` in torchrun (training); False runs it as one plain process.
    :param termination_grace_seconds: time between SIGTERM and SIGKILL; the trainer's
        emergency-checkpoint budget. torchrun's shutdown timeout is set to fit inside it.
    """

    name: str
    args: list[str]
    nodes: int = 1
    gpus_per_node: int = 0
    distributed: bool = True
    image: str = "trainops-trainer:latest"
    namespace: str = "default"
    cpu: str = "1"
    memory: str = "4Gi"
    env: dict[str, str] = field(default_factory=dict)
    env_from_secrets: list[str] = field(default_factory=list)
    service_account: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    affinity: dict | None = None
    capacity: str = "spot"
    spot_flavour: str = "auto"
    scheduler: str = "default"
    priority_class: str | None = None
    shm_size: str = "1Gi"
    termination_grace_seconds: int = 60
    nccl_env: dict[str, str] = field(default_factory=dict)
    kind: str = "indexed-job"

    def __post_init__(self) -> None:
        validate(self)

    @property
    def procs_per_node(self) -> int:
        return max(1, self.gpus_per_node)

    @property
    def shutdown_timeout_s(self) -> int:
        """torchrun's SIGTERM->SIGKILL wait: inside the grace period, with room to exit."""
        return max(1, self.termination_grace_seconds - min(10, self.termination_grace_seconds // 4))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobSpecError(f"unknown JobSpec field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)


def validate(spec: JobSpec) -> None:
    if not _NAME.match(spec.name):
        raise JobSpecError(
            f"JobSpec name {spec.name!r} is not a DNS-1123 label: use lowercase letters, digits and '-'")
    if not spec.args or not all(isinstance(a, str) for a in spec.args):
        raise JobSpecError(f"JobSpec args must be a non-empty list of strings, got {spec.args!r}")
    if not isinstance(spec.nodes, int) or spec.nodes < 1:
        raise JobSpecError(f"JobSpec nodes must be an integer >= 1, got {spec.nodes!r}")
    if not isinstance(spec.gpus_per_node, int) or spec.gpus_per_node < 0:
        raise JobSpecError(f"JobSpec gpus_per_node must be an integer >= 0, got {spec.gpus_per_node!r}")
    if spec.capacity not in CAPACITIES:
        raise JobSpecError(f"JobSpec capacity {spec.capacity!r} is not one of {CAPACITIES}")
    if spec.spot_flavour not in SPOT_FLAVOURS:
        raise JobSpecError(f"JobSpec spot_flavour {spec.spot_flavour!r} is not one of {SPOT_FLAVOURS}")
    if spec.kind not in KINDS:
        raise JobSpecError(f"JobSpec kind {spec.kind!r} is not one of {KINDS}")
    if not (spec.scheduler in ("default", "volcano") or spec.scheduler.startswith("kueue:")):
        raise JobSpecError(
            f"JobSpec scheduler {spec.scheduler!r}: use 'default', 'volcano' or 'kueue:<queue>'")
    if spec.termination_grace_seconds < 1:
        raise JobSpecError(
            f"JobSpec termination_grace_seconds must be >= 1, got {spec.termination_grace_seconds}")
    for key, value in {**spec.env, **spec.nccl_env}.items():
        if not isinstance(value, str):
            raise JobSpecError(f"JobSpec env {key!r} must be a string, got {value!r}")
