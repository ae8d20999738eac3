"""A hand-computable run for the cost accounting, its report pages and the fleet page.

Two attempts on 1 node x 8 GPUs of ``p4d.24xlarge`` spot; train.max_steps 120, a checkpoint
every 25 steps that blocks the loop 2 s, every step 1 s. Times are seconds after ``T0``
(2026-01-01T00:00:00Z):

attempt 1 (spot, preempted)          attempt 2 (spot, completed, resumed from step 50)
  0  launched (queued 30 s)            170  launched (queued 20 s)
 30  pod started (startup 60 s)        190  pod started (startup 40 s)
 90  first step begins                 230  first step (51) begins
115  step 25 ends, save blocks 2 s     255  step 75 ends, save blocks 2 s
142  step 50 ends, save blocks 2 s     282  step 100 ends, save blocks 2 s
152.5  SIGTERM (during step 59)        304  step 120 ends (final save, export: shutdown 10 s)
154  step 60 ends: the emergency       314  pod ended
     save fails, 51..60 are lost
160  pod ended (shutdown 6 s)
165  the operator sees it end

Attempt 1 bills 130 s (startup 60, productive 50, checkpoint_stall 4, replayed 10,
shutdown 6); attempt 2 bills 124 s (startup 40, productive 70, checkpoint_stall 4, shutdown 10).
Goodput 120/254; recovery 230 - 152.5 = 77.5 s. Prices: :data:`FIXTURE_PRICES` (the shipped
table's p4d.24xlarge figures). The amounts are exact expressions of those figures: compare
them with ``pytest.approx``.
"""

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainops.cost.accounting import RunCost
    from trainops.cost.prices import PriceTable
    from trainops.recovery.record import JobRecord

T0 = 1767225600.0  # 2026-01-01T00:00:00Z
RUN_URI = "file:///tmp/trainops/runs/nightly/scheduled__2026-01-01/train"
P4D_SPOT, P4D_ON_DEMAND = 11.4704, 32.7726  # USD per instance-hour (8 GPUs)
AWS = "https://aws.amazon.com/ec2/pricing/on-demand/ (us-east-1, Linux)"
P4D_SOURCE = (
    "typical spot price as of 2024-12-01, about 35% of the list price (spot prices move by zone "
    f"and hour): {AWS}"
)
FIXTURE_PRICES: "PriceTable" = {
    "p4d.24xlarge": {
        "spot": {"per_hour": P4D_SPOT, "gpus": 8, "source": P4D_SOURCE, "date": "2024-12-01"},
        "on-demand": {
            "per_hour": P4D_ON_DEMAND,
            "gpus": 8,
            "source": f"list price as of 2024-12-01: {AWS}",
            "date": "2024-12-01",
        },
    }
}
GPUS = 8


def iso(offset: float) -> str:
    """``T0 + offset`` as the operator and the trainer write times (ISO 8601, seconds)."""
    return datetime.fromtimestamp(T0 + offset, UTC).isoformat(timespec="seconds")


def step_records(
    attempt: int, first: int, last: int, begins: float, saves: dict[int, float]
) -> list[dict[str, Any]]:
    """Metrics records of steps ``first..last``, 1 s each, the loop blocked ``saves[step]`` s
    after the steps in ``saves``; the first step begins at ``T0 + begins``."""
    out, t = [], T0 + begins
    for step in range(first, last + 1):
        t += 1.0
        record: dict[str, Any] = {
            "step": step,
            "attempt": attempt,
            "loss": 5.0 - step / 100,
            "lr": 3e-4,
            "tokens_per_s": 1000.0,
            "time": t,
        }
        if step in saves:
            record["checkpoint_blocked_s"] = saves[step]
            record["checkpoint_waited_s"] = 0.0
            t += saves[step]
        out.append(record)
    return out


def _node(instance_type: str = "p4d.24xlarge") -> dict[str, Any]:
    return {"index": 0, "node_name": "ip-10-0-0-1", "instance_type": instance_type, "capacity_type": "spot"}


