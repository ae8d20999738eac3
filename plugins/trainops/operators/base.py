"""What the job-launching operators share, written once: the cluster options, a cached backend,
defer-or-wait, the task's identity and job labels, and ``on_kill``.

Like the Amazon provider's ``AwsBaseOperator``: a subclass only says what it launches. The
constructor stays cheap (it runs at every DAG parse); the backend is built on first use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

from airflow.sdk import BaseOperator

from trainops.cluster import CLUSTERS
from trainops.operators.job_options import check_job_options
from trainops.operators.params import seconds

if TYPE_CHECKING:
    from trainops.cluster.base import ClusterBackend, JobHandle

DEFAULT_IMAGE = "trainops-trainer:latest"


class TaskIdentity(TypedDict):
    """The running task instance: what names its run prefix, its jobs and their labels."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int


def now_iso() -> str:
    """Now, in UTC, as the records write it (``2026-01-01T00:00:00+00:00``)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def task_identity(context: Mapping[str, Any]) -> TaskIdentity:
    """dag_id, run_id, task_id and map_index of the running task instance."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": map_index if map_index is not None else -1,
    }


def job_labels(identity: TaskIdentity) -> dict[str, str]:
    """Labels that find a task's live job again after a worker or scheduler restart."""
    from trainer.contract import safe_segment

    return {
        "trainops/dag": safe_segment(identity["dag_id"]),
        "trainops/run": safe_segment(identity["run_id"]),
        "trainops/task": safe_segment(identity["task_id"]),
        "trainops/map-index": str(identity["map_index"]),
    }


def job_name(prefix: str, identity: TaskIdentity, attempt: int) -> str:
    """A DNS-1123 name unique per run and attempt, short enough for pod names."""
    digest = hashlib.sha1(
        f"{identity['dag_id']}/{identity['run_id']}/{identity['task_id']}/{identity['map_index']}".encode()
    ).hexdigest()[:8]
    return f"{prefix}-{digest}-a{attempt}"


def default_deferrable() -> bool:
    """``[trainops] default_deferrable`` (env ``AIRFLOW__TRAINOPS__DEFAULT_DEFERRABLE``), True
    when unset. Not Airflow's ``[operators] default_deferrable``, which ships False: a training
    gang runs for hours and must not hold a worker slot unless someone asks for it."""
    from airflow.configuration import conf

    return conf.getboolean("trainops", "default_deferrable", fallback=True)


def wait_here(trigger: Any) -> dict[str, Any]:
    """Run ``trigger`` in this process until its first event (``deferrable=False``): the same
    waiting, polling and logging as in the triggerer, holding this worker slot."""
    import asyncio

    trigger.settle_s = 0.0  # no scheduler to race here (see trainops.triggers.job)

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise RuntimeError(f"{type(trigger).__name__} ended without an event")

    return asyncio.run(first())


class ClusterJobOperator(BaseOperator):
    """The base of the operators that run their work as jobs on a cluster backend.

    :param cluster: ``local`` (this host; the embedded default) or ``kubernetes``.
    :param image: the image of the job's pods (Kubernetes).
    :param namespace: Kubernetes namespace of the jobs.
    :param job_options: further ``JobSpec`` fields for the cluster, checked when the DAG is
        parsed (see :mod:`trainops.operators.job_options`).
    :param deferrable: wait in the triggerer (True) or in this worker slot (False), with the
        same trigger either way. Default: ``[trainops] default_deferrable``, True when unset.
    :param poll_interval: seconds between job state polls, a positive number.
    :param storage_root: ``file://`` or ``s3://`` root (default: the embedded root).
    :param aws_conn_id: Airflow connection for ``s3://`` storage.
    :param kubernetes_conn_id: Airflow connection for ``cluster='kubernetes'``.
    """

    # Labels, besides the task's own, that mark this operator's jobs (``find`` and on_kill).
    job_role_labels: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self,
        *,
        cluster: str = "local",
        image: str = DEFAULT_IMAGE,
        namespace: str = "default",
        job_options: dict[str, Any] | None = None,
        deferrable: bool | None = None,
        poll_interval: float = 5.0,
        storage_root: str | None = None,
        aws_conn_id: str | None = "aws_default",
        kubernetes_conn_id: str | None = "kubernetes_default",
        **kwargs: Any,
    ) -> None:
        if cluster not in CLUSTERS:
            raise ValueError(f"cluster must be one of {CLUSTERS}, got {cluster!r}")
        checked_options = check_job_options(job_options, image=image, namespace=namespace)
        super().__init__(**kwargs)
        self.cluster = cluster
        self.image, self.namespace = image, namespace
        self.job_options = checked_options
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.poll_interval = seconds("poll_interval", poll_interval, default=5.0)
        self.storage_root, self.aws_conn_id = storage_root, aws_conn_id
        self.kubernetes_conn_id = kubernetes_conn_id
        self._task_labels: dict[str, str] | None = None

    def cluster_options(self) -> dict[str, Any]:
        """What the backend needs besides its name, here and in the trigger (which builds
        its own from them)."""
        if self.cluster == "kubernetes":
            return {"kubernetes_conn_id": self.kubernetes_conn_id, "namespace": self.namespace}
        return {}

    @cached_property
    def backend(self) -> ClusterBackend:
        """The cluster backend, built on first use (never at DAG parse)."""
        from trainops.cluster import get_cluster

        return get_cluster(self.cluster, **self.cluster_options())

    def task_labels(self, context: Mapping[str, Any]) -> dict[str, str]:
        """The labels of every job this task instance launches (any attempt); ``on_kill``
        deletes the live jobs that carry them."""
        self._task_labels = {**job_labels(task_identity(context)), **self.job_role_labels}
        return dict(self._task_labels)

    def live_jobs(self, context: Mapping[str, Any]) -> list[JobHandle]:
        """The task's jobs still alive (a re-run task reattaches to them)."""
        return self.backend.find(self.task_labels(context))

    def wait_for(self, context: Mapping[str, Any], handle: JobHandle, **trigger_options: Any) -> Any:
        """Wait for the job with :class:`~trainops.triggers.job.JobTrigger` (node 0's log
        lines copied into the task log), then call ``execute_complete`` with its event."""
        from trainops.triggers.job import JobTrigger

        trigger = JobTrigger(
            handle=handle,
            poll_interval=self.poll_interval,
            cluster_options=self.cluster_options(),
            stream_logs=True,
            **trigger_options,
        )
        return self.defer_or_wait(context, trigger, "execute_complete")

    def defer_or_wait(self, context: Mapping[str, Any], trigger: Any, method_name: str) -> Any:
        """Defer to ``trigger`` (deferrable), or run it here until its event; then
        ``method_name(context, event)`` decides, in this worker or after the deferral."""
        if self.deferrable:
            self.defer(trigger=trigger, method_name=method_name)
        return getattr(self, method_name)(context, wait_here(trigger))

    def on_kill(self) -> None:
        """Killing the task deletes its live jobs (all nodes), so nothing runs unwatched."""
        try:
            if not self._task_labels:
                return
            for handle in self.backend.find(self._task_labels):
                self.backend.delete(handle)
        except Exception:  # best effort: on_kill must not raise
            self.log.exception("could not delete the task's jobs")
