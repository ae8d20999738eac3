"""The training run's ``job.json`` in storage: read back (refused when another task instance
owns it), claimed create-only, and each launch recorded: the intent before the backend's
``launch``, the handle after it. The folds are :mod:`trainops.recovery.record`'s; this is their
storage edge."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.contract import RunLayout
from trainer.storage import NotFound, PreconditionFailed, Storage
from trainops.cluster.base import ClusterBackend, JobAlreadyExists, JobHandle
from trainops.cluster.spec import JobSpec
from trainops.operators.base import TaskIdentity, TaskLog
from trainops.operators.launch_plan import AttemptLaunch
from trainops.recovery.driver import missing_record
from trainops.recovery.record import (
    JobRecord,
    RunFolderTaken,
    as_job_record,
    current_attempt,
    intend_attempt,
    owner_refusal,
    record_launched,
    start_record,
)


@dataclass(frozen=True)
class OperatorCall:
    """One call of the training operator: Airflow's context, storage, the run's layout, the task."""

    context: Any
    store: Storage
    layout: RunLayout
    identity: TaskIdentity


def read_job(store: Storage, layout: RunLayout, identity: TaskIdentity) -> JobRecord | None:
    """The run's job.json (None: none yet); :class:`RunFolderTaken` when another task
    instance owns it."""
    try:
        job = as_job_record(store.get_json(layout.job), layout.job)
    except NotFound:
        return None
    refusal = owner_refusal(job, {**identity}, layout.job)
    if refusal is not None:
        raise RunFolderTaken(refusal)
    return job


def claim(
    store: Storage,
    layout: RunLayout,
    identity: TaskIdentity,
    *,
    cluster: str,
    capacity: str,
    read: Callable[[], JobRecord | None],
) -> JobRecord:
    """The run's job.json, created (create-only) naming ``identity`` as its owner, or read
    back when it exists (``read``: :func:`read_job`, as the operator calls it).

    :raises RunFolderTaken: it names another owner."""
    job = read()
    if job is None:
        job = start_record(
            run_uri=layout.run_uri,
            config_uri=layout.config,
            cluster=cluster,
            capacity=capacity,
            owner={**identity},
        )
        try:
            store.put_json(layout.job, job, if_none_match=True)
        except PreconditionFailed:  # another writer created it first: whose is it?
            found = read()
            if found is None:
                raise RuntimeError(missing_record(layout.job)) from None
            job = found
    if "airflow" not in job:  # a record from before owners were kept: this task adopts it
        job["airflow"] = {**identity}
        store.put_json(layout.job, job)
    return job


def record_intent(
    store: Storage,
    layout: RunLayout,
    job: JobRecord,
    spec: JobSpec,
    *,
    manifests: Callable[[JobSpec], list[dict[str, Any]]],
    at: str,
    try_number: int | None,
) -> JobRecord:
    """``job`` with its next attempt recorded as ``launching`` as ``spec`` (written), unless the
    record already holds a current attempt: intent before action.

    :param manifests: what the cluster is given for ``spec`` (``launch_plan.manifests_of``)."""
    if current_attempt(job) is not None:
        return job
    job = intend_attempt(job, spec=spec, manifests=manifests(spec), at=at, try_number=try_number)
    store.put_json(layout.job, job)
    return job


def record_handle(
    store: Storage, layout: RunLayout, job: JobRecord, attempt: int, handle: JobHandle, *, at: str
) -> JobRecord:
    """``job`` with ``attempt`` running as ``handle``, written when that is news."""
    recorded = record_launched(job, attempt=attempt, handle=handle, at=at)
    if recorded is not job:
        store.put_json(layout.job, recorded)
    return recorded


def launch(
    backend: ClusterBackend,
    store: Storage,
    layout: RunLayout,
    job: JobRecord,
    attempt: int,
    launched: AttemptLaunch,
    *,
    at: str,
    log: TaskLog,
) -> JobHandle:
    """Launch attempt ``attempt`` (its intent already in ``job``) and record its handle; the
    handle to wait for. A job of the attempt that already exists (an earlier launch whose reply
    was lost) is reattached to, never launched a second time."""
    spec, chaos = launched.spec, launched.chaos
    try:
        handle = backend.launch(spec, chaos=chaos)
    except JobAlreadyExists as exists:
        log.warning("attempt %d: %s; reattaching to it instead of launching a second one", attempt, exists)
        record_handle(store, layout, job, attempt, exists.handle, at=at)
        return exists.handle
    record_handle(store, layout, job, attempt, handle, at=at)
    injected = f"; will inject a preemption at step {chaos['at_step']}" if chaos else ""
    log.info(
        "attempt %d: launched %s (%d node(s) x %d process(es), %s capacity)%s",
        attempt,
        handle["job_id"],
        spec.nodes,
        spec.procs_per_node,
        spec.capacity,
        injected,
    )
    return handle
