"""What a task does when it (re)starts on its job.json: the plan over plain data, then a crash
at every step of launch and record keeping, and the retry that comes after it.

Over plain data: :func:`trainops.recovery.resume.resume_plan` for each state a crash can leave.
Then FSDPTrainingOperator is driven as Airflow drives it (``execute``, ``execute_complete``,
``relaunch_when_gone``, each on a fresh operator as a new worker would build it; a call that
raises is followed by Airflow's retry, ``execute`` again), through a run of two attempts: the
first preempted, the second completing. Once per run one step fails, either before it acts or
after it acted with its reply lost: a write of job.json (the intent, the handle, the fold), the
cluster's launch and delete, and the deferral after the handle was recorded. After every call
the test checks what a user would see: no job was ever created twice, at most one job is live
and job.json names it (no orphan), and job.json is consistent (attempts 1..n, at most the newest
not ended, the running one is the live job).

The cluster is a fake that behaves like a control plane for this purpose: a job object stays
until it is deleted (a finished one too), a create of an existing name answers
``JobAlreadyExists``, and a deleted job is gone at once. The attempt records are real ones in
real file:// storage.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred

import trainops.cluster
import trainops.operators.train as train_module
from tests.trainops.cluster.fake_backend import FakeCluster
from tests.trainops.operators.helpers import staged_dataset
from trainer.contract import RunLayout, attempt_record, run_prefix
from trainer.storage import open_storage
from trainops.cluster.base import JobAlreadyExists
from trainops.cluster.spec import JobSpec
from trainops.operators import FSDPTrainingOperator
from trainops.recovery.record import (
    fold_finished,
    intend_attempt,
    record_launched,
    restart_record,
    start_record,
)
from trainops.recovery.resume import attempt_of, resume_plan

RUN_ID = "manual__2026-01-01T00:00:00+00:00"
SPOT = {"node": 1, "reason": "SpotInterruption", "message": "spot interruption notice"}


BUDGETS = {"max_preemptions": 3, "max_infra_retries": 1, "fallback_after": None}


# -- the plan, over plain data ------------------------------------------------------------------
def spec_of(n):
    return JobSpec(
        name=f"train-0a1b2c3d-a{n}",
        args=["python", "-m", "trainer", "train"],
        labels={"trainops/attempt": str(n)},
    )


def handle_of(n, **labels):
    return {
        "cluster": "local",
        "job_id": f"train-0a1b2c3d-a{n}",
        "labels": labels or {"trainops/attempt": str(n)},
    }


def intended(job, n):
    return intend_attempt(job, spec=spec_of(n), manifests=[], at="t", try_number=1)


def running_(job, n):
    return record_launched(intended(job, n), attempt=n, handle=handle_of(n), at="t")


def ended(job, n, phase="failed", disruptions=(SPOT,)):
    state = {"phase": phase, "reason": None, "nodes": [], "disruptions": list(disruptions)}
    return fold_finished(running_(job, n), state=state, record=None, progress=None, budgets=BUDGETS, at="t")[
        0
    ]


def fresh():
    return start_record(
        run_uri="file:///r", config_uri="file:///r/config.yaml", cluster="local", capacity="spot"
    )


def test_nothing_recorded_and_nothing_live_launches_attempt_one():
    assert resume_plan(fresh(), []) == {"action": "launch", "attempt": 1, "reason": "next attempt"}


def test_an_intent_without_a_live_job_launches_that_same_attempt():
    job = intended(ended(fresh(), 1), 2)
    assert resume_plan(job, [])["action"] == "launch" and resume_plan(job, [])["attempt"] == 2


def test_an_intent_whose_job_is_live_is_reattached_not_launched_again():
    job = intended(ended(fresh(), 1), 2)
    plan = resume_plan(job, [handle_of(2)])
    assert (plan["action"], plan["attempt"], plan["handle"]["job_id"]) == ("wait", 2, "train-0a1b2c3d-a2")
    assert "adopt" not in plan


def test_a_running_attempt_whose_job_ended_unwatched_is_waited_on_for_its_end():
    job = running_(fresh(), 1)
    plan = resume_plan(job, [])
    assert (plan["action"], plan["handle"]["job_id"]) == ("wait", "train-0a1b2c3d-a1")


def test_a_live_job_the_record_never_named_is_adopted_as_the_next_attempt():
    job = ended(fresh(), 1)
    plan = resume_plan(job, [handle_of(2)])
    assert (plan["action"], plan["attempt"], plan.get("adopt")) == ("wait", 2, True)
    unlabelled = resume_plan(fresh(), [{"cluster": "local", "job_id": "train-live", "labels": {}}])
    assert (unlabelled["action"], unlabelled["attempt"], unlabelled.get("adopt")) == ("wait", 1, True)


def test_a_live_job_of_an_older_attempt_is_retired_before_anything_launches():
    job = ended(fresh(), 1)
    plan = resume_plan(job, [handle_of(1)])
    assert (plan["action"], plan["handle"]["job_id"]) == ("retire", "train-0a1b2c3d-a1")
    beside = resume_plan(running_(job, 2), [handle_of(1), handle_of(2)])  # a second gang: retire it
    assert (beside["action"], beside["handle"]["job_id"]) == ("retire", "train-0a1b2c3d-a1")


def test_a_fresh_try_retires_the_newest_ended_attempt_while_it_still_has_processes():
    job = ended(fresh(), 1)
    plan = resume_plan(job, [], last_alive=True)
    assert (plan["action"], plan["attempt"]) == ("retire", 1)
    assert resume_plan(job, [], last_alive=False)["action"] == "launch"


def test_the_attempt_a_job_carries_is_read_from_its_labels():
    assert attempt_of(handle_of(3)) == 3
    assert attempt_of({"cluster": "local", "job_id": "x", "labels": {}}) is None
    assert attempt_of({"cluster": "local", "job_id": "x", "labels": {"trainops/attempt": "x"}}) is None


def test_a_clear_after_a_spent_budget_opens_a_new_window_and_keeps_the_totals():
    job = fresh()
    for n in (1, 2, 3, 4):
        job = ended(job, n)
    assert (job["status"], job["preemptions"], job["budget"]["preemptions"]) == ("failed", 4, 4)
    again = restart_record(job, capacity="spot")
    assert again["budget"] == {"from_attempt": 5, "preemptions": 0, "infra_failures": 0}
    assert again["status"] == "running" and again["preemptions"] == 4
    after = ended(again, 5)
    assert (after["status"], after["preemptions"], after["budget"]["preemptions"]) == ("running", 5, 1)
    assert after["attempts"][-1]["decision"]["action"] == "relaunch"


# -- the operator, crashed at every step -------------------------------------------------------
class Crash(RuntimeError):
    """The injected failure (a worker that died, a connection reset)."""


class ControlPlane(FakeCluster):
    """Jobs by name, kept until deleted; 409 on a second create; gone once deleted."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, dict] = {}  # name -> {"handle", "ended": state or None}
        self.creations: dict[str, int] = {}
        self.violations: list[str] = []
        self.crash: Crashes | None = None

    def launch(self, spec, *, chaos=None):
        self.crash and self.crash.maybe("launch", int(spec.labels["trainops/attempt"]), "before")
        if spec.name in self.jobs:
            raise JobAlreadyExists(f"job {spec.name} already exists", self.jobs[spec.name]["handle"])
        others = [n for n, j in self.jobs.items() if j["ended"] is None]
        if others:
            self.violations.append(f"{spec.name} created while {others} still ran: a second gang")
        handle = {"cluster": "local", "job_id": spec.name, "job_dir": "/nowhere", "labels": dict(spec.labels)}
        self.jobs[spec.name] = {"handle": handle, "ended": None}
        self.creations[spec.name] = self.creations.get(spec.name, 0) + 1
        self.launched.append((spec, chaos))
        self.crash and self.crash.maybe("launch", int(spec.labels["trainops/attempt"]), "after")
        return handle

    def end(self, name: str, state: dict) -> None:
        self.jobs[name]["ended"] = state

    def status(self, handle):
        job = self.jobs.get(handle["job_id"])
        if job is None:
            return {"phase": "lost", "reason": "the job object is gone", "nodes": [], "disruptions": []}
        return job["ended"] or {"phase": "running", "reason": None, "nodes": [], "disruptions": []}

    def find(self, labels):
        return [
            j["handle"]
            for j in self.jobs.values()
            if j["ended"] is None and all(j["handle"]["labels"].get(k) == v for k, v in labels.items())
        ]

    def delete(self, handle):
        attempt = int(handle["labels"].get("trainops/attempt", 0))
        self.crash and self.crash.maybe("delete", attempt, "before")
        self.jobs.pop(handle["job_id"], None)
        self.deleted.append(handle["job_id"])
        self.crash and self.crash.maybe("delete", attempt, "after")

    def all_gone(self, handle):
        return handle["job_id"] not in self.jobs

    def live_names(self) -> list[str]:
        return [n for n, j in self.jobs.items() if j["ended"] is None]


