"""What happens to a finished attempt's Kubernetes objects, and the log tail kept in job.json
before they go. Pure.

Once an attempt has ended and job.json records it (state, classification, the log tail), its
job object, Service and PodGroup are deleted (``ClusterBackend.delete``): finished pods hold
their node's IP addresses and their logs, a Job its quota, and nothing else ever removes them.
``keep_finished_jobs`` keeps them for inspection; the kinds that have one then get a
``ttlSecondsAfterFinished`` so they go later. The log tail is copied first: it goes with the
pods (the local backend keeps its job directory, logs included).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainops.cluster.spec import TTL_KINDS

KEPT_TTL_S = 86400  # a kept job: a day to look at it, then Kubernetes deletes it
LOGS_TAIL_CHARS = 20000  # of the tail, in job.json: enough for a traceback and torchrun's report


def ttl_options(keep_finished_jobs: bool, kind: str, job_options: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSpec fields that keep a finished job for a while: a TTL for a kept job of a kind
    that has one, unless ``job_options`` sets its own; {} otherwise."""
    if not keep_finished_jobs or kind not in TTL_KINDS or "ttl_seconds_after_finished" in job_options:
        return {}
    return {"ttl_seconds_after_finished": KEPT_TTL_S}


def deletes_finished(keep_finished_jobs: bool, action: str) -> bool:
    """Whether a finished attempt is deleted now: on ``finish`` and ``fail`` unless kept (a
    ``relaunch`` deletes it anyway, before the next attempt may start)."""
    return action in ("finish", "fail") and not keep_finished_jobs


def clip_tail(text: str | None, limit: int = LOGS_TAIL_CHARS) -> str | None:
    """The end of a log tail, at most ``limit`` characters, from a line start where it is cut."""
    if text is None or len(text) <= limit:
        return text
    clipped = text[-limit:]
    return clipped[clipped.find("\n") + 1 :] if "\n" in clipped else clipped
