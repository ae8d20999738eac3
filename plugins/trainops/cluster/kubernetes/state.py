"""The cluster's view of one attempt (its Job, PyTorchJob or TrainJob and its pods) -> the
backend state (:class:`~trainops.cluster.base.JobState`) that
``trainops.recovery.classify.classify_attempt`` reads. Pure: the API's JSON form (camelCase
dicts) in, typed records out.

Exit codes are never read as preemption: torchrun exits 1 on SIGTERM whatever its workers
did. Preemption shows as a pod's ``DisruptionTarget`` condition, a node-shutdown pod reason,
or a pod whose node is gone.

A kubelet's node-pressure eviction is not a preemption, though it sets the same
``DisruptionTarget`` condition (reason ``TerminationByKubelet``, which graceful node shutdown
sets too): the pod's ``status.reason`` is ``Evicted`` and its message says which resource ran
low ("The node was low on resource: ephemeral-storage. ...", or an ``emptyDir`` over its
``sizeLimit``). Relaunching it as a preemption would fill the same disk again until the budget
is spent, so it is an infrastructure failure (``infra_reason``) naming the resource.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from trainops.cluster.base import EVICTED, Disruption, JobState, NodeState
from trainops.cluster.kubernetes import indexed_job, pytorchjob, trainjob
from trainops.cluster.kubernetes.objects import Json

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
TRAINER_CONTAINERS = (pytorchjob.CONTAINER, indexed_job.CONTAINER, trainjob.NODE)
NODE_SHUTDOWN_REASONS = ("Shutdown", "Terminated", "NodeShutdown")  # graceful node shutdown
IMAGE_PULL_REASONS = ("ImagePullBackOff", "ErrImagePull")
CONFIG_ERROR_REASONS = ("InvalidImageName", "CreateContainerConfigError", "CreateContainerError")
KUBELET_TERMINATION = "TerminationByKubelet"  # eviction and graceful node shutdown alike
# The kubelet's eviction messages (pkg/kubelet/eviction/helpers.go), for a pod whose
# ``status.reason`` was lost (a pod object patched by something else keeps the condition).
EVICTION_MESSAGES = (
    "low on resource",
    "exceeds the limit",
    "exceeds the total limit",
    "ephemeral local storage",
)


def _conditions(obj: Json | None) -> list[Json]:
    return ((obj or {}).get("status") or {}).get("conditions") or []


def _true(obj: Json | None, ctype: str) -> Json | None:
    """The condition ``ctype`` when its status is True."""
    for cond in _conditions(obj):
        if cond.get("type") == ctype and str(cond.get("status")) == "True":
            return cond
    return None


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def node_index(pod: Json) -> int | None:
    """The gang index of a pod: the completion index of an Indexed Job's pod (a TrainJob's
    pods too: JobSet's ``jobset.sigs.k8s.io/job-index`` numbers the Jobs of a replicated job,
    always 0 here, not the pods), or the PyTorchJob's replica (Master is 0, Worker i is
    i + 1)."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    index = annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
    if index is not None:
        return int(index)
    if REPLICA_INDEX in labels:
        offset = 0 if str(labels.get(REPLICA_TYPE, "")).lower() == "master" else 1
        return int(labels[REPLICA_INDEX]) + offset
    return None


def trainer_container(pod: Json) -> str | None:
    """The container running torchrun: ``pytorch``, ``trainer`` or ``node``, else the first."""
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    for name in TRAINER_CONTAINERS:
        if name in names:
            return name
    return names[0] if names else None


def _container_status(pod: Json) -> Json:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    name = trainer_container(pod)
    for status in statuses:
        if status.get("name") == name:
            return status
    return statuses[0] if statuses else {}


def eviction_of(pod: Json) -> str | None:
    """The kubelet's message when it evicted this pod for node pressure (disk, memory, an
    ``emptyDir`` over its ``sizeLimit``), else None. Graceful node shutdown also terminates
    by the kubelet, but its pod reason is ``Terminated``/``Shutdown``, never ``Evicted``."""
    status = pod.get("status") or {}
    cond = _true(pod, "DisruptionTarget")
    if status.get("reason") == EVICTED:
        return str(status.get("message") or (cond or {}).get("message") or "evicted by the kubelet")
    if cond and cond.get("reason") == KUBELET_TERMINATION:
        message = str(cond.get("message") or "")
        if any(words in message for words in EVICTION_MESSAGES):
            return message
    return None