class Crashes:
    """Fires once, at ``point`` = (step, attempt, "before" | "after")."""

    def __init__(self, point: tuple[str, int, str] | None) -> None:
        self.point, self.fired = point, False

    def maybe(self, step: str, attempt: int, when: str) -> None:
        if not self.fired and self.point == (step, attempt, when):
            self.fired = True
            raise Crash(f"injected crash {when} {step} of attempt {attempt}")


class CrashingStore:
    """The run's storage, whose writes of job.json can fail (before, or after writing)."""

    def __init__(self, store, job_uri: str, crashes: Crashes) -> None:
        self.store, self.job_uri, self.crashes = store, job_uri, crashes

    def __getattr__(self, name):
        return getattr(self.store, name)

    def put_json(self, uri, data, **conditions):
        if uri != self.job_uri:
            return self.store.put_json(uri, data, **conditions)
        if not data["attempts"]:  # the claim: job.json created with its owner, config.yaml next
            step, attempt = "claim", 1
        else:
            entry = data["attempts"][-1]
            step = {"launching": "intent", "running": "handle"}.get(entry.get("status"), "fold")
            attempt = entry["attempt"]
        self.crashes.maybe(step, attempt, "before")
        self.store.put_json(uri, data, **conditions)
        self.crashes.maybe(step, attempt, "after")


