"""JobTrigger: waits in the triggerer until a cluster job finishes, then reports its state.

It only waits and reports; the operator decides what the state means. Its ``cleanup()`` deletes
nothing, so a triggerer restart (which cancels and re-creates triggers) is harmless; only
``on_kill()``, which Airflow calls when a user kills the deferred task (mark failed, clear),
deletes the job and its pods.

Neither trigger reports sooner than ``settle_s`` after the task deferred. Airflow 3.3 fails a
deferred task whose trigger fires before the scheduler has processed the executor's event for
the worker that deferred (the worker lingers about 5 s after deferring): the stale "success"
of that exit meets a task instance already re-queued, and the scheduler marks it failed
(apache/airflow#66374, #72716). Real training outlasts the window; a quick attempt, a fast
relaunch after a preemption and the demo's tiny model do not.

A failed read (status, logs, progress, heartbeat) is weather, not a verdict: it is retried with
a back-off and logged once per failure with a running count (:mod:`trainops.triggers.outage`);
only status reads failing for longer than ``api_outage_tolerance`` end the wait, with an
``error`` event on which the operator deletes nothing.

Airflow 3.3 does not bound a deferral by ``execution_timeout`` (only each worker run of the
task), and when a deferral's own timeout fires it cancels the trigger without ``on_kill``. So
the operator hands both triggers the task's ``deadline`` (epoch seconds), and they report a
``deadline`` event :data:`DEADLINE_MARGIN_S` before it, for the operator to delete the job.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.triggers.base import BaseTrigger, TriggerEvent

import trainops.cluster  # get_cluster looked up at each call: where tests put a fake backend
from trainer.contract import MetricsReader, parse_heartbeat
from trainer.storage import NotFound
from trainops.cluster.base import FINAL_PHASES, ClusterBackend, JobHandle, JobState, LogCursor
from trainops.hooks.storage import storage_for
from trainops.recovery.hang import STARTUP_ALLOWANCE_S, HangLimit, hang_limit, hang_verdict
from trainops.triggers.events import JobEvent, Status
from trainops.triggers.outage import DEFAULT_API_OUTAGE_TOLERANCE_S, RETRY_CAP_S, Outage

if TYPE_CHECKING:
    from trainer.contract import Heartbeat, MetricsReader
    from trainer.storage import Storage

DEFAULT_SETTLE_S = 20.0
# How long one read of the metrics for a progress line rides out a storage outage. Short: the
# line is optional, and the poll loop waits for it before it looks at the job again.
PROGRESS_OUTAGE_TOLERANCE_S = 5.0
# A trigger reports the deadline this long before it: Airflow's scheduler fails a deferral whose
# own timeout passed within [scheduler] trigger_timeout_check_interval (15 s), and the event must
# reach the operator, which still deletes the job, before that.
DEADLINE_MARGIN_S = 30.0
# The hang timeout is logged again when it moves by more than this factor either way.
HANG_LOG_CHANGE = 2.0


def settle_seconds() -> float:
    """``[trainops] trigger_settle_seconds`` (default 20): how long after deferring a trigger
    waits at least before it reports. ``dag.test()`` runs triggers in its own process with no
    scheduler to race, so ``python -m trainops demo`` and the tests set 0."""
    return conf.getfloat("trainops", "trigger_settle_seconds", fallback=DEFAULT_SETTLE_S)


def _event(event: JobEvent) -> TriggerEvent:
    """The trigger event for ``event`` (typed here, so every event has the declared shape)."""
    return TriggerEvent(event)


async def settled(started_at: float, settle_s: float) -> None:
    """Sleep until ``settle_s`` after ``started_at`` (see the module docstring)."""
    remaining = started_at + settle_s - time.time()
    if remaining > 0:
        await asyncio.sleep(remaining)


def until_deadline(deadline: float | None) -> float | None:
    """Seconds until a trigger must report ``deadline`` (<= 0: now); None without a deadline."""
    return None if deadline is None else deadline - DEADLINE_MARGIN_S - time.time()


def deadline_message(handle: JobHandle, deadline: float) -> str:
    """The ``deadline`` event's message."""
    at = datetime.fromtimestamp(deadline, UTC).isoformat(timespec="seconds")
    return (
        f"the task's execution_timeout ends at {at}, in {max(0.0, deadline - time.time()):.0f} s "
        f"(job {handle['job_id']} is stopped before it)"
    )