def node_of(pod: Json) -> NodeState:
    """One entry of ``nodes``: index, pod, node_name, phase, exit_code and reason
    (``Evicted`` for a node-pressure eviction)."""
    status = pod.get("status") or {}
    cstate = _container_status(pod).get("state") or {}
    terminated, waiting = cstate.get("terminated") or {}, cstate.get("waiting") or {}
    disruption = _true(pod, "DisruptionTarget")
    evicted = eviction_of(pod)
    reason = (
        (terminated.get("reason") if terminated.get("reason") == "OOMKilled" else None)
        or (EVICTED if evicted else None)
        or (disruption or {}).get("reason")
        or status.get("reason")
        or waiting.get("reason")
        or terminated.get("reason")
    )
    return {
        "index": node_index(pod),
        "pod": (pod.get("metadata") or {}).get("name"),
        "node_name": (pod.get("spec") or {}).get("nodeName"),
        "phase": status.get("phase"),
        "exit_code": terminated.get("exitCode"),
        "reason": reason,
        "message": evicted or terminated.get("message") or waiting.get("message") or status.get("message"),
    }


def disruption_of(pod: Json, node: NodeState, node_names_present: set[str] | None) -> Disruption | None:
    """Why the cluster took this pod away, or None if it did not (an eviction for node
    pressure is the node's trouble, not a disruption: see :func:`eviction_reason`)."""
    status = pod.get("status") or {}
    if node["reason"] == EVICTED:
        return None
    cond = _true(pod, "DisruptionTarget")
    if cond:
        return {
            "node": node["index"],
            "pod": node["pod"],
            "reason": cond.get("reason"),
            "message": cond.get("message") or f"pod {node['pod']} was disrupted",
        }
    if status.get("phase") == "Failed" and status.get("reason") in NODE_SHUTDOWN_REASONS:
        return {
            "node": node["index"],
            "pod": node["pod"],
            "reason": status["reason"],
            "message": status.get("message") or f"node {node['node_name']} shut down",
        }
    if (
        node_names_present is not None
        and node["node_name"]
        and node["node_name"] not in node_names_present
        and status.get("phase") not in ("Succeeded", "Failed")
    ):
        return {
            "node": node["index"],
            "pod": node["pod"],
            "reason": "NodeLost",
            "message": f"node {node['node_name']} of pod {node['pod']} no longer exists",
        }
    return None


def eviction_reason(nodes: list[NodeState]) -> str | None:
    """The infrastructure reason for the evicted nodes, naming pod, node and resource, and
    what to change; None when no pod was evicted."""
    evicted = [n for n in nodes if n["reason"] == EVICTED]
    if not evicted:
        return None
    what = "; ".join(
        f"pod {n['pod']} (node {n['index']}) on {n['node_name'] or 'its node'}: {str(n['message'] or '').strip()}"
        for n in evicted
    )
    return (
        f"Evicted by the kubelet for node pressure: {what} (an infrastructure failure, not a "
        "preemption: raise job_options cache_size or ephemeral_storage if the trainer's own "
        "files outgrew them, else use nodes with more local disk or memory)"
    )


def job_outcome(job: Json) -> tuple[str | None, str | None]:
    """(``succeeded``/``failed``/``suspended``/None, reason) from a Job, PyTorchJob or
    TrainJob."""
    if job.get("kind") == pytorchjob.KIND:
        for ctype, phase in (("Succeeded", "succeeded"), ("Failed", "failed")):
            cond = _true(job, ctype)
            if cond:
                return phase, _reason(cond)
        if (job.get("spec") or {}).get("runPolicy", {}).get("suspend") or _true(job, "Suspended"):
            return "suspended", None
        return None, None
    if job.get("kind") == trainjob.KIND:
        return _trainjob_outcome(job)
    if _true(job, "Complete"):
        return "succeeded", None
    cond = _true(job, "Failed")
    if cond:
        return "failed", _reason(cond)
    if (job.get("spec") or {}).get("suspend"):
        return "suspended", None
    return None, None


def _trainjob_outcome(job: Json) -> tuple[str | None, str | None]:
    """Trainer copies its JobSet's ``Completed`` and ``Failed`` conditions as ``Complete`` and
    ``Failed``, keeps ``Suspended`` (reason ``Suspended``, or ``Resumed`` with status False),
    and sets ``Created`` False with reason ``JobsBuildFailed`` when the TrainJob and its
    runtime cannot make a JobSet: that one never runs, so it is a failure."""
    cond = _true(job, "Complete")
    if cond:
        return "succeeded", _reason(cond)
    cond = _true(job, "Failed")
    if cond:
        return "failed", _reason(cond)
    for cond in _conditions(job):
        if (
            cond.get("type") == "Created"
            and str(cond.get("status")) == "False"
            and cond.get("reason") == "JobsBuildFailed"
        ):
            return "failed", (
                f"{_reason(cond)}: the TrainJob and its runtime make no JobSet "
                "(kubectl describe trainjob; the controller's log says why)"
            )
    if (job.get("spec") or {}).get("suspend") or _true(job, "Suspended"):
        return "suspended", None
    return None, None


