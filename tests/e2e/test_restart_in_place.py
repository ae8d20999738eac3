"""A killed worker, end to end, with real parts: FSDPTrainingOperator on the local cluster (two
nodes of one CPU rank each under torchrun, the tiny model, file:// storage), driven as Airflow
drives it, its trigger run for real.

Once attempt 1 has committed a checkpoint and trained on, node 1's worker process is SIGKILLed;
its node (the torchrun agent, the pod on a cluster) lives on. torchrun restarts the gang in
place (``restarts_in_place``, 2 by default): no job is deleted and no attempt added, each node
keeps its agent, and the restarted gang resumes from the newest checkpoint, its shards read from
each node's local tier. The task succeeds with the very weights of an uninterrupted run of the
same DAG, and the attempt's record, its job.json entry and the run's lost time say what happened.
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.e2e import driving
from tests.e2e.driving import deferred, wait_until
from trainer.contract import MetricsReader, RunLayout
from trainer.storage import NotFound, open_storage

pytestmark = pytest.mark.slow

MAX_STEPS = 40
KILL_AFTER_STEP = 13  # past the step-10 commit
DEADLINE_S = 240.0


def last_step(store, layout: RunLayout) -> int:
    latest = MetricsReader(store, layout.run_uri, attempt=1).latest().get(1)
    return int(latest["step"]) if latest else 0


def committed(store, layout: RunLayout) -> int:
    try:
        return int(store.get_json(layout.latest)["step"])
    except (NotFound, KeyError):
        return 0


def agents(op, handle) -> dict[int, int]:
    """Each node's torchrun agent: node index -> pid."""
    return {n["index"]: n["pid"] for n in op.backend.status(handle)["nodes"]}


def workers(node_pid: int) -> list[int]:
    """The live trainer processes torchrun runs on a node (a killed one, not yet reaped, is not)."""
    found = []
    for proc in psutil.Process(node_pid).children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and "trainer" in " ".join(proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:  # gone meanwhile
            continue
    return found


def test_a_killed_worker_restarts_in_place_on_its_node_from_the_local_tier(file_root, local_state, tmp_path):
    op, ctx, layout = driving.two_local_nodes(
        file_root, tmp_path / "killed", max_steps=MAX_STEPS, run_id="manual__2026-12-06T01:00:00+00:00"
    )
    store = open_storage(file_root)
    first = deferred(lambda: op.execute(ctx))
    handle = first.trigger.handle
    wait_until(
        lambda: committed(store, layout) >= 10 and last_step(store, layout) >= KILL_AFTER_STEP,
        f"a commit and step {KILL_AFTER_STEP}",
    )
    nodes = agents(op, handle)
    [victim] = workers(nodes[1])
    psutil.Process(victim).send_signal(signal.SIGKILL)
    killed_at = time.time()
    wait_until(lambda: workers(nodes[1]) not in ([], [victim]), "node 1's worker to be restarted")
    assert agents(op, handle) == nodes  # the same nodes: nothing was deleted or relaunched

    result = op.execute_complete(ctx, driving.run_trigger(first.trigger, DEADLINE_S))
    assert (result["attempts"], result["steps"], result["restarts_in_place"]) == (1, MAX_STEPS, 1)
    record = store.get_json(layout.attempt(1))
    assert (record["outcome"], record["last_step"]) == ("completed", MAX_STEPS)
    [before] = record["restarts"]
    assert (before["restart"], before["outcome"], before["cause"]) == (0, "failed", "network")
    resumed = record["resumed_from_step"]
    assert resumed >= 10 and before["checkpoint_step"] == resumed
    # every rank's shard and per-rank state from its node's tier; node 1 fetched rank 0's .metadata
    assert record["restore_files"] == {"local": 5, "storage": 1}
    [entry] = store.get_json(layout.job)["attempts"]
    assert entry["classification"] == "succeeded"
    assert "restarted in place 1×" in entry["reason"], entry["reason"]
    kill_to_step = record["first_step_time"] - killed_at
    print(
        f"\nrestart in place: node 1's worker SIGKILLed after step {before['last_step']}; the restarted gang "
        f"resumed from step {resumed} ({record['restore_files']}) and began its first step "
        f"{kill_to_step:.1f} s after the kill"
    )
    assert kill_to_step > 0

    # the same DAG, uninterrupted: the same weights, bit for bit
    ref, ref_ctx, ref_layout = driving.two_local_nodes(
        file_root, tmp_path / "reference", max_steps=MAX_STEPS, run_id="manual__2026-12-06T02:00:00+00:00"
    )
    ref_first = deferred(lambda: ref.execute(ref_ctx))
    ref.execute_complete(ref_ctx, driving.run_trigger(ref_first.trigger, DEADLINE_S))
    weights = store.get(f"{layout.export}/model.safetensors")
    assert weights == store.get(f"{ref_layout.export}/model.safetensors")
