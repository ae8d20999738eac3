"""Retention: the pure pruning plan, and pruning real storage around production and rollback."""

from __future__ import annotations

import random

import pytest

from trainer.contract import RunLayout, join, model_version_prefix, production_pointer
from trainer.storage import StorageUnavailable, open_storage
from trainops.registry.retention import (
    apply_plan,
    check_policy,
    plan_pruning,
    protected_runs,
    runs_scope,
    scan_runs,
)


def run(uri: str, at: str, steps=(10, 20, 30), final=30, approved=False) -> dict:
    return {"run_uri": uri, "decided_at": at, "approved": approved, "steps": list(steps), "final_step": final}


# ------------------------------------------------------------------------------ policy


def test_policy_is_none_or_keep_last_runs():
    assert check_policy(None) is None
    assert check_policy({"keep_last_runs": 0}) == {"keep_last_runs": 0}


@pytest.mark.parametrize(
    "policy, words",
    [
        ({"keep_last": 3}, ["'keep_last'", "keep_last_runs"]),
        ({"keep_last_runs": -1}, ["-1", ">= 0"]),
        ({"keep_last_runs": "3"}, ["'3'"]),
        ({"keep_last_runs": True}, ["True"]),
        (3, ["int 3", "keep_last_runs"]),
    ],
)
def test_bad_policies_are_named(policy, words):
    with pytest.raises(ValueError) as err:
        check_policy(policy)
    for word in words:
        assert word in str(err.value)


# ------------------------------------------------------------------------------ the plan


def test_plan_keeps_recent_runs_and_the_final_checkpoint_of_promoted_and_approved_ones():
    runs = [
        run("r/promoted", "2026-01-01"),
        run("r/approved", "2026-01-02", approved=True),
        run("r/rejected", "2026-01-03"),
        run("r/recent", "2026-01-04"),
    ]
    plan = plan_pruning(runs, protected={"r/promoted"}, keep_last_runs=1)
    assert [(p["run_uri"], p["step"]) for p in plan] == [
        ("r/rejected", 10),
        ("r/rejected", 20),
        ("r/rejected", 30),
        ("r/approved", 10),
        ("r/approved", 20),
        ("r/promoted", 10),
        ("r/promoted", 20),
    ]
    assert {p["why"] for p in plan if p["run_uri"] == "r/rejected"} == {"checkpoint of a rejected run"}
    assert plan[-1]["why"] == "intermediate checkpoint of a promoted run"


def test_plan_deletes_nothing_within_keep_last_runs():
    runs = [run(f"r/{i}", f"2026-01-0{i}") for i in range(1, 4)]
    assert plan_pruning(runs, protected=set(), keep_last_runs=3) == []
    assert len(plan_pruning(runs, protected=set(), keep_last_runs=0)) == 9


def test_an_uncommitted_leftover_is_deleted_but_never_the_final_commit_of_a_protected_run():
    # step 40 was started but never committed (a preempted attempt); the final is 30.
    plan = plan_pruning(
        [run("r/p", "2026-01-01", steps=(30, 40), final=30)], protected={"r/p"}, keep_last_runs=0
    )
    assert [p["step"] for p in plan] == [40]


def test_plan_never_touches_the_final_checkpoint_of_a_protected_run_whatever_the_runs():
    rng = random.Random(6)
    for _ in range(300):
        runs = []
        for i in range(rng.randint(0, 8)):
            steps = sorted(rng.sample(range(1, 20), rng.randint(0, 5)))
            final = rng.choice([*steps, None]) if steps else None
            runs.append(
                run(f"r/{i}", f"2026-01-{rng.randint(1, 28):02d}", steps, final, approved=rng.random() < 0.3)
            )
        protected = {r["run_uri"] for r in runs if rng.random() < 0.4}
        keep = rng.randint(0, 4)
        plan = plan_pruning(runs, protected=protected, keep_last_runs=keep)
        finals = {r["run_uri"]: r["final_step"] for r in runs}
        for item in plan:
            assert not (item["run_uri"] in protected and item["step"] == finals[item["run_uri"]])
        recent = sorted(runs, key=lambda r: (r["decided_at"], r["run_uri"]), reverse=True)[:keep]
        assert not {p["run_uri"] for p in plan} & {r["run_uri"] for r in recent}


def test_apply_refuses_a_plan_that_would_delete_a_protected_final_checkpoint(file_root):
    storage = open_storage(file_root)
    uri = join(file_root, "runs", "d", "r1", "train")
    storage.put(RunLayout(uri).committed_marker(30), b"{}")
    bad_plan = [{"run_uri": uri, "step": 30, "why": "a bug"}]
    with pytest.raises(ValueError, match="final checkpoint"):
        apply_plan(storage, bad_plan, [run(uri, "x", steps=(30,), final=30)], {uri})
    assert storage.exists(RunLayout(uri).committed_marker(30))


# --------------------------------------------------------------------- real storage


