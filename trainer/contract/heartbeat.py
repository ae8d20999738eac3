"""The run contract, part 6: heartbeats, ``heartbeat/<n>.json``, attempt n's latest step, for hang
detection."""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time, so
# ``AttemptRecord.__required_keys__`` leaves the optional fields out.

from typing import TypedDict


# --- 6. heartbeats ----------------------------------------------------------------
class Heartbeat(TypedDict):
    """Attempt ``attempt``'s progress as rank 0 last wrote it: ``step`` finished at ``time``
    (epoch seconds), ``steps`` of them in this attempt (0: written before its first step, when
    the loop started), and the median step time of this attempt so far, its first step
    (compile, warm-up) left out (None until there is one)."""

    attempt: int
    step: int
    time: float
    steps: int
    median_step_s: float | None


def parse_heartbeat(data: object) -> Heartbeat | None:
    """``data`` (a heartbeat object's JSON) as a :class:`Heartbeat`; None when it is not one
    (a damaged or foreign object says nothing about progress, so it is no verdict either)."""
    if not isinstance(data, dict):
        return None
    try:
        median = data.get("median_step_s")
        return {
            "attempt": int(data["attempt"]),
            "step": int(data["step"]),
            "time": float(data["time"]),
            "steps": int(data["steps"]),
            "median_step_s": None if median is None else float(median),
        }
    except (KeyError, TypeError, ValueError):
        return None
