"""The cluster backend, declared once: what the operators and triggers call, and the records
that cross that line. Both backends (``local/``, ``kubernetes/``) and the tests' fakes
implement :class:`ClusterBackend`, so the type checker holds them to the same shape.

Handles and states are plain JSON-able dicts (TypedDicts): a handle travels through XCom,
``job.json`` and a deferred trigger's kwargs, and a state into ``job.json``.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired at run time.
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, NotRequired, Protocol, TypedDict

if TYPE_CHECKING:
    from trainops.cluster.spec import JobSpec

Phase = Literal["pending", "running", "succeeded", "failed", "lost"]
FINAL_PHASES: tuple[Phase, ...] = ("succeeded", "failed", "lost")


class ObjectRef(TypedDict):
    """A Kubernetes object a launch created (deleted with the job)."""

    apiVersion: str
    kind: str
    name: str


class JobHandle(TypedDict):
    """What finds a launched job again: its backend, id and labels, plus backend fields."""

    cluster: str
    job_id: str
    labels: dict[str, str]
    job_dir: NotRequired[str]  # local: the job's state directory
    kind: NotRequired[str]  # kubernetes: indexed-job, pytorchjob or trainjob
    namespace: NotRequired[str]  # kubernetes
    manifests: NotRequired[list[ObjectRef]]  # kubernetes: every object the launch created


class NodeState(TypedDict, total=False):
    """One node (pod, or local process group) of an attempt."""

    index: int | None
    pod: str | None
    pid: int
    node_name: str | None
    phase: str | None
    exit_code: int | None
    reason: str | None
    message: str | None
    instance_type: str | None
    capacity_type: str | None


class Disruption(TypedDict, total=False):
    """Why the cluster took a node away (a spot interruption, a node that vanished, ...)."""

    node: int | None
    pod: str | None
    reason: str | None
    message: str | None
    at_step: int
    at: str


class JobState(TypedDict):
    """An attempt as the backend sees it. ``infra_reason`` is set when the infrastructure,
    not the program, stopped it; ``unschedulable`` when that was pods finding no node."""

    phase: Phase
    reason: str | None
    nodes: list[NodeState]
    disruptions: list[Disruption]
    infra_reason: NotRequired[str]
    unschedulable: NotRequired[bool]


class LogCursor(TypedDict, total=False):
    """Where :meth:`ClusterBackend.log_lines` stopped reading (backend-specific)."""

    offset: int  # local: bytes of node 0's log already read
    pod: str  # kubernetes: node 0's pod
    ts: str | None  # kubernetes: timestamp of the newest line read
    n: int  # kubernetes: lines at that timestamp already returned


class ClusterBackend(Protocol):
    """Where jobs run. Every method takes and returns plain data; none blocks for long."""

    name: str

    def launch(self, spec: "JobSpec", *, chaos: dict | None = None) -> JobHandle:
        """Start ``spec`` and return its handle (``chaos``: an injected preemption, local)."""
        ...

    def status(self, handle: JobHandle) -> JobState:
        """The job's state now."""
        ...

    def delete(self, handle: JobHandle) -> None:
        """Delete the job and everything it created; a gone job is no error."""
        ...

    def all_gone(self, handle: JobHandle) -> bool:
        """True once no pod (process) of the job remains."""
        ...

    def find(self, labels: Mapping[str, str]) -> list[JobHandle]:
        """The live jobs carrying all of ``labels`` (a retried task reattaches to them)."""
        ...

    def logs_tail(self, handle: JobHandle, lines: int = 30) -> str:
        """The last ``lines`` lines of every node's log, labelled by node."""
        ...

    def log_lines(
        self, handle: JobHandle, cursor: LogCursor | None, max_lines: int = 200
    ) -> tuple[list[str], LogCursor | None]:
        """Node 0's lines since ``cursor``, and the cursor to pass next time."""
        ...
