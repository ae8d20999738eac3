"""The cost accounting of a real run, checked against figures computed here independently.

FSDPTrainingOperator on the local cluster (two nodes of one CPU rank each under torchrun, the
tiny model, file:// storage) with one injected spot preemption, driven as Airflow drives it.
The goodput and recovery time that trainops reports (job.json ``"cost"``, the XCom result)
must agree within 5% with figures this test computes from the raw material alone, by its own
simpler rules: the supervisors' ``status.json`` (process start and end, and when the SIGTERM
was sent) and the metrics' step timestamps, every step taken to last its attempt's median
where its start is not stamped. No field of job.json or of an attempt record is read for them.

A second run loses steps (a preemption with no emergency checkpoint): its ``replayed`` time
must be those steps' time, as their metrics' timestamps measure it; the first run lost none,
and replayed nothing.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import psutil
import pytest

from tests.e2e import driving
from tests.e2e.driving import deferred
from tests.trainer.helpers import TRAIN_KEYS, write_dataset
from trainer.contract import MetricsReader, RunLayout, run_prefix
from trainer.storage import open_storage
from trainops.cli.main import main
from trainops.operators import FSDPTrainingOperator

pytestmark = pytest.mark.slow

MAX_STEPS = 40
PREEMPT_AT = 15
RUN_ID = "manual__2026-12-01T00:00:00+00:00"
DEADLINE_S = 300.0


def run_trigger(trigger) -> dict:
    return driving.run_trigger(trigger, DEADLINE_S)


def independent_figures(local_state: Path, metrics: list[dict], accelerators: int) -> dict:
    """Goodput and recovery time from the process times and the metrics' timestamps alone."""
    statuses = sorted(
        (json.loads(p.read_text()) for p in local_state.rglob("status.json")), key=lambda s: s["start_time"]
    )
    assert len(statuses) == 2, statuses
    steps = {n: sorted((r for r in metrics if r["attempt"] == n), key=lambda r: r["step"]) for n in (1, 2)}
    first_of_2 = steps[2][0]["step"]

    def durations(records):
        """Each step's seconds: from the previous step's end (after its save's stall) to its end;
        the first one, of unknown start, as the attempt's median."""
        out = [
            b["time"] - a["time"] - a.get("checkpoint_blocked_s", 0.0) for a, b in itertools.pairwise(records)
        ]
        return [median(out), *out]

    productive = sum(d for r, d in zip(steps[1], durations(steps[1]), strict=True) if r["step"] < first_of_2)
    productive += sum(durations(steps[2]))
    billed = sum(s["end_time"] - s["start_time"] for s in statuses)
    sigterm = statuses[0]["disruptions"][0]["time"]
    next_first_step = steps[2][0]["time"] - durations(steps[2])[0]
    return {
        "goodput": productive / billed,
        "recovery_s": next_first_step - sigterm,
        "billed_gpu_hours": billed * accelerators / 3600,
    }


def test_one_injected_preemption_goodput_and_recovery_agree_with_an_independent_count(
    file_root, tmp_path, monkeypatch, capsys
):
    local_state = tmp_path / "local"
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(local_state))
    op, ctx, layout = driving.two_local_nodes(
        file_root,
        tmp_path,
        max_steps=MAX_STEPS,
        run_id=RUN_ID,
        poll_interval=0.5,
        termination_grace_seconds=30,
        inject_preemption={"node": 1, "at_step": PREEMPT_AT},
        job_options={"env": {"OMP_NUM_THREADS": "1"}},
    )
    store = open_storage(file_root)

    first = deferred(lambda: op.execute(ctx))
    gone_wait = deferred(lambda: op.execute_complete(ctx, run_trigger(first.trigger)))
    second = deferred(lambda: op.relaunch_when_gone(ctx, run_trigger(gone_wait.trigger)))
    result = op.execute_complete(ctx, run_trigger(second.trigger))
    assert (result["attempts"], result["preemptions"], result["steps"]) == (2, 1, MAX_STEPS)

    job = store.get_json(layout.job)
    cost = job["cost"]
    assert result["cost"] == cost and result["goodput"] == cost["goodput"]
    assert [a["outcome"] for a in cost["attempts"]] == ["preempted", "completed"]
    assert cost["notes"] == [  # the local backend knows no instance type: said plainly
        f"attempt {n}: default per-GPU-hour (no instance type known): priced at $1.40/GPU-hour spot"
        for n in (1, 2)
    ]
    # the emergency checkpoint kept every step: nothing replayed, as nothing was lost
    assert result["steps_lost"] == 0 and cost["seconds"]["replayed"] == 0.0
    for attempt in cost["attempts"]:
        assert sum(attempt["seconds"][p] for p in attempt["seconds"] if p != "queued") == pytest.approx(
            attempt["end"] - attempt["start"]
        )

    metrics = MetricsReader(store, layout.run_uri).records()
    mine = independent_figures(local_state, metrics, accelerators=2)
    assert cost["goodput"] == pytest.approx(mine["goodput"], rel=0.05)
    (recovery,) = cost["recovery_s"]
    assert recovery == pytest.approx(mine["recovery_s"], rel=0.05)
    assert cost["billed_gpu_hours"] == pytest.approx(mine["billed_gpu_hours"], rel=0.05)

    capsys.readouterr()
    assert main(["cost", layout.run_uri]) == 0
    printed = capsys.readouterr().out
    assert f"goodput (productive / billed GPU-hours)   {cost['goodput']:.1%}" in printed
    seconds = ", ".join(f"{p} {s:.1f}s" for p, s in cost["seconds"].items())
    with capsys.disabled():
        print(
            f"\ncost e2e: goodput {cost['goodput']:.1%} (independent {mine['goodput']:.1%}), recovery "
            f"{recovery:.1f}s (independent {mine['recovery_s']:.1f}s); {seconds}; "
            f"{cost['billed_gpu_hours']:.4f} GPU-hours, est. ${cost['cost']:.4f}, "
            f"on-demand ${cost['on_demand_cost']:.4f}\n{printed}"
        )