def attempt_entry(n: int, launched: float, ended_seen: float, **fields: Any) -> dict[str, Any]:
    return {
        "attempt": n,
        "job": {"cluster": "kubernetes", "job_id": f"train-0a1b2c3d-a{n}", "labels": {}},
        "status": "ended",
        "job_name": f"train-0a1b2c3d-a{n}",
        "try_number": 1,
        "capacity": "spot",
        "nodes": 1,
        "gpus_per_node": GPUS,
        "args": ["python", "-m", "trainer", "train", "--config", f"{RUN_URI}/config.yaml"],
        "spec": {},
        "manifests": [],
        "launched_at": iso(launched),
        "ended_at": iso(ended_seen),
        "node_types": [_node()],
        **fields,
    }


def one_preemption_job() -> tuple["JobRecord", list[dict[str, Any]]]:
    """The run's ``job.json`` and its metrics records (see the module docstring)."""
    first = attempt_entry(
        1,
        0,
        165,
        state={
            "phase": "failed",
            "reason": "SpotInterruption",
            "nodes": [{**_node(), "pod": "train-0a1b2c3d-a1-0", "exit_code": 143}],
            "disruptions": [{"node": 0, "reason": "SpotInterruption", "message": "spot interruption notice"}],
            "start_time": T0 + 30,
            "end_time": T0 + 160,
        },
        record={
            "format": "trainops.attempt/v1",
            "attempt": 1,
            "outcome": "preempted",
            "last_step": 60,
            "checkpoint_step": 50,
            "steps_lost": 10,
            "resumed_from_step": None,
            "world_size": GPUS,
            "signal": "SIGTERM",
            "hint": None,
            "error": None,
            "started_at": iso(35),
            "ended_at": iso(160),
            "first_step_time": T0 + 90,
            "signal_time": T0 + 152.5,
        },
        steps_lost=10,
        decision={
            "action": "relaunch",
            "capacity": "spot",
            "reason": "preempted 1 time, within the budget of 2",
        },
        classification="preempted",
        reason="SpotInterruption",
    )
    second = attempt_entry(
        2,
        170,
        320,
        state={
            "phase": "succeeded",
            "reason": None,
            "nodes": [{**_node(), "pod": "train-0a1b2c3d-a2-0", "exit_code": 0}],
            "disruptions": [],
            "start_time": T0 + 190,
            "end_time": T0 + 314,
        },
        record={
            "format": "trainops.attempt/v1",
            "attempt": 2,
            "outcome": "completed",
            "last_step": 120,
            "checkpoint_step": 120,
            "steps_lost": 0,
            "resumed_from_step": 50,
            "world_size": GPUS,
            "signal": None,
            "hint": None,
            "error": None,
            "started_at": iso(195),
            "ended_at": iso(314),
            "first_step_time": T0 + 230,
        },
        steps_lost=0,
        decision={"action": "finish", "capacity": "spot", "reason": "completed"},
        classification="completed",
        reason=None,
    )
    job = {
        "run_uri": RUN_URI,
        "config_uri": f"{RUN_URI}/config.yaml",
        "cluster": "kubernetes",
        "capacity": "spot",
        "preemptions": 1,
        "infra_failures": 0,
        "status": "succeeded",
        "attempts": [first, second],
        "budget": {"from_attempt": 1, "preemptions": 1, "infra_failures": 0},
    }
    metrics = step_records(1, 1, 60, 90, {25: 2.0, 50: 2.0}) + step_records(
        2, 51, 120, 230, {75: 2.0, 100: 2.0}
    )
    return job, metrics  # type: ignore[return-value]


def _span(phase: str, start: float, end: float) -> dict[str, Any]:
    return {"phase": phase, "start": T0 + start, "end": T0 + end}


