"""The wait / decide / relaunch loop on the Kubernetes backend, end to end at the hook boundary,
on a simulated control plane.

FSDPTrainingOperator, its triggers (run for real, in this process) and KubernetesCluster are
the production code; ``ControlPlane`` stands in for the API server, the Job controller, the
scheduler and the kubelets (tests/trainops/cluster/kubernetes/control_plane.py): the pods are
made from the Job trainops rendered, and move on in simulated time (every API call takes one
simulated second). ``Trainer`` plays the trainer's part in each pod: it logs, writes its
attempt record and exits, as the trainer would.
"""

import asyncio
import json
import re
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred

import trainops.cluster
from tests.trainops.cluster.kubernetes.control_plane import COMPLETION_INDEX, ControlPlane
from tests.trainops.cluster.kubernetes.fake_k8s import load
from tests.trainops.operators.helpers import staged_dataset
from trainer.contract import RunLayout, attempt_record, run_prefix
from trainer.storage import open_storage
from trainops.cluster.kubernetes.backend import KubernetesCluster
from trainops.cost.prices import load_prices, price_of
from trainops.operators import FSDPTrainingOperator

RUN_ID = "scheduled__2026-01-01T00:00:00+00:00"
NODES = [f"gke-ml-spot-a100-pool-7c1d9e2b-{i}" for i in range(4)]


class Trainer:
    """The trainer in each pod of each attempt: ``scripts[attempt]`` says what it does.

    ``complete``: logs a step every 10 s, and after ``run_s`` rank 0 writes the ``completed``
    record and every node exits 0. ``preempt``: after 10 s node 1 is preempted by the scheduler,
    and rank 0 writes the ``preempted`` record (its SIGTERM handler's emergency checkpoint).
    ``fail``: node 0 prints a traceback, writes the ``failed`` record and exits 1.
    """

    def __init__(self, root, scripts=None, *, run_s=30.0, steps=100, resumed_from=None):
        self.root, self.scripts, self.run_s, self.steps = root, scripts or {}, run_s, steps
        self.resumed_from = resumed_from
        self.logged = {}

    def __call__(self, plane, pod, ran):
        meta = pod["metadata"]
        attempt, index = int(meta["labels"]["trainops/attempt"]), int(meta["annotations"][COMPLETION_INDEX])
        script = self.scripts.get(attempt, "complete")
        step = min(self.steps, int(ran * self.steps / self.run_s))
        if index == 0 and step // 10 > self.logged.get(meta["name"], -1):
            self.logged[meta["name"]] = step // 10
            plane.write_log(meta["name"], f"step {step} loss {2.5 - step / 100:.3f}")
        if script == "preempt" and ran >= 10 and index == 1:
            trainer_writes(
                self.root, attempt, "preempted", signal="SIGTERM", last_step=50, checkpoint_step=50
            )
            plane.preempt(pod)
        if script == "fail" and ran >= 5 and index == 0:
            plane.write_log(
                meta["name"],
                "Traceback (most recent call last):",
                "FloatingPointError: loss is nan at step 12",
            )
            trainer_writes(
                self.root,
                attempt,
                "failed",
                error="FloatingPointError: loss is nan at step 12",
                hint="lower train.lr or enable gradient clipping",
            )
            return 1
        if script == "complete" and ran >= self.run_s:
            if index == 0:
                resumed = (
                    {"resumed_from_step": self.resumed_from} if attempt > 1 and self.resumed_from else {}
                )
                trainer_writes(
                    self.root,
                    attempt,
                    "completed",
                    last_step=self.steps,
                    checkpoint_step=self.steps,
                    **resumed,
                )
            return 0
        return None


@pytest.fixture
def plane(monkeypatch):
    simulated = ControlPlane(call_s=1.0)
    simulated.sigterm_exit_s = 5  # the trainer's emergency checkpoint, then exit
    for name in NODES:
        simulated.add_node(name, recorded=load("node-gke-spot-a2"))
    monkeypatch.setattr(
        trainops.cluster,
        "get_cluster",
        lambda name, **options: KubernetesCluster(
            hook=simulated, clock=simulated.clock, sleep=simulated.sleep, **options
        ),
    )
    return simulated