STEPS = [("intent", "b"), ("intent", "a"), ("launch", "b"), ("launch", "a"), ("handle", "b"), ("handle", "a")]
POINTS = (
    [("claim", 1, "before"), ("claim", 1, "after")]  # between creating job.json and config.yaml
    + [(step, n, {"b": "before", "a": "after"}[w]) for n in (1, 2) for step, w in STEPS]
    + [("defer", n, "before") for n in (1, 2)]  # the handle recorded, the worker dies before deferring
    + [("fold", n, w) for n in (1, 2) for w in ("before", "after")]
    + [("delete", 1, w) for w in ("before", "after")]  # the relaunch path: retiring attempt 1
)


@pytest.fixture
def plane(monkeypatch):
    fake = ControlPlane()
    monkeypatch.setattr(trainops.cluster, "get_cluster", lambda name, **options: fake)
    return fake


def context():
    return {
        "ti": SimpleNamespace(dag_id="retrain", run_id=RUN_ID, task_id="train", map_index=-1, try_number=1)
    }


def layout_of(root):
    return RunLayout(run_prefix(root, "retrain", RUN_ID, "train"))


def first_event(trigger):
    async def take():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(take(), timeout=30))


def job_json(root):
    store = open_storage(root)
    layout = layout_of(root)
    return store.get_json(layout.job) if store.exists(layout.job) else None