def disruption_in_job(job: Json) -> Disruption | None:
    """The disruption a Job's ``podFailurePolicy`` failed it on, from its ``Failed`` (or
    ``FailureTarget``) condition: the scheduler deletes a pod it preempts, and once the Job
    controller has counted it, that pod (and those it deletes) leave the API, so by the time
    the Job is Failed its condition may be the only trace. None for any other failure."""
    for ctype in ("Failed", "FailureTarget"):
        cond = _true(job, ctype)
        message = str((cond or {}).get("message") or "")
        if cond and cond.get("reason") == "PodFailurePolicy" and "has condition DisruptionTarget" in message:
            pod = message.split()[1].rpartition("/")[2] if message.startswith("Pod ") else None
            return {"node": None, "pod": pod, "reason": "DisruptionTarget", "message": message}
    return None


def _reason(cond: Json) -> str:
    return ": ".join(p for p in (cond.get("reason"), cond.get("message")) if p)


def _unschedulable_for(pod: Json, now: datetime) -> float | None:
    """Seconds the pod has been unschedulable, or None if it is not."""
    for cond in _conditions(pod):
        if (
            cond.get("type") == "PodScheduled"
            and str(cond.get("status")) == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            since = _time(cond.get("lastTransitionTime")) or _time(
                (pod.get("metadata") or {}).get("creationTimestamp")
            )
            return (now - since).total_seconds() if since else 0.0
    return None


def _epoch(value: Any) -> float | None:
    t = _time(value)
    return t.timestamp() if t else None


class AttemptTimes(TypedDict, total=False):
    """The ``JobState`` times (epoch seconds) on the cluster's clock: :func:`attempt_times`."""

    start_time: float
    gang_start_time: float
    end_time: float
    launch_time: float
    observed_time: float


def attempt_times(job: Json | None, pods: list[Json], now: datetime) -> AttemptTimes:
    """The attempt's times on the cluster's clock (epoch seconds), as ``JobState`` keys; a key
    is left out while unknown:

    - ``start_time``: the earliest pod ``status.startTime`` (the kubelet took the pod: its
      node is held from then, image pull included);
    - ``gang_start_time``: the latest trainer container ``startedAt`` (the gang could assemble,
      and the trainer's program start, only then);
    - ``end_time``: the latest trainer container ``terminated.finishedAt``, once every pod has
      one (a pod on a vanished node never gets one: the state's ``observed_time`` is then the
      nearest the cluster says);
    - a finished Job with no pod left to say (deleted by hand, or with a pod GC): the Job's
      ``status.startTime`` and ``status.completionTime`` (or its ``Failed`` condition's time);
    - ``launch_time``: the job's ``creationTimestamp``; ``observed_time``: ``now``.

    :param now: when the backend read ``job`` and ``pods`` (aware).
    """
    out: AttemptTimes = {"observed_time": now.timestamp()}
    meta, status = (job or {}).get("metadata") or {}, (job or {}).get("status") or {}
    created = _epoch(meta.get("creationTimestamp"))
    if created is not None:
        out["launch_time"] = created
    states = [_container_status(p).get("state") or {} for p in pods]
    starts = [t for p in pods if (t := _epoch((p.get("status") or {}).get("startTime"))) is not None]
    began = [
        t
        for st in states
        if (t := _epoch((st.get("running") or st.get("terminated") or {}).get("startedAt"))) is not None
    ]
    ends = [_epoch((st.get("terminated") or {}).get("finishedAt")) for st in states]
    if not pods and job is not None and job_outcome(job)[0] in ("succeeded", "failed"):
        # finished, its pods gone: the Job's own account (a Job without pods yet bills nothing)
        starts = [t for t in [_epoch(status.get("startTime"))] if t is not None]
        failed = _true(job, "Failed")
        ends = [_epoch(status.get("completionTime") or (failed or {}).get("lastTransitionTime"))]
    if starts:
        out["start_time"] = min(starts)
    if began:
        out["gang_start_time"] = max(began)
    if ends and all(t is not None for t in ends):
        out["end_time"] = max(t for t in ends if t is not None)
    return out


def job_state(
    job: Json | None,
    pods: list[Json],
    *,
    now: datetime,
    unschedulable_deadline_s: float,
    node_names_present: set[str] | None = None,
) -> JobState:
    """The backend state of one attempt.

    :param job: the Job, PyTorchJob or TrainJob, or None when it no longer exists.
    :param pods: the attempt's pods.
    :param now: the current time (aware), for the unschedulable deadline.
    :param unschedulable_deadline_s: how long pods may stay unschedulable before the attempt
        counts as an infrastructure failure (not while Kueue holds the job suspended).
    :param node_names_present: the names of the pods' nodes that still exist; None: unknown.
    :return: ``{"phase", "reason", "nodes", "disruptions"}``, the attempt's times on the
        cluster's clock (:func:`attempt_times`), and ``infra_reason`` when the
        infrastructure, not the program, stopped the attempt; ``unschedulable: True`` (only)
        when that was pods finding no node past the deadline.
    """
    pods = sorted(pods, key=lambda p: (node_index(p) is None, node_index(p) or 0))
    nodes: list[NodeState] = []
    disruptions: list[Disruption] = []
    for pod in pods:
        node = node_of(pod)
        nodes.append(node)
        disruption = disruption_of(pod, node, node_names_present)
        if disruption:
            disruptions.append(disruption)
    state: JobState = {"phase": "running", "reason": None, "nodes": nodes, "disruptions": disruptions}
    state.update(attempt_times(job, pods, now))
    evicted = eviction_reason(nodes)
    if evicted:  # whatever the job says next: the operator must not count it as a preemption
        state["infra_reason"] = evicted
    oom = [n for n in nodes if n["reason"] == "OOMKilled"]
    oom_reason = "; ".join(
        f"OOMKilled: pod {n['pod']} (node {n['index']}) exceeded its memory "
        "limit (exit 137); raise memory or lower the batch"
        for n in oom
    )

    if job is None:
        return {
            **state,
            "phase": "lost",
            "reason": "the job object no longer exists (deleted outside trainops?)",
        }
    outcome, why = job_outcome(job)
    if outcome == "succeeded":
        return {**state, "phase": "succeeded", "reason": why}
    if outcome == "failed":
        in_job = disruption_in_job(job)
        # The disrupted pod may be gone already: then the Job's condition is the only trace. A
        # pod still listed speaks for itself (an evicted one is no preemption).
        if not disruptions and in_job is not None and in_job["pod"] not in {n["pod"] for n in nodes}:
            disruptions = [in_job]
        return {
            **state,
            "phase": "failed",
            "reason": "; ".join(p for p in (oom_reason, why) if p),
            "disruptions": disruptions,
        }
    if outcome == "suspended":
        return {
            **state,
            "phase": "pending",
            "reason": "suspended: waiting for Kueue to admit it (queued, not stuck)",
        }
    lost = [d for d in disruptions if d["reason"] == "NodeLost"]
    if lost:  # the gang cannot finish without that node; nothing will end the attempt sooner
        return {**state, "phase": "lost", "reason": lost[0]["message"]}
    failed = _start_failure(state, nodes) or _unschedulable_failure(
        state, pods, nodes, now=now, deadline_s=unschedulable_deadline_s
    )
    if failed is not None:
        return failed
    if any(n["phase"] == "Running" for n in nodes):
        return state
    return {**state, "phase": "pending", "reason": "waiting for pods" if not nodes else None}


def _start_failure(state: JobState, nodes: list[NodeState]) -> JobState | None:
    """The attempt failed when a pod cannot pull its image or cannot start (its config names
    something missing); None when no pod is stuck so."""
    for node in nodes:
        if node["reason"] in IMAGE_PULL_REASONS:
            why = (
                f"{node['reason']}: pod {node['pod']} cannot pull its image"
                f" ({node['message'] or 'see kubectl describe pod'})"
            )
            return {**state, "phase": "failed", "reason": why, "infra_reason": why}
        if node["reason"] in CONFIG_ERROR_REASONS:
            return {
                **state,
                "phase": "failed",
                "reason": f"{node['reason']}: pod {node['pod']} cannot start "
                f"({node['message'] or 'see kubectl describe pod'}); fix the image "
                "name, Secret or volume it names",
            }
    return None


def _unschedulable_failure(
    state: JobState, pods: list[Json], nodes: list[NodeState], *, now: datetime, deadline_s: float
) -> JobState | None:
    """The attempt failed when a pod found no node past the deadline; None otherwise."""
    for pod, node in zip(pods, nodes, strict=False):
        waited = _unschedulable_for(pod, now)
        if waited is not None and waited > deadline_s:
            message = next(
                (c.get("message") for c in _conditions(pod) if c.get("type") == "PodScheduled"), None
            )
            why = (
                f"Unschedulable: pod {node['pod']} found no node for {waited:.0f}s "
                f"(deadline {deadline_s:.0f}s): {message or 'no message'}"
            )
            # "unschedulable": the operator falls back from spot to on-demand on it
            return {**state, "phase": "failed", "reason": why, "infra_reason": why, "unschedulable": True}
    return None