def retry_base(poll_interval: float) -> float:
    """The first back-off of a failing read: a second, or the poll interval when shorter."""
    return min(1.0, poll_interval)


class JobTrigger(BaseTrigger):
    """Poll a job's state through its cluster backend.

    :param handle: the backend's job handle (a plain dict, :class:`~trainops.cluster.base.JobHandle`).
    :param poll_interval: seconds between polls.
    :param timeout: seconds after which to report ``{"status": "timeout"}`` (None: never).
    :param cluster_options: backend options, e.g. ``{"state_dir": ...}`` for ``local``.
    :param progress_uri: the run's metrics (``RunLayout.metrics``, or the run prefix: see
        ``trainer.contract.metrics_run_uri``); when set, the latest step of this attempt
        is logged every ``progress_every`` seconds, so the task log shows training progress.
        Optional: a read that fails (storage out for :data:`PROGRESS_OUTAGE_TOLERANCE_S`) is
        logged once, until a read succeeds again, and never ends the wait.
    :param aws_conn_id: Airflow connection to read ``progress_uri`` on ``s3://``.
    :param stream_logs: copy node 0's new log lines (rank 0's output) into the task log at
        every poll, through the backend's ``log_lines``. After a triggerer restart the stream
        starts again from the last lines (at most 200), so a few lines may appear twice.
    :param settle_s: report no sooner than this after ``started_at`` (None: ``[trainops]
        trigger_settle_seconds``; see the module docstring).
    :param api_outage_tolerance: seconds status reads may keep failing (retried with back-off)
        before the trigger reports ``error``; the job is left alone either way.
    :param heartbeat_uri: this attempt's heartbeat (``RunLayout.heartbeat``); when set, the
        trigger reports ``hung`` once no new step came for the hang timeout
        (:func:`trainops.recovery.hang.hang_verdict`). A heartbeat that cannot be read is no
        verdict: the watch waits for a read that works.
    :param hang_timeout: seconds without a new step that mean hung (None: derived from the
        attempt's pace, see :mod:`trainops.recovery.hang`). The effective limit is logged when
        the watch first reads a heartbeat, and again when another rule gives it or it changes
        more than twofold.
    :param startup_allowance: extra seconds allowed for the attempt's first steps, and while
        rank 0 is busy in a checkpoint save or the export.
    :param deadline: epoch seconds when the task's ``execution_timeout`` ends (None: never);
        the trigger reports ``deadline`` :data:`DEADLINE_MARGIN_S` before it.
    """

    def __init__(
        self,
        *,
        handle: JobHandle,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        cluster_options: dict[str, Any] | None = None,
        started_at: float | None = None,
        progress_uri: str | None = None,
        progress_every: float = 30.0,
        aws_conn_id: str | None = None,
        stream_logs: bool = False,
        settle_s: float | None = None,
        api_outage_tolerance: float = DEFAULT_API_OUTAGE_TOLERANCE_S,
        heartbeat_uri: str | None = None,
        hang_timeout: float | None = None,
        startup_allowance: float = STARTUP_ALLOWANCE_S,
        deadline: float | None = None,
    ):
        super().__init__()
        self.handle = handle
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.api_outage_tolerance = api_outage_tolerance
        self.heartbeat_uri = heartbeat_uri
        self.hang_timeout = hang_timeout
        self.startup_allowance = startup_allowance
        self.deadline = deadline
        self.cluster_options = cluster_options or {}
        self.started_at = started_at if started_at is not None else time.time()
        self.progress_uri = progress_uri
        self.progress_every = progress_every
        self.aws_conn_id = aws_conn_id
        self.stream_logs = stream_logs
        self.settle_s = settle_seconds() if settle_s is None else settle_s
        self._log_cursor: LogCursor | None = None
        self._store: Storage | None = None  # one connection lookup per trigger, not per poll
        self._metrics: MetricsReader | None = None  # what the progress lines read so far
        self._progress_failing = False  # a failed progress read was logged; quiet until one works
        self._status_reads = self._outage("status read")
        self._log_reads = self._outage("log read")
        self._heartbeat_reads = self._outage("heartbeat read")
        self._running_since: float | None = None  # when this trigger first saw the job running
        self._readable_since: float | None = None  # since when heartbeat reads work unbroken
        self._logged_limit: HangLimit | None = None  # the hang limit as last logged

    def _outage(self, what: str) -> Outage:
        """A fresh count of failing reads of ``what`` (built again when the run starts: the
        operator may set ``api_outage_tolerance`` after construction)."""
        return Outage(
            what,
            self.api_outage_tolerance,
            self.log,
            base_s=retry_base(self.poll_interval),
            cap_s=RETRY_CAP_S,
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "handle": self.handle,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
                "cluster_options": self.cluster_options,
                "started_at": self.started_at,
                "progress_uri": self.progress_uri,
                "progress_every": self.progress_every,
                "aws_conn_id": self.aws_conn_id,
                "stream_logs": self.stream_logs,
                "settle_s": self.settle_s,
                "api_outage_tolerance": self.api_outage_tolerance,
                "heartbeat_uri": self.heartbeat_uri,
                "hang_timeout": self.hang_timeout,
                "startup_allowance": self.startup_allowance,
                "deadline": self.deadline,
            },
        )

    def _progress_line(self, progress_uri: str) -> str | None:
        """This attempt's latest metrics record as one line (blocking: run it in a thread);
        None when there is none yet or it cannot be read (see ``progress_uri``). The reader is
        kept across polls and reads only the attempt's newest part, once."""
        attempt = int(self.handle.get("labels", {}).get("trainops/attempt", 1))
        try:
            if self._store is None:
                self._store = storage_for(
                    progress_uri, self.aws_conn_id, outage_tolerance_s=PROGRESS_OUTAGE_TOLERANCE_S
                )
            if self._metrics is None:
                self._metrics = MetricsReader(self._store, progress_uri, attempt=attempt)
            rec = self._metrics.latest().get(attempt)
        except Exception as exc:
            if not self._progress_failing:
                self._progress_failing = True
                self.log.warning(
                    "no progress lines for now: could not read %s (%s); the job is watched as before",
                    progress_uri,
                    exc,
                )
            return None
        if self._progress_failing:
            self._progress_failing = False
            self.log.info("progress lines resume: %s can be read again", progress_uri)
        if rec is None:
            return None
        rate = f", {rec['tokens_per_s']:,.0f} tok/s" if rec.get("tokens_per_s") else ""
        return f"attempt {attempt}: step {rec['step']}, loss {rec.get('loss', float('nan')):.4f}{rate}"

    def _heartbeat(self, uri: str) -> Heartbeat | None:
        """The attempt's heartbeat (blocking: run it in a thread); None when none is written
        yet or it is not one. A failed read raises: the caller rides it out."""
        if self._store is None:
            self._store = storage_for(uri, self.aws_conn_id, outage_tolerance_s=PROGRESS_OUTAGE_TOLERANCE_S)
        try:
            return parse_heartbeat(json.loads(self._store.get(uri)))
        except NotFound:
            return None
        except ValueError:  # a torn or foreign object: no verdict either way
            return None

    async def _hang(self, state: JobState) -> str | None:
        """Why the attempt is hung, or None (not watched, not running, not hung, or the
        heartbeat could not be read this time)."""
        if self.heartbeat_uri is None or state["phase"] != "running":
            return None
        if self._running_since is None:
            self._running_since = time.time()
        try:
            beat = await asyncio.to_thread(self._heartbeat, self.heartbeat_uri)
        except Exception as exc:  # weather: no verdict until a read works, and the clock restarts
            self._heartbeat_reads.failed(exc)
            self._readable_since = None
            return None
        self._heartbeat_reads.worked()
        if self._readable_since is None:
            self._readable_since = time.time()
        self._log_hang_limit(hang_limit(beat, self.hang_timeout, self.startup_allowance))
        return hang_verdict(
            heartbeat=beat,
            watched_since=max(self._running_since, self._readable_since),
            now=time.time(),
            setting=self.hang_timeout,
            startup_allowance_s=self.startup_allowance,
        )

    def _log_hang_limit(self, limit: HangLimit) -> None:
        """Log the hang limit when first known, when another rule gives it (the pace, once
        warm-up is over) and when the timeout changes more than twofold (the pace moves a little
        with every write; the log says only what a reader would notice)."""
        last = self._logged_limit
        if (
            last is not None
            and last.source == limit.source
            and last.timeout_s / HANG_LOG_CHANGE <= limit.timeout_s <= last.timeout_s * HANG_LOG_CHANGE
        ):
            return
        self._logged_limit = limit
        self.log.info("hang watch: %s", limit.describe())

    async def _copy_log_lines(self, cluster: ClusterBackend) -> None:
        """Node 0's new log lines into this task's log (best effort: a log hiccup is no failure)."""
        try:
            lines, self._log_cursor = await asyncio.to_thread(
                cluster.log_lines, self.handle, self._log_cursor
            )
        except Exception as exc:
            self._log_reads.failed(exc)  # logged with its count; the lines come at the next poll
            return
        self._log_reads.worked()
        for line in lines:
            self.log.info("[node-0] %s", line)

    def _ended(self, status: Status, state: JobState | None, message: str) -> TriggerEvent:
        """An event other than ``finished``, with the job's state as last seen (if any)."""
        event: JobEvent = {"status": status, "handle": self.handle, "message": message}
        if state is not None:
            event["state"] = state
        event["deadline"] = self.deadline
        return _event(event)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:  # a backend that cannot be built is configuration, not weather
            cluster = trainops.cluster.get_cluster(self.handle["cluster"], **self.cluster_options)
        except Exception as exc:
            await settled(self.started_at, self.settle_s)
            yield self._ended("error", None, f"{type(exc).__name__}: {exc}")
            return
        self._status_reads = self._outage("status read")
        self._log_reads = self._outage("log read")
        self._heartbeat_reads = self._outage("heartbeat read")
        last_phase, last_progress = None, 0.0
        seen: JobState | None = None  # the state as last read
        while True:
            to_deadline = until_deadline(self.deadline)
            if to_deadline is not None and to_deadline <= 0:
                assert self.deadline is not None
                await settled(self.started_at, self.settle_s)
                yield self._ended("deadline", seen, deadline_message(self.handle, self.deadline))
                return
            try:
                state: JobState = await asyncio.to_thread(cluster.status, self.handle)
            except Exception as exc:  # weather: retried until the tolerance is spent
                delay = self._status_reads.failed(exc)
                if delay is None:
                    await settled(self.started_at, self.settle_s)
                    yield self._ended("error", seen, self._status_reads.verdict(exc))
                    return
                await asyncio.sleep(delay if to_deadline is None else max(0.01, min(delay, to_deadline)))
                continue
            self._status_reads.worked()
            seen = state
            if state["phase"] != last_phase:
                self.log.info(
                    "job %s is %s%s",
                    self.handle["job_id"],
                    state["phase"],
                    f" ({state['reason']})" if state.get("reason") else "",
                )
                last_phase = state["phase"]
            if self.stream_logs:
                await self._copy_log_lines(cluster)
            if state["phase"] in FINAL_PHASES:
                await settled(self.started_at, self.settle_s)
                yield _event(
                    {"status": "finished", "handle": self.handle, "state": state, "deadline": self.deadline}
                )
                return
            if self.progress_uri and time.monotonic() - last_progress >= self.progress_every:
                last_progress = time.monotonic()
                line = await asyncio.to_thread(self._progress_line, self.progress_uri)
                if line:
                    self.log.info("%s", line)
            hung = await self._hang(state)
            if hung is not None:
                await settled(self.started_at, self.settle_s)
                yield self._ended("hung", state, f"job {self.handle['job_id']}: {hung}")
                return
            if self.timeout is not None and time.time() - self.started_at > self.timeout:
                await settled(self.started_at, self.settle_s)
                yield self._ended(
                    "timeout",
                    state,
                    f"job {self.handle['job_id']} still {state['phase']} after {self.timeout:.0f}s (job_timeout)",
                )
                return
            wait = self.poll_interval if to_deadline is None else min(self.poll_interval, to_deadline)
            await asyncio.sleep(max(0.01, wait))

    async def on_kill(self) -> None:
        """A user killed the deferred task: delete the job and its pods (never on restarts)."""
        cluster = trainops.cluster.get_cluster(self.handle["cluster"], **self.cluster_options)
        await asyncio.to_thread(cluster.delete, self.handle)
        self.log.info("task killed: deleted job %s", self.handle["job_id"])


