"""What the job-launching operators share, written once: the cluster options, a cached backend,
defer-or-wait, the task's identity and job labels, the task's deadline, and ``on_kill``. And
what every trainops operator with a report page shares (:class:`ReportingOperator`): the task
log says where the report and the trainops home page are, at the start of each run of the task.

The deadline: Airflow 3.3 bounds each *worker run* of a task by ``execution_timeout`` (a
SIGALRM, then ``on_kill``), not a deferral, and when a deferral's own timeout fires, the
triggerer cancels the trigger without its ``on_kill`` and the task resumes in
``resume_execution("__fail__")``, which raises ``TaskDeferralTimeout``. So the operator makes
``execution_timeout`` the deadline of the whole try: it hands it to every trigger (which reports
``deadline`` shortly before it, for the operator to delete the job and record the attempt),
defers with it as Airflow's own timeout, and, should that one win anyway, deletes the task's
live jobs in ``resume_execution`` before Airflow fails the task.

Like the Amazon provider's ``AwsBaseOperator``: a subclass only says what it launches. The
constructor stays cheap (it runs at every DAG parse); the backend is built on first use.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypedDict, cast

from airflow.configuration import conf
from airflow.sdk import BaseOperator

import trainops.cluster
from trainer.contract import safe_segment
from trainops.cluster import CLUSTERS
from trainops.links import StoredReportLink, home_url, report_url
from trainops.operators.cleanup import deletes_finished
from trainops.operators.job_options import check_job_options
from trainops.operators.params import seconds
from trainops.triggers.job import JobTrigger
from trainops.triggers.outage import DEFAULT_API_OUTAGE_TOLERANCE_S

if TYPE_CHECKING:
    from trainops.cluster.base import ClusterBackend, JobHandle

DEFAULT_IMAGE = "trainops-trainer:latest"
TRIGGER_FAIL = "__fail__"  # Airflow's next_method for a deferral its scheduler failed (timeout)


class TaskLog(Protocol):
    """The task log (an operator's ``log``), as the operators' helper modules take it."""

    def info(self, msg: str, /, *args: object) -> object: ...

    def warning(self, msg: str, /, *args: object) -> object: ...


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
    return conf.getboolean("trainops", "default_deferrable", fallback=True)


def wait_here(trigger: Any) -> dict[str, Any]:
    """Run ``trigger`` in this process until its first event (``deferrable=False``): the same
    waiting, polling and logging as in the triggerer, holding this worker slot."""
    trigger.settle_s = 0.0  # no scheduler to race here (see trainops.triggers.job)

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise RuntimeError(f"{type(trigger).__name__} ended without an event")

    return asyncio.run(first())


class ReportingOperator(BaseOperator):
    """The base of the trainops operators whose work shows on the report pages: at the start of
    each run of the task (``pre_execute``, which Airflow calls before ``execute`` and before a
    resume after a deferral), the log names the report's URL when the operator can tell it then
    (:meth:`report_uri`), else the report link (``operator_extra_links``) that will open it, and
    the trainops home page, which lists every run, model and dataset. A failure to tell is a
    warning; it never fails the task."""

    def report_uri(self, context: Mapping[str, Any]) -> str | None:
        """The storage URI of this task's report when it is known before ``execute`` (None:
        it is not, e.g. a dataset version or a model version is decided while it runs)."""
        return None

    def pre_execute(self, context: Any) -> None:
        try:
            names = [link.name for link in self.operator_extra_links if isinstance(link, StoredReportLink)]
            uri = self.report_uri(context)
            if uri is not None:
                self.log.info("trainops %s: %s", names[0] if names else "report", report_url(uri))
            elif names:
                self.log.info("trainops %s: on this task's %r link once it is written", names[0], names[0])
            self.log.info("trainops home (runs, models, datasets): %s", home_url())
        except Exception as exc:  # a log line must not fail the task
            self.log.warning("could not tell where this task's trainops report is: %s", exc)
        super().pre_execute(context)


class ClusterJobOperator(ReportingOperator):
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
    :param api_outage_tolerance: seconds the cluster's API (or storage) may keep failing reads
        while a job is watched before the wait ends with an error, a positive number (default
        600). Shorter failures are retried with back-off and logged; no read failure ever
        deletes a job.

    ``execution_timeout`` bounds the whole try, deferrals included: shortly before it the job
    is deleted and the task fails (see the module docstring).
    """

    # Labels, besides the task's own, that mark this operator's jobs (``find`` and on_kill).
    job_role_labels: ClassVar[Mapping[str, str]] = {}
    # Whether the resume methods handle a ``deadline`` event themselves; if not, the base
    # deletes the event's job and fails the task before they are called.
    handles_deadline: ClassVar[bool] = False
    # Finished jobs are deleted once read (``clean_up``); the training operator has a parameter.
    keep_finished_jobs: bool = False

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
        api_outage_tolerance: float = DEFAULT_API_OUTAGE_TOLERANCE_S,
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
        self.api_outage_tolerance = seconds(
            "api_outage_tolerance", api_outage_tolerance, default=DEFAULT_API_OUTAGE_TOLERANCE_S
        )
        self._task_labels: dict[str, str] | None = None
        self._deadline: float | None = None  # epoch seconds; see task_deadline
        self._deadline_known = False

    def cluster_options(self) -> dict[str, Any]:
        """What the backend needs besides its name, here and in the trigger (which builds
        its own from them)."""
        if self.cluster == "kubernetes":
            return {"kubernetes_conn_id": self.kubernetes_conn_id, "namespace": self.namespace}
        return {}

    @cached_property
    def backend(self) -> ClusterBackend:
        """The cluster backend, built on first use (never at DAG parse)."""
        # Looked up on the package at each call: the one seam where tests put a fake backend.
        return trainops.cluster.get_cluster(self.cluster, **self.cluster_options())

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
        trigger = JobTrigger(
            handle=handle,
            poll_interval=self.poll_interval,
            cluster_options=self.cluster_options(),
            stream_logs=True,
            **trigger_options,
        )
        return self.defer_or_wait(context, trigger, "execute_complete")

    def task_deadline(self, context: Mapping[str, Any]) -> float | None:
        """When this try's ``execution_timeout`` ends, in epoch seconds (None: no timeout):
        from the try's start in ``execute``; after a deferral, as the trigger's event carried
        it (see :meth:`resume_execution`)."""
        if not self._deadline_known:
            self._deadline_known = True
            if self.execution_timeout is not None:
                started = getattr(context.get("ti"), "start_date", None)
                start = started.timestamp() if isinstance(started, datetime) else time.time()
                self._deadline = start + self.execution_timeout.total_seconds()
        return self._deadline

    def defer_or_wait(self, context: Mapping[str, Any], trigger: Any, method_name: str) -> Any:
        """Defer to ``trigger`` (deferrable), or run it here until its event; then
        ``method_name(context, event)`` decides, in this worker or after the deferral.

        Every trigger gets the task's settings: ``api_outage_tolerance`` and the deadline;
        a deferral also gets the deadline as Airflow's own timeout (the backstop)."""
        deadline = self.task_deadline(context)
        if hasattr(trigger, "deadline"):
            trigger.deadline = deadline
        if hasattr(trigger, "api_outage_tolerance"):
            trigger.api_outage_tolerance = self.api_outage_tolerance
        if self.deferrable:
            timeout = None if deadline is None else timedelta(seconds=max(1.0, deadline - time.time()))
            self.defer(trigger=trigger, method_name=method_name, timeout=timeout)
        event = wait_here(trigger)
        self._unhandled_deadline(event)
        return getattr(self, method_name)(context, event)

    def _unhandled_deadline(self, event: object) -> None:
        """On a ``deadline`` event this operator does not handle itself: delete its job, fail."""
        if self.handles_deadline or not isinstance(event, dict) or event.get("status") != "deadline":
            return
        handle = event.get("handle")
        if isinstance(handle, dict) and handle.get("job_id"):
            self.backend.delete(cast("JobHandle", handle))
        raise RuntimeError(f"{event.get('message')}; the job was deleted")

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any) -> Any:
        """Resume after a deferral: take the deadline from the trigger's event; when Airflow
        failed the deferral itself (its timeout won the race against the trigger's
        ``deadline`` event), delete the task's live jobs first, so nothing runs unwatched."""
        event = (next_kwargs or {}).get("event")
        if isinstance(event, dict) and "deadline" in event:
            deadline = event["deadline"]
            self._deadline = float(deadline) if isinstance(deadline, int | float) else None
            self._deadline_known = True
        self._unhandled_deadline(event)
        if next_method == TRIGGER_FAIL:
            error = (next_kwargs or {}).get("error", "unknown")
            error = getattr(error, "value", error)  # Airflow's TriggerFailureReason, as its text
            why = f"Airflow failed the deferral ({error})"
            self.delete_live_jobs(context, why=why)
            try:
                self.record_abandoned(context, why)
            except Exception:  # best effort: Airflow's own failure is the one to raise
                self.log.exception("could not record the abandoned attempt")
        return super().resume_execution(next_method, next_kwargs, context)

    def record_abandoned(self, context: Any, why: str) -> None:
        """Record, where the operator keeps a record, that its job was deleted because Airflow
        failed the deferral (``why``). Nothing to record by default."""

    def delete_live_jobs(self, context: Mapping[str, Any], *, why: str) -> list[str]:
        """Delete every live job of this task instance (all nodes); the job ids deleted.
        Best effort: a failure is logged, never raised over the task's own error."""
        deleted: list[str] = []
        try:
            for handle in self.live_jobs(context):
                self.backend.delete(handle)
                deleted.append(handle["job_id"])
        except Exception:
            self.log.exception("%s: could not delete the task's jobs; check the cluster for them", why)
            return deleted
        if deleted:
            self.log.error("%s: deleted job(s) %s so that nothing runs unwatched", why, ", ".join(deleted))
        return deleted

    def clean_up(self, handle: JobHandle, action: str) -> None:
        """Delete a finished job, its Service and PodGroup, once what it left is read and
        recorded (``action``: ``finish`` or ``fail``; unless ``keep_finished_jobs``). A failed
        deletion is logged: the task's outcome stands."""
        if not deletes_finished(self.keep_finished_jobs, action):
            return
        try:
            self.backend.delete(handle)
        except Exception as exc:
            self.log.warning(
                "could not delete the finished job %s (%s); delete it by hand, e.g. "
                "kubectl delete job,pytorchjob,trainjob,service -l trainops/job=%s",
                handle["job_id"],
                exc,
                handle["job_id"],
            )
            return
        self.log.info("deleted the finished job %s", handle["job_id"])

    def on_kill(self) -> None:
        """Killing the task deletes its live jobs (all nodes), so nothing runs unwatched."""
        try:
            if not self._task_labels:
                return
            for handle in self.backend.find(self._task_labels):
                self.backend.delete(handle)
        except Exception:  # best effort: on_kill must not raise
            self.log.exception("could not delete the task's jobs")