def check_consistent(root, plane: ControlPlane) -> None:
    """What must hold between any two calls, whatever crashed."""
    assert not plane.violations, plane.violations
    assert all(count == 1 for count in plane.creations.values()), f"double launch: {plane.creations}"
    live = plane.live_names()
    assert len(live) <= 1, f"more than one live job: {live}"
    job = job_json(root)
    if job is None:
        assert live == [], f"orphans {live}: job.json was never written"
        return
    numbers = [a["attempt"] for a in job["attempts"]]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    ended = ["ended_at" in a for a in job["attempts"]]
    assert all(ended[:-1]), f"an attempt before the newest never ended: {numbers}"
    named = {a.get("job_name") for a in job["attempts"]}
    for name in live:
        assert name in named, f"orphan: live job {name} is not in job.json ({named})"
    newest = job["attempts"][-1] if job["attempts"] else None
    if newest is not None and newest.get("status") == "running" and live:
        assert newest["job"]["job_id"] == live[0], (newest["job"], live)


def drive(
    root, plane: ControlPlane, crashes: Crashes, monkeypatch, preempted=(1,), **op_options
) -> tuple[dict, int]:
    """Drive the task to its end as Airflow would, checking after every call; return the
    result and the number of retries (a failure that is not the injected crash propagates).

    :param preempted: the attempts that are preempted; the others complete.
    """
    layout = layout_of(root)
    store = open_storage(root)
    real_run, real_wait = FSDPTrainingOperator._run, FSDPTrainingOperator._wait

    def crashing_run(self, ctx):
        s, lay, identity = real_run(self, ctx)
        return CrashingStore(s, lay.job, crashes), lay, identity

    def crashing_wait(self, ctx, handle, lay):
        crashes.maybe("defer", int(handle["labels"]["trainops/attempt"]), "before")
        return real_wait(self, ctx, handle, lay)

    monkeypatch.setattr(FSDPTrainingOperator, "_run", crashing_run)
    monkeypatch.setattr(FSDPTrainingOperator, "_wait", crashing_wait)
    plane.crash = crashes
    call: tuple[str, dict | None] = ("execute", None)
    retries = 0
    for _ in range(40):
        op = FSDPTrainingOperator(
            task_id="train",
            dataset={"uri": staged_dataset(f"{root.rsplit('/', 1)[0]}/data/datasets/demo/abc")},
            storage_root=root,
            nodes=2,
            trainer_config={"train.max_steps": 100},
            **op_options,
        )
        name, event = call
        try:
            result = op.execute(context()) if name == "execute" else getattr(op, name)(context(), event)
        except TaskDeferred as deferred:
            check_consistent(root, plane)
            handle = deferred.trigger.handle
            if deferred.method_name == "relaunch_when_gone":
                call = ("relaunch_when_gone", first_event(deferred.trigger))
                continue
            attempt = int(handle["labels"]["trainops/attempt"])
            state = _finish(store, layout, plane, handle, attempt, preempted=attempt in preempted)
            call = ("execute_complete", {"status": "finished", "handle": handle, "state": state})
            continue
        except Crash:
            check_consistent(root, plane)
            retries += 1
            call = ("execute", None)  # Airflow's retry
            continue
        check_consistent(root, plane)
        return result, retries
    raise AssertionError("the task never ended")


def _finish(store, layout, plane: ControlPlane, handle, attempt: int, preempted: bool | None = None) -> dict:
    """End attempt ``attempt``'s job as the trainer would: preempted (by default the first),
    else completed (an attempt after the second resumes at the end and completes at once)."""
    if preempted or (preempted is None and attempt == 1):
        record = attempt_record(
            attempt=attempt,
            outcome="preempted",
            world_size=2,
            last_step=50,
            checkpoint_step=50,
            signal="SIGTERM",
        )
        state = {
            "phase": "failed",
            "reason": None,
            "disruptions": [SPOT],
            "nodes": [{"index": 0, "exit_code": 1}, {"index": 1, "exit_code": 1}],
        }
    else:
        record = attempt_record(
            attempt=attempt,
            outcome="completed",
            world_size=2,
            last_step=100,
            checkpoint_step=100,
            resumed_from_step=50 if attempt == 2 else 100,
        )
        state = {"phase": "succeeded", "reason": None, "disruptions": [], "nodes": []}
    store.put_json(layout.attempt(attempt), record)
    plane.end(handle["job_id"], state)
    return state