def finished_run(
    storage, root: str, name: str, decided_at: str, approved: bool, steps=(30, 60, 90), model: str = "demo-lm"
) -> str:
    uri = join(root, "runs", "retrain", name, "train")
    layout = RunLayout(uri)
    for step in steps:
        storage.put(join(layout.checkpoint(step), "shard_0.distcp"), b"x" * 64)
        storage.put(layout.committed_marker(step), b"{}")
    storage.put_json(layout.latest, {"step": max(steps)})
    storage.put(join(layout.export, "model.safetensors"), f"weights {name}".encode())
    storage.put_json(layout.eval_gate, {"model_name": model, "approved": approved, "decided_at": decided_at})
    return uri


def publish(storage, root: str, version: int, run_uri: str) -> None:
    v = model_version_prefix(root, "demo-lm", version)
    storage.put(join(v, "model.safetensors"), b"weights")
    storage.put_json(
        join(v, "card.json"),
        {"version": version, "run_uri": run_uri, "files": [{"path": "model.safetensors"}]},
    )


@pytest.mark.parametrize("root_fixture", ["file_root", "s3_root"])
def test_pruning_real_storage_never_touches_production_or_rollback_targets(request, root_fixture):
    root = request.getfixturevalue(root_fixture)
    storage = open_storage(root)
    v1_run = finished_run(storage, root, "jan", "2026-01-01T00:00:00+00:00", True)
    v2_run = finished_run(storage, root, "feb", "2026-02-01T00:00:00+00:00", True)
    rejected = finished_run(storage, root, "mar", "2026-03-01T00:00:00+00:00", False)
    other_model = finished_run(storage, root, "other", "2026-03-02T00:00:00+00:00", False, model="other-lm")
    latest = finished_run(storage, root, "apr", "2026-04-01T00:00:00+00:00", True)
    in_flight = join(root, "runs", "retrain", "may", "train")  # still training: no gate.json
    storage.put(RunLayout(in_flight).committed_marker(30), b"{}")
    publish(storage, root, 1, v1_run)
    publish(storage, root, 2, v2_run)
    # v2 went live, then was rolled back to v1: both are production or rollback targets.
    storage.put_json(
        production_pointer(root, "demo-lm"),
        {
            "version": 1,
            "uri": model_version_prefix(root, "demo-lm", 1),
            "history": [
                {"version": 1, "action": "promote", "run_uri": v1_run},
                {"version": 2, "action": "promote", "run_uri": v2_run},
                {"version": 1, "action": "rollback", "from_version": 2, "run_uri": v1_run},
            ],
        },
    )
    models_before = {u: storage.get(u) for u in storage.list(join(root, "models"))}

    runs = scan_runs(storage, runs_scope(latest), "demo-lm")
    assert [r["run_uri"] for r in runs] == [latest, v2_run, v1_run, rejected]  # sorted by URI
    assert runs[1]["steps"] == [30, 60, 90] and runs[1]["final_step"] == 90
    protected = protected_runs(storage, root, "demo-lm")
    assert protected == {v1_run, v2_run}
    plan = plan_pruning(runs, protected=protected, keep_last_runs=1)
    deleted = apply_plan(storage, plan, runs, protected)
    assert len(deleted) == 7

    def steps_of(uri):
        return sorted(
            int(u.split("step_")[1][:8])
            for u in storage.list(join(uri, "checkpoints"))
            if u.endswith("_COMMITTED")
        )

    assert steps_of(v1_run) == [90] and steps_of(v2_run) == [90]  # final checkpoints kept
    assert steps_of(rejected) == []
    assert not storage.exists(RunLayout(rejected).latest)
    assert steps_of(latest) == [30, 60, 90]  # within keep_last_runs
    assert steps_of(other_model) == [30, 60, 90]  # another model's runs are not ours to prune
    assert steps_of(in_flight) == [30]  # never decided: still training
    for uri in (v1_run, v2_run, rejected, latest):
        assert storage.exists(join(RunLayout(uri).export, "model.safetensors"))
    assert {u: storage.get(u) for u in storage.list(join(root, "models"))} == models_before


def test_a_pointer_that_cannot_be_read_stops_pruning_before_anything_is_deleted(faulty_s3_root, s3_faults):
    """Pruning reads the pointer just before it deletes. When that read fails it stops, rather
    than taking the history for empty and unprotecting every run a version came from."""
    root = faulty_s3_root
    storage = open_storage(root, outage_tolerance_s=0.5)  # scaled down from the operators' 120 s
    # A run the gate rejected once, which a later manual promotion made production.
    promoted = finished_run(storage, root, "jan", "2026-01-01T00:00:00+00:00", False)
    storage.put_json(
        production_pointer(root, "demo-lm"),
        {
            "version": 1,
            "uri": model_version_prefix(root, "demo-lm", 1),
            "history": [{"version": 1, "action": "promote", "run_uri": promoted}],
        },
    )
    runs = scan_runs(storage, runs_scope(promoted), "demo-lm")
    s3_faults.inject(refuse=1.0, ops={"GET"})  # reads refused; listing and deleting still work
    with pytest.raises(StorageUnavailable, match=r"production\.json"):
        protected_runs(storage, root, "demo-lm")
    s3_faults.clear()
    assert storage.exists(RunLayout(promoted).committed_marker(90))
    protected = protected_runs(storage, root, "demo-lm")
    assert protected == {promoted}
    plan = plan_pruning(runs, protected=protected, keep_last_runs=0)
    assert [item["step"] for item in plan] == [30, 60]  # its final checkpoint stays