@pytest.fixture
def context():
    return {"ti": SimpleNamespace(dag_id="retrain", run_id=RUN_ID, task_id="train", map_index=-1)}


def operator(root, **kw):
    options = {"job_options": {"spot_flavour": "gke"}, "max_preemptions": 3, **kw}
    data_uri = staged_dataset(f"{root.rsplit('/', 1)[0]}/data/datasets/demo/abc")  # beside the root
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": data_uri},
        storage_root=root,
        cluster="kubernetes",
        namespace="ml",
        nodes=2,
        poll_interval=0.01,
        trainer_config={"train.max_steps": 100},
        **options,
    )


def layout_of(root):
    return RunLayout(run_prefix(root, "retrain", RUN_ID, "train"))


def job_json(root):
    return open_storage(root).get_json(layout_of(root).job)


def first_event(trigger):
    async def take():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(take(), timeout=60))


def trainer_writes(root, attempt, outcome, **kw):
    record = attempt_record(
        attempt=attempt, outcome=outcome, world_size=2, **{"last_step": 50, "checkpoint_step": 50, **kw}
    )
    open_storage(root).put_json(layout_of(root).attempt(attempt), record)


def quick(trigger, **kw):
    """The same trigger, polling every 10 ms (and ``kw``): simulated time moves per call."""
    return type(trigger)(**{**trigger.serialize()[1], "poll_interval": 0.01, **kw})


def next_attempt(op, context, event, *, skip_back_off=False):
    """execute_complete deletes the attempt; JobGoneTrigger waits for its pods; relaunch."""
    with pytest.raises(TaskDeferred) as gone_wait:
        op.execute_complete(context, event)
    trigger = gone_wait.value.trigger
    extra = {"not_before": time.time()} if skip_back_off else {}  # the back-off is tested elsewhere
    with pytest.raises(TaskDeferred) as relaunched:
        op.relaunch_when_gone(context, first_event(quick(trigger, **extra)))
    return relaunched.value


def test_preempted_gang_is_deleted_whole_then_relaunched_and_resumes(
    file_root, plane, context, caplog, capsys
):
    plane.program = Trainer(file_root, {1: "preempt"}, resumed_from=50)
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    first = deferred.value.trigger.handle["job_id"]
    pod = plane.pod(first, 0)["spec"]["containers"][0]
    assert "torch.distributed.run" in pod["command"] and pod["name"] == "trainer"  # rendered, not recorded
    caplog.set_level("INFO")
    event = first_event(deferred.value.trigger)
    logged = caplog.text + capsys.readouterr().out
    assert "[node-0] step 0 loss 2.500" in logged
    assert f"job {first} is failed (PodFailurePolicy" in logged and "DisruptionTarget" in logged

    second = next_attempt(op, context, event)
    assert not plane.pods(first) and plane.jobs() == [second.trigger.handle["job_id"]]
    assert second.trigger.handle["job_id"].endswith("-a2")

    result = op.execute_complete(context, first_event(second.trigger))
    assert (result["steps"], result["attempts"], result["preemptions"], result["steps_lost"]) == (
        100,
        2,
        1,
        0,
    )
    record = job_json(file_root)
    assert [a["classification"] for a in record["attempts"]] == ["preempted", "succeeded"]
    assert [m["kind"] for m in record["attempts"][0]["manifests"]] == ["Service", "Job"]
    assert plane.deletions(live_jobs_only=True) == []  # the failed Job was deleted, no live one


def test_preemption_storm_exhausts_the_budget(file_root, plane, context):
    plane.program = Trainer(file_root, {1: "preempt", 2: "preempt"})
    op = operator(file_root, max_preemptions=1)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    deferred = next_attempt(op, context, first_event(deferred.value.trigger))
    with pytest.raises(RuntimeError, match="preempted 2 times, over the budget of 1"):
        op.execute_complete(context, first_event(deferred.trigger))
    record = job_json(file_root)
    assert (record["status"], record["preemptions"], len(record["attempts"])) == ("failed", 2, 2)