def test_without_a_crash_two_attempts_run_once_each(file_root, plane, monkeypatch):
    result, retries = drive(file_root, plane, Crashes(None), monkeypatch)
    assert (result["attempts"], result["preemptions"], retries) == (2, 1, 0)
    assert sorted(plane.creations) == [s.name for s, _ in plane.launched]


@pytest.mark.parametrize("point", POINTS, ids=["-".join(map(str, p)) for p in POINTS])
def test_a_crash_at_any_step_launches_each_attempt_once_and_keeps_job_json_whole(
    file_root, plane, monkeypatch, point
):
    crashes = Crashes(point)
    result, retries = drive(file_root, plane, crashes, monkeypatch)
    assert crashes.fired and retries == 1
    job = job_json(file_root)
    names = [a["job_name"] for a in job["attempts"]]
    assert sorted(plane.creations) == sorted(names)  # every attempt launched exactly once
    assert plane.live_names() == []  # nothing is left running
    assert job["status"] == "succeeded" and result["steps"] == 100
    classes = [a["classification"] for a in job["attempts"]]
    # The one exception: job.json said "succeeded" but its reply was lost, so the retry
    # starts the task over (as a clear would), in a new budget window, as attempt 3.
    if point == ("fold", 2, "after"):
        assert classes == ["preempted", "succeeded", "succeeded"]
        assert job["budget"] == {"from_attempt": 3, "preemptions": 0, "infra_failures": 0}
    else:
        assert classes == ["preempted", "succeeded"]
        assert (job["preemptions"], job["budget"]["preemptions"]) == (1, 1)


def test_a_clear_after_the_preemption_budget_was_spent_starts_with_the_whole_budget(
    file_root, plane, monkeypatch
):
    """max_preemptions=1: attempts 1 and 2 preempted fail the task. The clear's try gets the
    whole budget again: attempt 3 preempted is relaunched, attempt 4 completes; the totals
    stay for the report, and each attempt says which try launched it."""
    with pytest.raises(RuntimeError, match="preempted 2 times, over the budget of 1"):
        drive(file_root, plane, Crashes(None), monkeypatch, preempted=(1, 2, 3), max_preemptions=1)
    assert job_json(file_root)["status"] == "failed"
    result, _ = drive(file_root, plane, Crashes(None), monkeypatch, preempted=(1, 2, 3), max_preemptions=1)
    job = job_json(file_root)
    assert [a["classification"] for a in job["attempts"]] == ["preempted"] * 3 + ["succeeded"]
    assert (job["preemptions"], job["budget"]) == (
        3,
        {"from_attempt": 3, "preemptions": 1, "infra_failures": 0},
    )
    assert (result["attempts"], result["preemptions"]) == (4, 3)
    assert sorted(plane.creations.values()) == [1, 1, 1, 1]


def test_a_launch_whose_reply_was_lost_and_whose_job_ended_unseen_is_reattached_on_409(
    file_root, plane, monkeypatch
):
    """The launch of attempt 1 created its job but the reply was lost, and the job ended before
    the retry: no live job, the entry still ``launching``. The retry's create answers 409
    (JobAlreadyExists): it reattaches to the ended job, whose end is then folded in."""
    real_launch = plane.launch

    def launch_then_end(spec, *, chaos=None):
        try:
            return real_launch(spec, chaos=chaos)
        except Crash:
            handle = plane.jobs[spec.name]["handle"]
            _finish(open_storage(file_root), layout_of(file_root), plane, handle, 1, preempted=False)
            raise

    monkeypatch.setattr(plane, "launch", launch_then_end)
    result, retries = drive(file_root, plane, Crashes(("launch", 1, "after")), monkeypatch, preempted=())
    job = job_json(file_root)
    assert (retries, result["attempts"], plane.creations) == (1, 1, {job["attempts"][0]["job_name"]: 1})
    assert job["attempts"][0]["job"]["job_id"] == job["attempts"][0]["job_name"]
    assert job["attempts"][0]["classification"] == "succeeded"


