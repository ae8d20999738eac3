"""A cluster backend for operator tests: it launches nothing and reports the states it is told.

It implements :class:`trainops.cluster.base.ClusterBackend` (the type checker holds it to the
real backends' shape, see ``_check`` below). Its job states are shaped like the local
backend's status.json; ``states`` maps an attempt number to the state ``status`` reports once
that attempt's job is polled (running until then).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import trainops.cluster
from trainops.cluster.base import Chaos, ClusterBackend, JobHandle, JobState, LogCursor

if TYPE_CHECKING:
    import pytest

    from trainops.cluster.spec import JobSpec

LOG_TAIL = "[node-0] RuntimeError: CUDA out of memory"


class FakeCluster:
    """Records what the operator launches and deletes; ``live`` is what ``find`` returns."""

    name = "local"

    def __init__(self) -> None:
        self.launched: list[tuple[JobSpec, Chaos | None]] = []
        self.deleted: list[str] = []
        self.live: list[JobHandle] = []
        self.log_tail = LOG_TAIL  # what logs_tail returns
        self.states: dict[int, JobState] = {}  # attempt number -> final state reported by status()

    def launch(self, spec: JobSpec, *, chaos: Chaos | None = None) -> JobHandle:
        self.launched.append((spec, chaos))
        return {"cluster": "local", "job_id": f"{spec.name}-x", "job_dir": "/nowhere", "labels": spec.labels}

    def status(self, handle: JobHandle) -> JobState:
        attempt = int(handle["labels"].get("trainops/attempt", 1))
        return self.states.get(attempt, {"phase": "running", "reason": None, "nodes": [], "disruptions": []})

    def find(self, labels: Mapping[str, str]) -> list[JobHandle]:
        return self.live

    def delete(self, handle: JobHandle) -> None:
        self.deleted.append(handle["job_id"])

    def all_gone(self, handle: JobHandle) -> bool:
        return handle["job_id"] in self.deleted  # gone once deleted, as pods are

    def logs_tail(self, handle: JobHandle, lines: int = 30) -> str:
        return self.log_tail

    def log_lines(
        self, handle: JobHandle, cursor: LogCursor | None, max_lines: int = 200
    ) -> tuple[list[str], LogCursor | None]:
        return [], cursor


_check: type[ClusterBackend] = FakeCluster


def use_fake_cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    """Make every ``get_cluster`` call (operators' and triggers') return one FakeCluster."""
    fake = FakeCluster()
    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **options: fake)
    return fake
