"""Runs written to a storage root as the operators write them: job.json (with the attempts'
log tails), config.yaml, metrics parts, the gate's decision, the promotion record and the
production pointer. One function per outcome a user meets."""

from __future__ import annotations

import json

from trainer.contract import RunLayout, join, metrics_part_name, run_prefix
from trainer.storage import open_storage

GATE_REJECTED = {
    "approved": False,
    "model_name": "demo-lm",
    "production_version": 1,
    "checks": [
        {
            "name": "eval loss under max_eval_loss",
            "metric": "eval_loss",
            "observed": 3.2,
            "expected": "<= 2.5",
            "passed": False,
        },
        {
            "name": "no regression vs production",
            "metric": "eval_loss",
            "observed": 3.2,
            "expected": "<= 2.04",
            "passed": False,
        },
        {"name": "perplexity", "metric": "perplexity", "observed": 20.0, "expected": "<= 50", "passed": True},
    ],
}
GATE_APPROVED = {
    **GATE_REJECTED,
    "approved": True,
    "checks": [{**c, "passed": True} for c in GATE_REJECTED["checks"]],
}


def attempt(n: int, classification: str | None, tail: str, **kw) -> dict:
    return {
        "attempt": n,
        "classification": classification,
        "job_name": f"train-0123abcd-a{n}",
        "launched_at": f"2026-12-01T10:0{n}:00+00:00",
        "ended_at": f"2026-12-01T10:0{n}:30+00:00" if classification else None,
        "logs_tail": tail,
        **kw,
    }


def write_run(
    root: str,
    dag: str,
    run_id: str,
    *,
    status: str,
    attempts: list[dict],
    gate: dict | None = None,
    promotion: dict | None = None,
    steps: int = 0,
    max_steps: int = 100,
    cost: float | None = 0.25,
) -> str:
    store = open_storage(root)
    run = run_prefix(root, dag, run_id, "train")
    layout = RunLayout(run)
    job = {
        "airflow": {"dag_id": dag, "run_id": run_id, "task_id": "train", "map_index": -1},
        "attempts": attempts,
        "run_uri": run,
        "status": status,
        "config_uri": layout.config,
    }
    if cost is not None and status != "running":
        job["cost"] = {"format": "trainops.cost/v1", "cost": cost}
    store.put(layout.job, json.dumps(job).encode())
    store.put(layout.config, f"train:\n  max_steps: {max_steps}\n".encode())
    if steps:
        lines = "".join(
            json.dumps({"step": s, "attempt": 1, "loss": 2.0, "time": 1000.0 + s}) + "\n"
            for s in range(1, steps + 1)
        )
        store.put(join(run, "metrics", metrics_part_name(1, 1)), lines.encode())
    if gate is not None:
        store.put(layout.eval_gate, json.dumps({**gate, "run_uri": run}).encode())
    if promotion is not None:
        store.put(layout.promotion, json.dumps(promotion).encode())
    return run


def promote(root: str, model: str, version: int, run_uri: str, history: list[dict] | None = None) -> None:
    entry = {
        "action": "promote",
        "version": version,
        "run_uri": run_uri,
        "at": "2026-12-01T11:00:00+00:00",
        "by": "alice",
    }
    pointer = {
        "format": "trainops.production/v1",
        "model": model,
        "version": version,
        "uri": join(root, "models", model, "versions", str(version)),
        "promoted_at": entry["at"],
        "run_uri": run_uri,
        "history": [*(history or []), entry],
    }
    open_storage(root).put(join(root, "models", model, "production.json"), json.dumps(pointer).encode())


def every_outcome(root: str) -> dict[str, str]:
    """One run of each outcome under ``root``; name -> run URI (written oldest first)."""
    runs = {}
    runs["promoted"] = write_run(
        root,
        "retrain",
        "manual__2026-12-01T10:00:00+00:00",
        status="succeeded",
        attempts=[attempt(1, "succeeded", "completed: 100 steps")],
        gate=GATE_APPROVED,
    )
    promote(root, "demo-lm", 2, runs["promoted"])
    runs["rejected"] = write_run(
        root,
        "retrain",
        "manual__2026-12-02T10:00:00+00:00",
        status="succeeded",
        attempts=[attempt(1, "succeeded", "completed")],
        gate=GATE_REJECTED,
    )
    runs["identical"] = write_run(
        root,
        "retrain",
        "manual__2026-12-03T10:00:00+00:00",
        status="succeeded",
        attempts=[attempt(1, "succeeded", "completed")],
        gate=GATE_APPROVED,
        promotion={"outcome": "identical", "model_name": "demo-lm", "version": 2},
    )
    runs["failed"] = write_run(
        root,
        "retrain",
        "manual__2026-12-04T10:00:00+00:00",
        status="failed",
        attempts=[
            attempt(
                1,
                "failed",
                "Traceback...\nValueError: bad batch",
                decision={"action": "fail", "reason": "program error: ValueError: bad batch"},
            )
        ],
    )
    runs["running"] = write_run(
        root,
        "nightly",
        "scheduled__2026-12-05T00:00:00+00:00",
        status="running",
        attempts=[attempt(1, None, "")],
        steps=40,
    )
    return runs
