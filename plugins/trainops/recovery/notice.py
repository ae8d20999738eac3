"""The notice budget: does the emergency checkpoint fit the grace period? Pure.

A preempted trainer saves a synchronous emergency checkpoint between SIGTERM and SIGKILL;
torchrun kills the workers a little before the pod's grace period ends
(``trainops.cluster.spec.shutdown_timeout``). The trainer records how long each emergency
save took (``emergency_save_s`` in its attempt record); this module compares the newest such
figure with what the grace period leaves, so a save that no longer fits is said before a
preemption loses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from trainops.cluster.spec import shutdown_timeout

MARGIN = 0.25  # the next save may be slower: storage, a bigger optimizer state
MIN_MARGIN_S = 10.0


def last_emergency_save(attempts: Iterable[Mapping[str, Any]]) -> tuple[int, float] | None:
    """``(attempt, seconds)`` of the newest attempt whose record measured an emergency save,
    from job.json's attempt entries; None when no attempt made one."""
    found = None
    for entry in attempts:
        record = entry.get("record") or {}
        seconds = record.get("emergency_save_s")
        if isinstance(seconds, int | float) and not isinstance(seconds, bool):
            found = (int(entry.get("attempt") or 0), float(seconds))
    return found


def needed_seconds(save_s: float) -> int:
    """The SIGTERM-to-SIGKILL time a save of ``save_s`` seconds needs, with the margin."""
    return int(-(-(save_s + max(MIN_MARGIN_S, save_s * MARGIN)) // 1))


def grace_for(needed_s: int) -> int:
    """The smallest grace period whose torchrun shutdown timeout is at least ``needed_s``."""
    grace = needed_s
    while shutdown_timeout(grace) < needed_s:
        grace += 1
    return grace


def grace_warning(grace_s: int, attempts: Iterable[Mapping[str, Any]]) -> str | None:
    """A warning with the numbers when the grace period ``grace_s`` leaves the emergency save
    less than its last measured duration plus the margin; None when it fits or none was
    measured."""
    last = last_emergency_save(attempts)
    if last is None:
        return None
    attempt, save_s = last
    usable, needed = shutdown_timeout(grace_s), needed_seconds(save_s)
    if usable >= needed:
        return None
    return (
        f"the emergency checkpoint of attempt {attempt} took {save_s:.1f} s, but "
        f"termination_grace_seconds={grace_s} leaves it {usable} s (torchrun kills the workers "
        f"{grace_s - usable} s before the pod's grace ends): with a margin it needs {needed} s, so "
        f"the next preemption may lose every step since the last regular checkpoint. Set "
        f"termination_grace_seconds to at least {grace_for(needed)}, and check that the cluster "
        "gives that much notice (GKE Spot gives pods 15 s by default; AWS and Azure only with a "
        "drain on the interruption notice: docs/kubernetes.md, 'Spot notice windows'), or "
        "checkpoint more often (checkpoint.every_steps) so that a lost save costs less"
    )
