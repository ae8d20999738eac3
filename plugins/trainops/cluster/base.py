"""The cluster backend, declared once: what the operators and triggers call, and the records
that cross that line. Both backends (``local/``, ``kubernetes/``) and the tests' fakes
implement :class:`ClusterBackend`, so the type checker holds them to the same shape.

Handles and states are plain JSON-able dicts (TypedDicts): a handle travels through XCom,
``job.json`` and a deferred trigger's kwargs, and a state into ``job.json``.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired at run time.
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Literal, NotRequired, Protocol, TypedDict

if TYPE_CHECKING:
    from trainops.cluster.spec import JobSpec

Phase = Literal["pending", "running", "succeeded", "failed", "lost"]
# ``lost``: the job vanished under the gang (its supervisor or its job object is gone)
FINAL_PHASES: tuple[Phase, ...] = ("succeeded", "failed", "lost")
# A node's reason when the kubelet evicted its pod for node pressure (the pod's
# ``status.reason``): the node ran out of disk or memory, which no preemption budget can fix.
EVICTED: Final = "Evicted"


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
    pod: str | None  # kubernetes
    pid: int  # local: the node's torchrun (its process group)
    log: str  # local: the node's log file
    node_name: str | None  # kubernetes: the Node the pod ran on
    phase: str | None  # kubernetes: the pod's phase
    exit_code: int | None
    reason: str | None
    message: str | None
    instance_type: str | None  # kubernetes: from the Node's labels (None: unknown)
    capacity_type: str | None  # kubernetes: ``spot``, ``on-demand`` or None (unknown)


class Disruption(TypedDict, total=False):
    """Why the cluster took a node away (a spot interruption, a node that vanished, ...)."""

    node: int | None
    pod: str | None  # kubernetes
    reason: str | None
    message: str | None
    at: str  # local: when the preemption was injected (ISO 8601)
    time: float  # local: the same, epoch seconds (the cost accounting's recovery time)


class JobState(TypedDict):
    """An attempt as the backend sees it. ``infra_reason`` is set when the infrastructure,
    not the program, stopped it; ``unschedulable`` when that was pods finding no node.
    ``start_time`` and ``end_time`` (epoch seconds) bound what the attempt is billed for: its
    first pod's start to its last trainer container's end (Kubernetes), its first node
    process's start to its last one's exit (local); absent while unknown, and in states
    written before them. Kubernetes also gives ``gang_start_time`` (its last trainer container's
    start), ``launch_time`` (the job's creation) and ``observed_time`` (when the backend read
    this state): all on the cluster's clock, which ``trainops.cost.clocks`` holds the trainer's
    and the operator's times against."""

    phase: Phase
    reason: str | None
    nodes: list[NodeState]
    disruptions: list[Disruption]
    infra_reason: NotRequired[str]
    unschedulable: NotRequired[bool]
    start_time: NotRequired[float]
    end_time: NotRequired[float]
    gang_start_time: NotRequired[float]
    launch_time: NotRequired[float]
    observed_time: NotRequired[float]


class LogCursor(TypedDict, total=False):
    """Where :meth:`ClusterBackend.log_lines` stopped reading (backend-specific)."""

    offset: int  # local: bytes of node 0's log already read
    pod: str  # kubernetes: node 0's pod
    ts: str | None  # kubernetes: timestamp of the newest line read
    n: int  # kubernetes: lines at that timestamp already returned


class Chaos(TypedDict):
    """An injected spot preemption (local only): SIGTERM to ``node``'s torchrun once the
    run's ``metrics_uri`` shows attempt ``attempt`` at ``at_step``."""

    at_step: int
    metrics_uri: str
    node: NotRequired[int]  # default 0
    attempt: NotRequired[int]  # default 1


class JobAlreadyExists(RuntimeError):
    """``launch`` found the attempt's job already there (Kubernetes 409 AlreadyExists, or the
    local job directory): an earlier launch of the same attempt, whose reply or record was
    lost. The caller reattaches to :attr:`handle`; it never launches a second job.

    :param handle: the existing job's handle.
    """

    def __init__(self, message: str, handle: JobHandle):
        super().__init__(message)
        self.handle = handle


class ClusterBackend(Protocol):
    """Where jobs run. Every method takes and returns plain data; none blocks for long."""

    name: str

    def launch(self, spec: "JobSpec", *, chaos: Chaos | None = None) -> JobHandle:
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
        """Node 0's lines since ``cursor`` (None: from the start), and the cursor to pass next
        time. At most ``max_lines`` lines; when more were new, the first line is a notice of
        how many were skipped (:func:`cap_lines`) and the newest follow."""
        ...


def skipped_notice(count: int | None) -> str:
    """The line standing for ``count`` lines left out (None: an unknown number)."""
    return "(… earlier lines skipped)" if count is None else f"(… {count} earlier lines skipped)"


def cap_lines(newest: list[str], max_lines: int, total: int | None) -> list[str]:
    """What one :meth:`ClusterBackend.log_lines` call returns, on every backend: ``newest``
    when all ``total`` lines fit in ``max_lines``, else a notice of how many were skipped
    followed by the newest ``max_lines - 1``.

    :param newest: the newest lines, oldest first (at least ``max_lines`` when there are more).
    :param total: how many lines there were in all; None: more than fit, how many is unknown.
    """
    if total is not None and total <= max_lines:
        return list(newest)
    keep = list(newest[-(max_lines - 1) :]) if max_lines > 1 else []
    return [skipped_notice(None if total is None else total - len(keep)), *keep]
