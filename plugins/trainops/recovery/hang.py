"""Is a running attempt hung? A pure function of its heartbeat, its start and the clock.

Rank 0 writes a heartbeat (``trainer.runtime.heartbeat``) as it steps; a rank that hangs (a stuck
collective, a stopped process, a dead NIC) stops every rank at the next collective, so the
heartbeat's step stops moving. No new step for the hang timeout means hung. The timeout is
``hang_timeout`` when set, else derived from the attempt's own pace: ``max(10 min, 20 x the
median step time)``. Before the attempt's first step (rendezvous, data, checkpoint load,
compile and warm-up) the watch allows the startup allowance on top.

The idle time is counted from the heartbeat's step, but never from before the watch could see:
after an outage of the heartbeat's storage (which the trainer's writes met too), or a triggerer
restart, the clock starts again when reads work, so a stale heartbeat is never a hang.
"""

# No ``from __future__ import annotations``: TypedDict reads its annotations at run time.
from typing import Final

from trainer.contract import Heartbeat

HANG_FLOOR_S: Final = 600.0  # a derived timeout is never shorter than 10 minutes
HANG_STEP_FACTOR: Final = 20.0  # ... nor than 20 median steps
STARTUP_ALLOWANCE_S: Final = 1800.0  # extra time before the first step (compile, warm-up)


def hang_timeout_s(setting: float | None, median_step_s: float | None) -> float:
    """The hang timeout: ``setting`` when given, else ``max(HANG_FLOOR_S, HANG_STEP_FACTOR x
    median_step_s)`` (the floor alone while no step time is known)."""
    if setting is not None:
        return float(setting)
    return max(HANG_FLOOR_S, HANG_STEP_FACTOR * (median_step_s or 0.0))


def _describe(setting: float | None, heartbeat: Heartbeat | None, limit: float) -> str:
    if setting is not None:
        return f"hang_timeout {setting:.0f}s"
    median = heartbeat["median_step_s"] if heartbeat else None
    pace = f"20 x median step time {median:.2f}s" if median else "no step time yet"
    return f"hang_timeout {limit:.0f}s, derived: max(600s, {pace})"


def hang_verdict(
    *,
    heartbeat: Heartbeat | None,
    watched_since: float | None,
    now: float,
    setting: float | None,
    startup_allowance_s: float = STARTUP_ALLOWANCE_S,
) -> str | None:
    """Why the attempt is hung, in a sentence for the task log and job.json; None while it is not.

    :param heartbeat: the attempt's latest heartbeat (None: none written yet).
    :param watched_since: since when the watcher has seen the attempt running and its heartbeat
        readable without a break (None: not yet, so no hang can be told: a pending attempt is
        the scheduler's, not a hang).
    :param now: the watcher's clock, epoch seconds like the heartbeat's ``time``.
    :param setting: the operator's ``hang_timeout`` (None: derived).
    :param startup_allowance_s: extra time before the first step.
    """
    if watched_since is None:
        return None
    if heartbeat is None:
        limit = hang_timeout_s(setting, None) + startup_allowance_s
        idle = now - watched_since
        if idle <= limit:
            return None
        return (
            f"no step and no heartbeat {idle:.0f}s after the attempt started running "
            f"(limit {limit:.0f}s: {_describe(setting, None, limit - startup_allowance_s)} "
            f"+ {startup_allowance_s:.0f}s startup allowance)"
        )
    limit = hang_timeout_s(setting, heartbeat["median_step_s"])
    first = heartbeat["steps"] == 0
    if first:
        limit += startup_allowance_s
    idle = now - max(heartbeat["time"], watched_since)
    if idle <= limit:
        return None
    what = f"its first step (after step {heartbeat['step']})" if first else f"step {heartbeat['step'] + 1}"
    allowance = f" + {startup_allowance_s:.0f}s startup allowance" if first else ""
    base = limit - startup_allowance_s if first else limit
    return (
        f"no new step for {idle:.0f}s: {what} never finished "
        f"(limit {limit:.0f}s: {_describe(setting, heartbeat, base)}{allowance})"
    )
