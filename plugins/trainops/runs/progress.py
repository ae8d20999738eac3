"""Where a running run stands, from its metrics: the highest logged step, the rate of the newest
attempt, and an ETA. Pure; the home page, the run report and ``python -m trainops status``
all use it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from trainer.contract import MetricsRecord

RATE_WINDOW = 50  # the last logged steps of the current attempt that the rate is measured over


class Progress(TypedDict):
    """A running run's place: its last logged step, ``train.max_steps`` (None: unknown), the
    steps per second of the current attempt, the seconds left at that rate, and how long ago
    the last step was logged (all None when they cannot be told)."""

    step: int
    max_steps: int | None
    steps_per_s: float | None
    eta_s: float | None
    age_s: float | None


def _number(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]


def progress(records: Sequence[MetricsRecord], max_steps: int | None, now: float) -> Progress | None:
    """Where a running run stands by its metrics: the highest logged step, and the rate of the
    newest attempt over its last :data:`RATE_WINDOW` logged steps (by their ``time``); the ETA
    counts from the last step's time. None when no step has been logged."""
    steps = [r for r in records if isinstance(r.get("step"), int)]
    if not steps:
        return None
    attempts = [r["attempt"] for r in steps if isinstance(r.get("attempt"), int)]
    current = [r for r in steps if r.get("attempt") == max(attempts)] if attempts else steps
    timed = sorted((r for r in current if _number(r.get("time")) is not None), key=lambda r: r["step"])
    timed = timed[-RATE_WINDOW:]
    step = max(r["step"] for r in steps)
    rate = None
    if len(timed) >= 2:
        span, done = float(timed[-1]["time"]) - float(timed[0]["time"]), timed[-1]["step"] - timed[0]["step"]
        rate = done / span if span > 0 and done > 0 else None
    age = max(0.0, now - float(timed[-1]["time"])) if timed else None
    eta = None
    if rate is not None and max_steps is not None:
        eta = max(0.0, (max_steps - step) / rate - (age or 0.0))
    return {"step": step, "max_steps": max_steps, "steps_per_s": rate, "eta_s": eta, "age_s": age}