def test_the_crash_points_cover_every_write_launch_and_delete():
    print(f"\ncrash points covered: {len(POINTS)}")
    assert len(POINTS) == 22


def test_a_failed_write_after_launch_reattaches_to_the_right_entry_not_the_previous(
    file_root, plane, monkeypatch
):
    """Today's bug: attempt 2 launched, its handle write failed; the retry reattached and then
    folded attempt 2's end into attempt 1's entry (or crashed). Now attempt 2's entry is
    there, ``launching``, before the launch, and the retry records its handle in it."""
    crashes = Crashes(("handle", 2, "before"))
    drive(file_root, plane, crashes, monkeypatch)
    job = job_json(file_root)
    first, second = job["attempts"]
    assert (first["attempt"], first["classification"], first["job"]["job_id"]) == (
        1,
        "preempted",
        first["job_name"],
    )
    assert (second["attempt"], second["classification"], second["job"]["job_id"]) == (
        2,
        "succeeded",
        second["job_name"],
    )
    assert plane.creations[second["job_name"]] == 1


def test_a_job_of_an_earlier_version_launched_but_never_recorded_is_adopted(file_root, plane, monkeypatch):
    """A job.json written by a version that recorded after launching: attempt 2 is live but
    not in it. The retry adopts it as attempt 2, with attempt 1's entry untouched."""
    drive_until = Crashes(("handle", 2, "before"))
    monkeypatch.setattr(train_module, "now_iso", lambda: "2026-01-01T00:00:00+00:00")
    with pytest.raises(Crash):
        # Up to attempt 2's launch, then make job.json look as the old version left it.
        plane.crash = drive_until
        real_run = FSDPTrainingOperator._run

        def crashing_run(self, ctx):
            s, lay, identity = real_run(self, ctx)
            return CrashingStore(s, lay.job, drive_until), lay, identity

        monkeypatch.setattr(FSDPTrainingOperator, "_run", crashing_run)
        op = _op(file_root)
        with pytest.raises(TaskDeferred) as first:
            op.execute(context())
        store, layout = open_storage(file_root), layout_of(file_root)
        _finish(store, layout, plane, first.value.trigger.handle, 1)
        event = {
            "status": "finished",
            "handle": first.value.trigger.handle,
            "state": plane.status(first.value.trigger.handle),
        }
        with pytest.raises(TaskDeferred) as gone:
            _op(file_root).execute_complete(context(), event)
        _op(file_root).relaunch_when_gone(context(), first_event(gone.value.trigger))
    store, layout = open_storage(file_root), layout_of(file_root)
    job = store.get_json(layout.job)
    job["attempts"] = job["attempts"][:1]  # as the old version left it: attempt 2 unrecorded
    store.put_json(layout.job, job)
    assert plane.live_names() == [f"{job['attempts'][0]['job_name'][:-1]}2"]
    with pytest.raises(TaskDeferred) as reattached:
        _op(file_root).execute(context())
    assert reattached.value.trigger.handle["job_id"] == plane.live_names()[0]
    after = store.get_json(layout.job)
    assert [a["attempt"] for a in after["attempts"]] == [1, 2]
    assert after["attempts"][0] == job["attempts"][0]  # attempt 1's entry is not overwritten
    assert after["attempts"][1]["status"] == "running"
    assert len(plane.launched) == 2


def _op(root):
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": staged_dataset(f"{root.rsplit('/', 1)[0]}/data/datasets/demo/abc")},
        storage_root=root,
        nodes=2,
        trainer_config={"train.max_steps": 100},
    )
