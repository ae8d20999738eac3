"""An attempt's bad-loss rollbacks as the cost accounting reads them: pure, over its attempt record.

When a step's loss or gradient norm is bad, the trainer restores the newest committed checkpoint
and skips the steps trained since (``trainer.runtime.bad_loss``): their work is thrown away, not
replayed, and the step counter goes on from where it was. The attempt record lists each rollback
in ``rollbacks``, with the window it skipped (``skipped_from`` to ``skipped_to``) and how long
its checkpoint load took (``restore_s``; absent in a record from before it). The rollbacks are
those of the attempt's newest incarnation (a restart in place starts a fresh list).

An entry that is not well-formed is left out: a damaged record says nothing of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RolledBack:
    """One rollback: steps ``skipped_from`` to ``skipped_to`` (both included) were trained and
    thrown away; the checkpoint load took ``restore_s`` seconds (0: unknown)."""

    skipped_from: int
    skipped_to: int
    restore_s: float


def _step(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _seconds(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return max(0.0, float(value))
    return 0.0


def rolled_back(record: object) -> list[RolledBack]:
    """The attempt's rollbacks, oldest first; [] without any."""
    entries = record.get("rollbacks") if isinstance(record, Mapping) else None
    out = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping):
            continue
        first, last = _step(entry.get("skipped_from")), _step(entry.get("skipped_to"))
        if first is not None and last is not None and first <= last:
            out.append(RolledBack(first, last, _seconds(entry.get("restore_s"))))
    return out


def thrown_away(rollbacks: Sequence[RolledBack], step: int) -> bool:
    """Whether ``step``'s work was thrown away by a rollback (it lies in a skipped window)."""
    return any(r.skipped_from <= step <= r.skipped_to for r in rollbacks)


def rolled_back_before(rollbacks: Sequence[RolledBack], logged: int, step: int) -> bool:
    """Whether a rollback came between the logged step ``logged`` and the next logged one,
    ``step``: its window ended at or after the one and before the other."""
    return any(logged <= r.skipped_to < step for r in rollbacks)


def restore_seconds(record: object) -> float:
    """The seconds the attempt's rollbacks spent loading their checkpoints, together."""
    return sum(r.restore_s for r in rolled_back(record))
