"""JobTrigger: waits in the triggerer until a cluster job finishes, then reports its state.

It only waits and reports; the operator decides what the state means. It never deletes
anything, so a triggerer restart (which cancels and re-creates triggers) is harmless.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

FINAL_PHASES = ("succeeded", "failed", "lost")


class JobTrigger(BaseTrigger):
    """Poll a job's state through its cluster backend.

    :param handle: the backend's job handle (a plain dict).
    :param poll_interval: seconds between polls.
    :param timeout: seconds after which to report ``{"status": "timeout"}`` (None: never).
    :param cluster_options: backend options, e.g. ``{"state_dir": ...}`` for ``local``.
    """

    def __init__(self, *, handle: dict, poll_interval: float = 5.0, timeout: float | None = None,
                 cluster_options: dict | None = None, started_at: float | None = None):
        super().__init__()
        self.handle = handle
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.cluster_options = cluster_options or {}
        self.started_at = started_at if started_at is not None else time.time()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "handle": self.handle, "poll_interval": self.poll_interval, "timeout": self.timeout,
            "cluster_options": self.cluster_options, "started_at": self.started_at})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from trainops.cluster import get_cluster

        try:
            cluster = get_cluster(self.handle["cluster"], **self.cluster_options)
            while True:
                state = await asyncio.to_thread(cluster.status, self.handle)
                if state["phase"] in FINAL_PHASES:
                    yield TriggerEvent({"status": "finished", "handle": self.handle, "state": state})
                    return
                if self.timeout is not None and time.time() - self.started_at > self.timeout:
                    yield TriggerEvent({"status": "timeout", "handle": self.handle, "state": state,
                                        "message": f"job {self.handle['job_id']} still {state['phase']} after {self.timeout:.0f}s"})
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # reported, not raised: the operator decides and cleans up
            yield TriggerEvent({"status": "error", "handle": self.handle,
                                "message": f"{type(exc).__name__}: {exc}"})
