"""Reading the trainer's metrics.jsonl (pure): one JSON record per step, each with its attempt."""

from __future__ import annotations

import json


def records(text: str) -> list[dict]:
    """The well-formed records of a metrics.jsonl body; a torn last line is skipped."""
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
    return out


def latest_of_attempt(text: str, attempt: int) -> dict | None:
    """The record of the highest step ``attempt`` reached, or None."""
    mine = [r for r in records(text) if r.get("attempt") == attempt]
    return max(mine, key=lambda r: r["step"]) if mine else None


def max_step_of_attempt(text: str, attempt: int) -> int:
    """Highest step recorded by ``attempt`` (0 if none)."""
    latest = latest_of_attempt(text, attempt)
    return latest["step"] if latest else 0


def final_by_step(text: str) -> dict[int, dict]:
    """One record per step; a later attempt's record replaces a replayed step's."""
    by_step: dict[int, dict] = {}
    for rec in records(text):
        by_step[rec["step"]] = rec
    return by_step