def one_preemption_cost() -> "RunCost":
    """What ``account(*one_preemption_job(), FIXTURE_PRICES)`` must give."""
    spot, on_demand = P4D_SPOT / GPUS, P4D_ON_DEMAND / GPUS  # USD per GPU-hour
    priced = {"per_gpu_hour": spot, "source": P4D_SOURCE, "known": True}

    def attempt(
        n: int, outcome: str, start: float, end: float, seconds: dict[str, float], spans: list
    ) -> dict:
        billed = (end - start) * GPUS
        return {
            "attempt": n,
            "capacity": "spot",
            "instance_type": "p4d.24xlarge",
            "accelerators": GPUS,
            "outcome": outcome,
            "preempted": outcome == "preempted",
            "start": T0 + start,
            "end": T0 + end,
            "seconds": seconds,
            "spans": spans,
            "billed_gpu_s": billed,
            "cost": billed / 3600 * spot,
            "on_demand_cost": billed / 3600 * on_demand,
            "price": priced,
        }

    first = attempt(
        1,
        "preempted",
        30,
        160,
        {
            "queued": 30,
            "startup": 60,
            "productive": 50,
            "replayed": 10,
            "restart": 0,
            "rollback": 0,
            "checkpoint_stall": 4,
            "shutdown": 6,
        },
        [
            _span("queued", 0, 30),
            _span("startup", 30, 90),
            _span("productive", 90, 115),
            _span("checkpoint_stall", 115, 117),
            _span("productive", 117, 142),
            _span("checkpoint_stall", 142, 144),
            _span("replayed", 144, 154),
            _span("shutdown", 154, 160),
        ],
    )
    second = attempt(
        2,
        "completed",
        190,
        314,
        {
            "queued": 20,
            "startup": 40,
            "productive": 70,
            "replayed": 0,
            "restart": 0,
            "rollback": 0,
            "checkpoint_stall": 4,
            "shutdown": 10,
        },
        [
            _span("queued", 170, 190),
            _span("startup", 190, 230),
            _span("productive", 230, 255),
            _span("checkpoint_stall", 255, 257),
            _span("productive", 257, 282),
            _span("checkpoint_stall", 282, 284),
            _span("productive", 284, 304),
            _span("shutdown", 304, 314),
        ],
    )
    billed_s = 130 + 124
    cost = billed_s * GPUS / 3600 * spot
    on_demand_cost = billed_s * GPUS / 3600 * on_demand
    return {  # type: ignore[return-value]
        "format": "trainops.cost/v1",
        "estimate": True,
        "currency": "USD",
        "attempts": [first, second],
        "seconds": {
            "queued": 50,
            "startup": 100,
            "productive": 120,
            "replayed": 10,
            "restart": 0,
            "rollback": 0,
            "checkpoint_stall": 8,
            "shutdown": 16,
        },
        "billed_gpu_hours": billed_s * GPUS / 3600,
        "productive_gpu_hours": 120 * GPUS / 3600,
        # replayed 10 s, plus the preempted attempt's startup 60 s and shutdown 6 s
        "lost_gpu_hours": (10 + 60 + 6) * GPUS / 3600,
        "goodput": 120 / billed_s,
        "recovery_s": [77.5],
        "preemptions": 1,
        "cost": cost,
        "on_demand_cost": on_demand_cost,
        "savings": on_demand_cost - cost,
        "notes": [],
        "warnings": [],
    }


def _succeeded_state(end: float) -> dict[str, Any]:
    """The cluster's view of one node that started at 10 s and succeeded at ``end``."""
    return {
        "phase": "succeeded",
        "reason": None,
        "nodes": [{**_node(), "pod": "train-0a1b2c3d-a1-0", "exit_code": 0}],
        "disruptions": [],
        "start_time": T0 + 10,
        "gang_start_time": T0 + 12,
        "end_time": T0 + end,
    }


def _succeeded_job(entry: dict[str, Any]) -> dict[str, Any]:
    """The ``job.json`` of a run whose one attempt, ``entry``, succeeded."""
    return {
        "run_uri": RUN_URI,
        "config_uri": f"{RUN_URI}/config.yaml",
        "cluster": "kubernetes",
        "capacity": "spot",
        "preemptions": 0,
        "infra_failures": 0,
        "status": "succeeded",
        "attempts": [entry],
        "budget": {"from_attempt": 1, "preemptions": 0, "infra_failures": 0},
    }


