"""The run contract, part 6: heartbeats, ``heartbeat/<n>.json``, attempt n's latest step, for hang
detection."""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time, so
# ``AttemptRecord.__required_keys__`` leaves the optional fields out.

from typing import Final, TypedDict

# The attempt's first steps compile, fill caches and grow the allocator: their times say nothing
# about the run's pace. The writer leaves them out of ``p99_step_s`` and ``max_gap_s``, and the
# hang watch gives them the startup allowance.
HEARTBEAT_WARMUP_STEPS: Final = 3


# --- 6. heartbeats ----------------------------------------------------------------
class Heartbeat(TypedDict):
    """Attempt ``attempt``'s progress as rank 0 last wrote it.

    ``step`` finished at ``time`` (epoch seconds), ``steps`` of them in this attempt (0:
    written before its first step, when the loop started). ``median_step_s`` is the median
    step time of this attempt so far, its first step (compile, warm-up) left out (None until
    there is one).

    The pace the hang watch derives its timeout from, over the steps after the attempt's first
    :data:`HEARTBEAT_WARMUP_STEPS` (None until there is one, and in a heartbeat written before
    these fields existed): ``p99_step_s``, the 99th percentile of the kept step times, and
    ``max_gap_s``, the longest wall time between two consecutive steps, which also holds what
    the loop does between steps (loss reads, metrics flushes), but not the operations marked
    ``busy``. ``every_s`` is the writer's least interval between writes (a heartbeat is up to
    that old when read).

    ``busy`` names a long operation the training thread is in, that legitimately stops
    stepping (a checkpoint save, the export), since ``busy_since`` (epoch seconds); both None
    while it steps. ``busy_ended`` is when the latest such operation ended (None: none yet):
    the loop was alive then, even if its last step is older.
    """

    attempt: int
    step: int
    time: float
    steps: int
    median_step_s: float | None
    p99_step_s: float | None
    max_gap_s: float | None
    every_s: float | None
    busy: str | None
    busy_since: float | None
    busy_ended: float | None


def _seconds(data: dict[str, object], key: str) -> float | None:
    """``data[key]`` as seconds; None when absent or null (an older writer's heartbeat)."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{key} is {value!r}, not a number")
    return float(value)


def parse_heartbeat(data: object) -> Heartbeat | None:
    """``data`` (a heartbeat object's JSON) as a :class:`Heartbeat`; None when it is not one
    (a damaged or foreign object says nothing about progress, so it is no verdict either).
    The optional fields of an older writer's heartbeat read as None."""
    if not isinstance(data, dict):
        return None
    try:
        busy = data.get("busy")
        return {
            "attempt": int(data["attempt"]),
            "step": int(data["step"]),
            "time": float(data["time"]),
            "steps": int(data["steps"]),
            "median_step_s": _seconds(data, "median_step_s"),
            "p99_step_s": _seconds(data, "p99_step_s"),
            "max_gap_s": _seconds(data, "max_gap_s"),
            "every_s": _seconds(data, "every_s"),
            "busy": None if busy is None else str(busy),
            "busy_since": _seconds(data, "busy_since"),
            "busy_ended": _seconds(data, "busy_ended"),
        }
    except (KeyError, TypeError, ValueError):
        return None