LOSE_AFTER = 15  # past the step-10 checkpoint (committed by then): steps 11 to 15 (or 16) are lost


def node_workers(op, handle, node: int) -> list[psutil.Process]:
    """The trainer processes torchrun started on ``node`` (its agent's children)."""
    pid = next(n["pid"] for n in op.backend.status(handle)["nodes"] if n["index"] == node)
    return [p for p in psutil.Process(pid).children(recursive=True) if "trainer" in " ".join(p.cmdline())]


def test_a_preemption_without_an_emergency_checkpoint_bills_the_lost_steps_as_replayed(
    file_root, tmp_path, monkeypatch
):
    """The spot notice reaches node 1 while its rank no longer answers (SIGSTOPped once the
    metrics show step 15, as a VM being reclaimed stops): the gang cannot agree on an emergency
    checkpoint, torchrun kills the rank after the grace (2 s), and the steps since the step-10
    checkpoint are lost. ``replayed`` must be those steps, timed independently from their
    metrics' timestamps (``train.log_every: 1``, so every step has its record when it ends)."""
    monkeypatch.setenv("TRAINOPS_LOCAL_STATE", str(tmp_path / "local"))
    dataset = write_dataset(tmp_path / "data" / "datasets" / "demo" / "v1")
    train = {**TRAIN_KEYS["train"], "max_steps": 24, "log_every": 1}
    op = FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": dataset},
        storage_root=file_root,
        trainer_config={**TRAIN_KEYS, "train": train},
        nodes=2,
        cluster="local",
        deferrable=True,
        poll_interval=0.5,
        progress_every=3600,
        termination_grace_seconds=2,
        inject_preemption={"node": 1, "at_step": LOSE_AFTER},
        job_options={"env": {"OMP_NUM_THREADS": "1"}},
    )
    ctx = {"ti": SimpleNamespace(dag_id="retrain", run_id=RUN_ID, task_id="train", map_index=-1)}
    layout = RunLayout(run_prefix(file_root, "retrain", RUN_ID, "train"))
    store = open_storage(file_root)

    first = deferred(lambda: op.execute(ctx))
    reader = MetricsReader(store, layout.run_uri, attempt=1)
    deadline = time.monotonic() + DEADLINE_S
    while not (latest := reader.latest().get(1)) or latest["step"] < LOSE_AFTER:
        assert time.monotonic() < deadline, f"attempt 1 did not reach step {LOSE_AFTER}"
        time.sleep(0.01)
    for worker in node_workers(op, first.trigger.handle, 1):
        os.kill(worker.pid, signal.SIGSTOP)

    gone_wait = deferred(lambda: op.execute_complete(ctx, run_trigger(first.trigger)))
    second = deferred(lambda: op.relaunch_when_gone(ctx, run_trigger(gone_wait.trigger)))
    result = op.execute_complete(ctx, run_trigger(second.trigger))
    job = store.get_json(layout.job)
    cost = job["cost"]
    assert [a["classification"] for a in job["attempts"]] == ["preempted", "succeeded"]
    lost = job["attempts"][0]["steps_lost"]
    assert lost >= LOSE_AFTER - 10 and result["steps_lost"] == lost

    # independently: each lost step's seconds from its record's timestamp and the one before
    steps = {r["step"]: r for r in MetricsReader(store, layout.run_uri).records() if r["attempt"] == 1}
    last = max(steps)
    resumed = store.get_json(layout.attempt(2))["resumed_from_step"]
    assert resumed == 10 and last - lost == resumed
    durations = {
        s: steps[s]["time"] - steps[s - 1]["time"] - steps[s - 1].get("checkpoint_blocked_s", 0.0)
        for s in range(2, last + 1)
    }
    measured = sum(durations[s] for s in range(resumed + 1, last + 1))
    replayed = cost["attempts"][0]["seconds"]["replayed"]
    assert replayed > 0
    assert replayed == pytest.approx(measured, rel=0.05)  # steps_lost x their measured step time
    assert cost["seconds"]["replayed"] == replayed  # attempt 2 replays them as productive steps
    assert cost["lost_gpu_hours"] > replayed * 2 / 3600  # plus the interrupted attempt's startup and end
    print(
        f"\nreplayed e2e: {lost} steps lost after the step-10 checkpoint; replayed {replayed:.2f}s, "
        f"measured {measured:.2f}s ({measured / lost:.3f} s/step, median step "
        f"{median(durations.values()):.3f} s); goodput {cost['goodput']:.1%}"
    )