def one_restart_job() -> tuple["JobRecord", list[dict[str, Any]]]:
    """One attempt (1 node x 8 GPUs, completed) that torchrun restarted in place once, and its
    metrics records (seconds after ``T0``; every step 1 s, a checkpoint every 20 steps that
    blocks the loop 2 s, the metrics written every step but the last two before the crash):

    incarnation 0                          incarnation 1 (resumed from step 20)
      0  launched (queued 10 s)             72  started, its restore takes 4 s
     10  pod started (startup 30 s)         80  first step (21) begins
     40  first step begins                 100  step 40 ends, save blocks 2 s
     60  step 20 ends, save blocks 2 s     112  step 50 ends (final save, export: 6 s)
     65  step 23 ends (the last recorded)  118  pod ended
     67  step 25 ends, a rank dies: 21..25 are lost
     70  it ends (network)

    It bills 108 s: startup 30, productive 50, checkpoint_stall 4, replayed 5 (21..23 as logged,
    24..25 at the median step time), restart 13 (67 -> 80), shutdown 6. Its restart's recovery is
    80 - 70 = 10 s.
    """
    restart = {
        "restart": 0,
        "outcome": "failed",
        "cause": "network",
        "error": "DistBackendError: NCCL timeout",
        "last_step": 25,
        "checkpoint_step": 20,
        "steps_lost": 5,
        "started_at": iso(15),
        "ended_at": iso(70),
        "first_step_time": T0 + 40,
        "restore_s": None,
    }
    entry = attempt_entry(
        1,
        0,
        120,
        state=_succeeded_state(118),
        record={
            "format": "trainops.attempt/v1",
            "attempt": 1,
            "outcome": "completed",
            "last_step": 50,
            "checkpoint_step": 50,
            "steps_lost": 0,
            "resumed_from_step": 20,
            "world_size": GPUS,
            "signal": None,
            "hint": None,
            "error": None,
            "started_at": iso(72),
            "ended_at": iso(118),
            "first_step_time": T0 + 80,
            "restore_s": 4.0,
            "restarts": [restart],
            "restore_files": {"local": 8, "storage": 0},
        },
        steps_lost=5,  # the entry counts its restart's lost steps (trainops.recovery.record)
        decision={"action": "finish", "capacity": "spot", "reason": "completed"},
        classification="succeeded",
        reason="the trainer completed every step; restarted in place 1× (network: DistBackendError: NCCL timeout)",
    )
    job = _succeeded_job(entry)
    metrics = step_records(1, 1, 23, 40, {20: 2.0}) + step_records(1, 21, 50, 80, {40: 2.0})
    return job, metrics  # type: ignore[return-value]


def one_rollback_job() -> tuple["JobRecord", list[dict[str, Any]]]:
    """One attempt (1 node x 8 GPUs, completed) that rolled back once for a NaN loss, and its
    metrics records (seconds after ``T0``; every step 1 s, a checkpoint every 10 steps that
    blocks the loop 2 s):

      0  launched (queued 10 s)          57  step 15 ends: the read finds 14's loss NaN
     10  pod started (startup 30 s)      57  rollback: the step-10 checkpoint loads in 3 s
     40  first step begins               61  step 16 ends (it began at 60)
     50  step 10 ends, save blocks 2 s   65  step 20 ends, save blocks 2 s
     53  step 11 ends ... 55 step 13     77  step 30 ends, save blocks 2 s
         (14 and 15 have no record)      89  step 40 ends (final save, export: 6 s)
                                         95  pod ended

    It bills 85 s: startup 30, productive 35 (steps 1-10 and 16-40), checkpoint_stall 6,
    rollback 8 (11-13 as logged, 55 -> 60 before step 16: steps 14-15 and the 3 s load),
    shutdown 6. By cause, the rollback is 3 s of restore and 5 s of lost progress.
    """
    entry = attempt_entry(
        1,
        0,
        96,
        state=_succeeded_state(95),
        record={
            "format": "trainops.attempt/v1",
            "attempt": 1,
            "outcome": "completed",
            "last_step": 40,
            "checkpoint_step": 40,
            "steps_lost": 0,
            "resumed_from_step": None,
            "world_size": GPUS,
            "signal": None,
            "hint": None,
            "error": None,
            "started_at": iso(15),
            "ended_at": iso(95),
            "first_step_time": T0 + 40,
            "rollbacks": [
                {
                    "at_step": 14,
                    "loss": "nan",
                    "why": "non-finite loss nan",
                    "to_step": 10,
                    "skipped_from": 11,
                    "skipped_to": 15,
                    "restore_s": 3.0,
                    "restore_files": {"local": 8, "storage": 0},
                }
            ],
        },
        steps_lost=0,
        decision={"action": "finish", "capacity": "spot", "reason": "completed"},
        classification="succeeded",
        reason="the trainer completed every step",
    )
    job = _succeeded_job(entry)
    metrics = step_records(1, 1, 13, 40, {10: 2.0}) + step_records(1, 16, 40, 60, {20: 2.0, 30: 2.0})
    return job, metrics  # type: ignore[return-value]