class JobGoneTrigger(BaseTrigger):
    """Wait until every pod (process) of a deleted attempt is gone, and not before
    ``not_before`` (an infrastructure back-off), then report ``{"status": "gone"}``.

    The next attempt resumes from the newest committed checkpoint, so it must not start while
    an old pod may still be writing its emergency checkpoint. Waiting here keeps the wait
    (the grace period, or a back-off of minutes) out of a worker slot. If pods are still
    there ``deadline_s`` after ``started_at`` it reports ``{"status": "error"}``, naming them.

    :param handle: the deleted attempt's job handle.
    :param not_before: epoch seconds before which not to report (None: as soon as gone).
    :param deadline_s: seconds after ``started_at`` to give up on the pods going away.
    :param settle_s: report no sooner than this after ``started_at`` (None: ``[trainops]
        trigger_settle_seconds``; see the module docstring).
    :param api_outage_tolerance: seconds reads may keep failing (retried with back-off) before
        the trigger reports ``error``.
    :param deadline: epoch seconds when the task's ``execution_timeout`` ends (None: never);
        the trigger reports ``deadline`` :data:`DEADLINE_MARGIN_S` before it.
    """

    def __init__(
        self,
        *,
        handle: JobHandle,
        cluster_options: dict[str, Any] | None = None,
        not_before: float | None = None,
        deadline_s: float = 180.0,
        poll_interval: float = 2.0,
        started_at: float | None = None,
        settle_s: float | None = None,
        api_outage_tolerance: float = DEFAULT_API_OUTAGE_TOLERANCE_S,
        deadline: float | None = None,
    ):
        super().__init__()
        self.handle = handle
        self.cluster_options = cluster_options or {}
        self.not_before = not_before
        self.deadline_s = deadline_s
        self.poll_interval = poll_interval
        self.started_at = started_at if started_at is not None else time.time()
        self.settle_s = settle_seconds() if settle_s is None else settle_s
        self.api_outage_tolerance = api_outage_tolerance
        self.deadline = deadline
        self._reads = Outage("pod listing", api_outage_tolerance, self.log, base_s=retry_base(poll_interval))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "handle": self.handle,
                "cluster_options": self.cluster_options,
                "settle_s": self.settle_s,
                "not_before": self.not_before,
                "deadline_s": self.deadline_s,
                "poll_interval": self.poll_interval,
                "started_at": self.started_at,
                "api_outage_tolerance": self.api_outage_tolerance,
                "deadline": self.deadline,
            },
        )

    def _event(self, status: Status, message: str | None = None) -> TriggerEvent:
        event: JobEvent = {"status": status, "handle": self.handle, "deadline": self.deadline}
        if message is not None:
            event["message"] = message
        return _event(event)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:  # a backend that cannot be built is configuration, not weather
            cluster = trainops.cluster.get_cluster(self.handle["cluster"], **self.cluster_options)
        except Exception as exc:
            await settled(self.started_at, self.settle_s)
            yield self._event("error", f"{type(exc).__name__}: {exc}")
            return
        reads = Outage(
            "pod listing",
            self.api_outage_tolerance,
            self.log,
            base_s=retry_base(self.poll_interval),
            cap_s=RETRY_CAP_S,
        )
        gone_logged = False
        while True:
            to_deadline = until_deadline(self.deadline)
            if to_deadline is not None and to_deadline <= 0:
                assert self.deadline is not None
                await settled(self.started_at, self.settle_s)
                yield self._event("deadline", deadline_message(self.handle, self.deadline))
                return
            try:
                gone = await asyncio.to_thread(cluster.all_gone, self.handle)
            except Exception as exc:  # weather: the pods are as they were; ask again
                delay = reads.failed(exc)
                if delay is None:
                    await settled(self.started_at, self.settle_s)
                    yield self._event(
                        "error",
                        f"{reads.verdict(exc)}; not relaunching while the pods of "
                        f"{self.handle['job_id']} may still run",
                    )
                    return
                await asyncio.sleep(delay if to_deadline is None else max(0.01, min(delay, to_deadline)))
                continue
            reads.worked()
            now = time.time()
            back_off = 0.0 if self.not_before is None else self.not_before - now
            if gone and back_off <= 0:
                await settled(self.started_at, self.settle_s)
                yield self._event("gone")
                return
            if gone and not gone_logged:
                self.log.info(
                    "every pod of %s is gone; relaunching in %.0fs (back-off)",
                    self.handle["job_id"],
                    back_off,
                )
                gone_logged = True
            if not gone and now - self.started_at > self.deadline_s:
                await settled(self.started_at, self.settle_s)
                yield self._event(
                    "error",
                    f"job {self.handle['job_id']} still has pods {self.deadline_s:.0f}s after its "
                    "deletion; not relaunching over it: check its pods (kubectl get pods -l "
                    f"trainops/job={self.handle['job_id']})",
                )
                return
            wait = self.poll_interval if not gone else min(self.poll_interval * 15, back_off)
            if to_deadline is not None:
                wait = min(wait, to_deadline)
            await asyncio.sleep(max(0.05, wait))