def required_terms(plane, job_name):
    pod_spec = plane.job(job_name)["spec"]["template"]["spec"]
    return pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


def test_spot_then_on_demand_after_preemptions(file_root, plane, context):
    plane.program = Trainer(file_root, {1: "preempt"})
    op = operator(file_root, capacity="spot-then-on-demand", fallback_after=1, unschedulable_timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    first = plane.jobs()[0]
    assert "cloud.google.com/gke-spot" in json.dumps(required_terms(plane, first))
    second = next_attempt(op, context, first_event(deferred.value.trigger)).trigger.handle["job_id"]
    terms = json.dumps(required_terms(plane, second))
    assert '"operator": "DoesNotExist"' in terms and '"values": ["true"]' not in terms  # no spot node
    assert job_json(file_root)["capacity"] == "on-demand"


def test_spot_then_on_demand_when_spot_never_comes(file_root, plane, context):
    for name in NODES:
        plane.set_ready(name, False)  # no node takes the pods: Unschedulable
    op = operator(file_root, capacity="spot-then-on-demand", unschedulable_timeout=60, max_infra_retries=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    started = plane.now
    event = first_event(deferred.value.trigger)
    assert event["state"]["unschedulable"] is True and 60 < plane.now - started < 90  # simulated s
    relaunched = next_attempt(op, context, event)  # at once, and no infra retry spent
    assert relaunched.trigger.handle["labels"]["trainops/attempt"] == "2"
    record = job_json(file_root)
    assert (record["capacity"], record["infra_failures"]) == ("on-demand", 0)


def test_image_pull_failure_is_retried_after_a_back_off_then_succeeds(file_root, plane, context):
    plane.image_error, plane.program = "ImagePullBackOff", Trainer(file_root)
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    with pytest.raises(TaskDeferred) as back_off:
        op.execute_complete(context, first_event(deferred.value.trigger))
    assert 25 < back_off.value.trigger.serialize()[1]["not_before"] - time.time() <= 30
    plane.tick(1)
    assert plane.jobs() == [] and plane.pods() == []  # deleted at once (never ran: nothing to stop)
    plane.image_error = None  # the registry is back
    with pytest.raises(TaskDeferred) as relaunched:
        op.relaunch_when_gone(context, first_event(quick(back_off.value.trigger, not_before=time.time())))
    result = op.execute_complete(context, first_event(relaunched.value.trigger))
    assert (result["attempts"], result["preemptions"]) == (2, 0)
    assert [a["classification"] for a in job_json(file_root)["attempts"]] == ["infra", "succeeded"]


def test_an_error_fails_with_the_trainers_hint_and_the_pods_last_lines(file_root, plane, context):
    plane.program = Trainer(file_root, {1: "fail"})
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    event = first_event(deferred.value.trigger)
    assert "failed with exit code 1 matching FailJob rule at index 1" in event["state"]["reason"]
    with pytest.raises(RuntimeError) as failure:
        op.execute_complete(context, event)
    message = str(failure.value)
    assert "lower train.lr or enable gradient clipping" in message
    assert "[node-0] FloatingPointError: loss is nan at step 12" in message
    job = job_json(file_root)
    assert job["status"] == "failed" and len(job["attempts"]) == 1  # no relaunch
    # recorded first (with the pods' last lines), then cleaned up: nothing is left running
    assert "FloatingPointError: loss is nan at step 12" in job["attempts"][0]["logs_tail"]
    assert plane.jobs() == [] and plane.pods() == []


def test_rerun_reattaches_restart_deletes_nothing_and_kill_deletes_everything(file_root, plane, context):
    plane.program = Trainer(file_root, run_s=10_000)
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    name = deferred.value.trigger.handle["job_id"]
    with pytest.raises(TaskDeferred) as again:  # a re-run task (new worker) finds the live job
        operator(file_root).execute(context)
    assert again.value.trigger.handle["job_id"] == name and plane.jobs() == [name]
    assert [c.resource for c in plane.calls if c.verb == "create"] == ["services", "jobs"]

    trigger = deferred.value.trigger

    async def restart_then_kill():
        polling = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.1)
        polling.cancel()  # the triggerer restarts: cancels and cleans up its triggers
        await trigger.cleanup()
        alive = sorted({c.resource for c in plane.calls if c.verb == "delete"})
        await trigger.on_kill()  # a user marks the task failed
        return alive

    assert asyncio.run(restart_then_kill()) == []
    assert {p["status"]["phase"] for p in plane.pods(name)} == {"Running"}
    job = plane.job(name)  # Foreground: the Job stays, Terminating, until its pods are gone
    assert job["metadata"]["deletionTimestamp"] and job["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert all(p["metadata"].get("deletionTimestamp") for p in plane.pods(name))
    plane.tick(6)  # the trainers' emergency checkpoint (5 s), then exit
    assert plane.objects == {}  # the Job, its pods and the Service


SKEW_S = 3 * 3600.0  # the trainer's clock runs 3 hours ahead of the API server's


def test_a_reclaimed_node_run_is_billed_for_the_time_its_pods_held_nodes(
    file_root, plane, context, caplog, capsys
):
    """The reclaimed-node scenario, replayed with a trainer that stamps its attempt records and
    metrics on a clock 3 hours ahead of the API server's: attempt 1 trains steps 1..60 (a step
    a second; checkpoint at 50) until node 1's VM vanishes; attempt 2 resumes at 50 and trains
    to 100. The bill comes from the cluster's own times: within 10% of the node time the pods
    held (the cloud's bill; under it by the survivor's shutdown after the loss was seen, never
    over), at the price the operator's table gives; the goodput is the kept steps' share of
    it; the disagreeing clock is logged and recorded, naming both times."""
    store, layout = open_storage(file_root), layout_of(file_root)
    began, parts = {}, {}  # per attempt: the trainer's start, the metrics parts it wrote

    def trainer_now():
        return plane.now + SKEW_S

    def stamp(t):
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")

    def step(attempt, number):  # one step's metrics, as the trainer writes a part
        parts[attempt] = parts.get(attempt, 0) + 1
        record = {"step": number, "attempt": attempt, "loss": 2.5, "lr": 3e-4, "time": trainer_now()}
        store.put(layout.metrics_part(attempt, parts[attempt]), (json.dumps(record) + "\n").encode())

    def write_record(attempt, outcome, last_step, checkpoint_step, **times):
        record = attempt_record(
            attempt=attempt,
            outcome=outcome,
            last_step=last_step,
            checkpoint_step=checkpoint_step,
            world_size=2,
            started_at=stamp(began[attempt]),
            ended_at=stamp(trainer_now()),
            first_step_time=began[attempt],
            **times,
        )
        store.put_json(layout.attempt(attempt), record)

    lost = []

    def program(plane, pod, ran):
        meta = pod["metadata"]
        attempt, index = int(meta["labels"]["trainops/attempt"]), int(meta["annotations"][COMPLETION_INDEX])
        first, last = (1, 60) if attempt == 1 else (51, 100)
        if index == 0:
            began.setdefault(attempt, trainer_now())
            while parts.get(attempt, 0) < min(int(ran), last - first + 1):
                step(attempt, first + parts.get(attempt, 0))
        if attempt == 1 and index == 0 and ran >= 60:  # node 1's VM is reclaimed
            node = plane.pod(meta["labels"]["job-name"], 1)["spec"]["nodeName"]
            if node in plane.nodes and plane.ready(node):
                plane.set_ready(node, False)
                lost.append(plane.now)
            elif node in plane.nodes and plane.now - lost[0] >= 30:
                plane.remove_node(node)
        if attempt == 2 and ran >= 51:
            if index == 0:
                write_record(2, "completed", last_step=100, checkpoint_step=100, resumed_from_step=50)
            return 0
        return None

    plane.program = program
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    event = first_event(deferred.value.trigger)
    assert event["state"]["phase"] == "lost"
    # rank 0's emergency checkpoint fails without node 1: steps 51..60 are lost
    write_record(
        1, "preempted", last_step=60, checkpoint_step=50, signal="SIGTERM", signal_time=trainer_now()
    )
    second = next_attempt(op, context, event)
    caplog.set_level("INFO")
    result = op.execute_complete(context, first_event(second.trigger))
    assert (result["steps"], result["attempts"], result["preemptions"]) == (100, 2, 1)

    cost = job_json(file_root)["cost"]
    table, _ = load_prices(None, None)  # what the operator prices with, given no override
    per_node_hour = price_of(table, "a2-highgpu-8g", "spot")["per_gpu_hour"]  # CPU nodes: 1 each
    held_s = plane.node_seconds()
    print(f"\nbilled {cost['billed_gpu_hours'] * 3600:.0f} node-s, held {held_s:.0f} simulated node-s")
    assert cost["billed_gpu_hours"] * 3600 == pytest.approx(held_s, rel=0.10)
    assert cost["billed_gpu_hours"] * 3600 <= held_s
    assert cost["cost"] == pytest.approx(held_s / 3600 * per_node_hour, rel=0.10)
    productive_s = (50 + 50) * 2  # steps 1..50 and 51..100, a second each, on 2 nodes
    assert cost["goodput"] == pytest.approx(productive_s / held_s, abs=0.05)
    assert [a["seconds"]["replayed"] for a in cost["attempts"]] == pytest.approx([10, 0], abs=0.5)
    warned = [w for w in cost["warnings"] if w.startswith("attempt 1: the trainer's clock disagrees")]
    assert warned and "(ahead by 3h00m" in warned[0]
    assert f"the trainer says it started at {stamp(began[1])}".replace("+00:00", "Z") in warned[0]
    assert "attempt 1: no pod end time recorded (a pod gone with its node" in " ".join(cost["notes"])
    logged = caplog.text + capsys.readouterr().out
    for n in (1, 2):
        assert (
            f"cost estimate: attempt {n}: the trainer's clock disagrees with the cluster's (ahead by 3h"
            in logged
        )


# What the API throws at a run, by call: 100 faults in all, each kind spread over the run by a
# seeded draw (so the same calls fail at every run of the test) and capped, so all 100 land.
BLIPS = [
    {"verb": "get", "resource": "jobs", "status": 503, "probability": 0.3, "times": 20},
    {"verb": "list", "resource": "pods", "status": 500, "probability": 0.1, "times": 15},
    {"verb": "list", "resource": "pods", "status": 504, "probability": 0.1, "times": 10},
    {"verb": "list", "resource": "pods", "timeout": True, "probability": 0.05, "times": 5},
    {"verb": "get", "resource": "pods/log", "reset": True, "probability": 0.2, "times": 20},
    {"verb": "get", "resource": "nodes", "status": 429, "retry_after": 2, "probability": 0.1, "times": 12},
    {"verb": "get", "resource": "nodes", "reset": True, "probability": 0.05, "times": 8},
    {"verb": "list", "resource": "jobs", "status": 503, "times": 2},  # the launch's reattach check
    {"verb": "create", "resource": "services", "status": 503, "times": 3},
    {"verb": "create", "resource": "services", "status": 500, "lost_reply": True, "times": 1},
    {"verb": "create", "resource": "jobs", "status": 429, "retry_after": 1, "times": 4},
]


def test_a_hundred_api_blips_over_a_run_kill_nothing_and_the_run_succeeds(file_root, plane, context, caplog):
    """The done criterion of #13: 100 transient API faults (5xx, 429, resets, timeouts, a reply
    lost after the server acted) spread over one run: it succeeds on its first attempt, and no
    read error deleted anything. The backend's retries alone ride them out (no trigger-level
    outage tolerance needed). Simulated time: the run lasts 15 simulated minutes."""
    for seed, blip in enumerate(BLIPS):
        plane.inject(seed=seed, **blip)
    plane.program = Trainer(file_root, run_s=900)
    caplog.set_level("WARNING", logger="trainops.cluster.kubernetes.api_retry")
    started = plane.now

    result = operator(file_root, deferrable=False).execute(context)

    assert (result["steps"], result["attempts"], result["preemptions"]) == (100, 1, 0)
    assert [f.hits for f in plane.faults] == [b["times"] for b in BLIPS]  # every fault landed
    injected = plane.faults_injected()
    retried = caplog.text.count("kubernetes API: ")
    deletions = plane.deletions()
    landed = [c.t - started for c in plane.calls if c.fault]
    print(
        f"\n{injected} API faults from {landed[0]:.0f} s to {landed[-1]:.0f} s of a run of "
        f"{plane.now - started:.0f} simulated s, {retried} retries, {len(deletions)} deletions "
        f"({len(plane.deletions(live_jobs_only=True))} of a live job)"
    )
    assert landed[-1] - landed[0] > 300  # spread over the run, not one burst
    assert injected == 100 and retried == 100  # each fault retried once, each retry logged once
    counts = [int(n) for n in re.findall(r"\((\d+) API retries so far\)", caplog.text)]
    # a running count per client: the operator's (launch) and the trigger's (the watching)
    assert sorted(counts) == sorted([*range(1, counts.index(1, 1) + 1), *range(1, 101 - counts.index(1, 1))])
    assert plane.deletions(live_jobs_only=True) == []
    assert [c.resource for c in plane.calls if c.verb == "create" and c.acted] == ["services", "jobs"]
    assert job_json(file_root)["attempts"][0]["classification"] == "succeeded"


def test_a_lost_create_reply_reattaches_to_the_job_it_created(file_root, plane, context):
    """The Job is created, the reply is lost, the retry answers 409: the backend raises
    JobAlreadyExists and the operator watches that Job; it never creates a second one."""
    plane.inject("create", "jobs", status=504, lost_reply=True, times=1)
    plane.program = Trainer(file_root)
    result = operator(file_root, deferrable=False).execute(context)
    assert result["attempts"] == 1
    assert [c.resource for c in plane.calls if c.verb == "create" and c.acted] == ["services", "jobs"]
    assert plane.deletions(live_jobs_only=True) == []  # only the finished job's clean-up
    assert plane.jobs() == []


def test_a_reclaimed_node_is_lost_and_the_next_gang_starts_only_once_the_old_pods_are_gone(
    file_root, plane, context
):
    """A spot VM vanishes under node 1: its kubelet goes silent (NotReady), then the Node is
    deleted. The attempt is lost (a preemption); its pods are deleted, the one on the gone node
    stays listed until the pod garbage collector takes it, and only then does attempt 2 start."""
    overlaps = []
    trainer = Trainer(file_root, resumed_from=50)

    def program(plane, pod, ran):
        meta = pod["metadata"]
        attempt, index = int(meta["labels"]["trainops/attempt"]), int(meta["annotations"][COMPLETION_INDEX])
        if attempt == 2:  # is any pod of attempt 1 still there?
            overlaps.extend(
                p["metadata"]["name"]
                for p in plane.pods()
                if p["metadata"]["labels"]["trainops/attempt"] == "1"
            )
        if attempt == 1 and index == 0 and ran >= 10:
            node = plane.pod(meta["labels"]["job-name"], 1)["spec"]["nodeName"]
            if node in plane.nodes and plane.ready(node):
                plane.set_ready(node, False)
                lost.append((node, plane.now))
            elif node in plane.nodes and plane.now - lost[0][1] >= 30:
                plane.remove_node(node)  # the cloud deleted the VM; the Node goes with it
                lost.append((node, plane.now))
            return None
        return trainer(plane, pod, ran)

    lost = []
    plane.program = program
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    first = deferred.value.trigger.handle["job_id"]
    event = first_event(deferred.value.trigger)
    assert event["state"]["phase"] == "lost" and "no longer exists" in event["state"]["reason"]
    trainer_writes(file_root, 1, "preempted", signal="SIGTERM")  # rank 0's emergency checkpoint
    second = next_attempt(op, context, event)
    relaunched_at = next(
        c.t for c in plane.calls if c.verb == "create" and c.name == second.trigger.handle["job_id"]
    )
    assert relaunched_at >= lost[1][1] + plane.podgc_s  # it waited for the pod garbage collector
    result = op.execute_complete(context, first_event(second.trigger))
    assert (result["attempts"], result["preemptions"]) == (2, 1)
    assert overlaps == []  # never two gangs at once
    assert [c.name for c in plane.deletions(live_jobs_only=True)] == [first]  # the lost one only
