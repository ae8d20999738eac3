"""The wait / decide / relaunch loop on the Kubernetes backend, end to end at the hook boundary.

FSDPTrainingOperator, its triggers (run for real, in this process) and KubernetesCluster are
the production code; ``FakeKubernetes`` stands in for the API server, and ``play`` for the
cluster: it gives the Job the operator created the pods and status of recorded, real-world
objects (tests/data/k8s), as the job controller and kubelets would. The test writes the
trainer's attempt records, as the trainer would.
"""

import asyncio
import json
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred

import trainops.cluster
from tests.trainops.cluster.kubernetes.fake_k8s import DATA, RECORDED, T0, FakeKubernetes
from tests.trainops.operators.helpers import staged_dataset
from trainer.contract import RunLayout, attempt_record, run_prefix
from trainer.storage import open_storage
from trainops.cluster.kubernetes.backend import KubernetesCluster
from trainops.operators import FSDPTrainingOperator

RUN_ID = "scheduled__2026-01-01T00:00:00+00:00"


@pytest.fixture
def api(monkeypatch):
    fake = FakeKubernetes()
    monkeypatch.setattr(
        trainops.cluster, "get_cluster", lambda name, **options: KubernetesCluster(hook=fake, **options)
    )
    return fake


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

    return asyncio.run(asyncio.wait_for(take(), timeout=30))


def jobs(api):
    return sorted(name for kind, _, name in api.objects if kind == "Job")


def play(api, pods, job_status=None):
    """The newest Job gets one pod per recorded pod (index = position) and, when given, the
    recorded Job's status."""
    job = api.objects[("Job", "ml", jobs(api)[-1])]
    name = job["metadata"]["name"]
    for index, recorded in enumerate(pods):
        pod = json.loads((DATA / f"{recorded}.json").read_text().replace(RECORDED, name))
        meta = pod["metadata"]
        meta["name"] = f"{name}-{index}-p{index}q7z"
        meta["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
        meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = str(index)
        if pod["spec"].get("nodeName"):  # a node that exists (a vanished one means "lost")
            api.nodes.add(pod["spec"]["nodeName"])
        api.add(pod)
    if job_status:
        job["status"] = json.loads((DATA / f"{job_status}.json").read_text().replace(RECORDED, name))[
            "status"
        ]
    return name


def trainer_writes(root, attempt, outcome, **kw):
    record = attempt_record(
        attempt=attempt, outcome=outcome, world_size=2, **{"last_step": 50, "checkpoint_step": 50, **kw}
    )
    open_storage(root).put_json(layout_of(root).attempt(attempt), record)


def next_attempt(op, context, event, *, skip_back_off=False):
    """execute_complete deletes the attempt; JobGoneTrigger waits for its pods; relaunch."""
    with pytest.raises(TaskDeferred) as gone_wait:
        op.execute_complete(context, event)
    trigger = gone_wait.value.trigger
    if skip_back_off:  # the back-off is tested elsewhere; here it is cut short
        trigger = type(trigger)(**{**trigger.serialize()[1], "not_before": time.time()})
    with pytest.raises(TaskDeferred) as relaunched:
        op.relaunch_when_gone(context, first_event(trigger))
    return relaunched.value


def test_preempted_gang_is_deleted_whole_then_relaunched_and_resumes(file_root, api, context, caplog, capsys):
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    first = play(
        api, ["pod-running", "pod-disruption-preemption-by-scheduler"], "job-failed-podfailurepolicy"
    )
    api.write_log(f"{first}-0-p0q7z", "step 40 loss 2.131", "step 50 loss 2.094", at=T0 + 10)
    trainer_writes(file_root, 1, "preempted", signal="SIGTERM")
    caplog.set_level("INFO")
    event = first_event(deferred.value.trigger)
    logged = caplog.text + capsys.readouterr().out
    assert "[node-0] step 40 loss 2.131" in logged and "[node-0] step 50 loss 2.094" in logged
    assert "job train-" in logged and "is failed (PodFailurePolicy" in logged
    assert event["state"]["disruptions"][0]["reason"] == "PreemptionByScheduler"

    second = next_attempt(op, context, event)
    assert ("delete", "Job", first, "Foreground") in api.calls
    assert not [k for k in api.objects if k[0] == "Pod" and k[2].startswith(first)]
    assert second.trigger.handle["job_id"].endswith("-a2") and jobs(api) == [second.trigger.handle["job_id"]]

    play(api, ["pod-succeeded", "pod-succeeded"], "job-complete")
    trainer_writes(file_root, 2, "completed", last_step=100, checkpoint_step=100, resumed_from_step=50)
    result = op.execute_complete(context, first_event(second.trigger))
    assert (result["steps"], result["attempts"], result["preemptions"], result["steps_lost"]) == (
        100,
        2,
        1,
        0,
    )
    record = job_json(file_root)
    assert [a["classification"] for a in record["attempts"]] == ["preempted", "succeeded"]
    assert "preempting to accommodate a higher priority pod" in record["attempts"][0]["reason"]
    assert [m["kind"] for m in record["attempts"][0]["manifests"]] == ["Service", "Job"]


def test_preemption_storm_exhausts_the_budget(file_root, api, context):
    op = operator(file_root, max_preemptions=1)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    play(api, ["pod-running", "pod-gke-node-shutdown-terminated"], "job-failed-exitcode")
    trainer_writes(file_root, 1, "preempted", signal="SIGTERM")
    deferred = next_attempt(op, context, first_event(deferred.value.trigger))
    play(api, ["pod-disruption-taint-manager", "pod-running"], "job-failed-podfailurepolicy")
    with pytest.raises(RuntimeError, match="preempted 2 times, over the budget of 1"):
        op.execute_complete(context, first_event(deferred.trigger))  # no record: SIGKILLed
    record = job_json(file_root)
    assert (record["status"], record["preemptions"], len(record["attempts"])) == ("failed", 2, 2)


def required_terms(api, job_name):
    pod_spec = api.objects[("Job", "ml", job_name)]["spec"]["template"]["spec"]
    return pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


def test_spot_then_on_demand_after_preemptions(file_root, api, context):
    op = operator(file_root, capacity="spot-then-on-demand", fallback_after=1, unschedulable_timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    first = jobs(api)[0]
    assert "cloud.google.com/gke-spot" in json.dumps(required_terms(api, first))
    play(api, ["pod-running", "pod-disruption-preemption-by-scheduler"], "job-failed-podfailurepolicy")
    trainer_writes(file_root, 1, "preempted", signal="SIGTERM")
    second = next_attempt(op, context, first_event(deferred.value.trigger)).trigger.handle["job_id"]
    terms = json.dumps(required_terms(api, second))
    assert '"operator": "DoesNotExist"' in terms and '"values": ["true"]' not in terms  # no spot node
    assert job_json(file_root)["capacity"] == "on-demand"


def test_spot_then_on_demand_when_spot_never_comes(file_root, api, context):
    op = operator(file_root, capacity="spot-then-on-demand", unschedulable_timeout=60, max_infra_retries=0)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    play(api, ["pod-unschedulable", "pod-unschedulable"])  # pending since 2026-01-01
    event = first_event(deferred.value.trigger)
    assert event["state"]["unschedulable"] is True
    relaunched = next_attempt(op, context, event)  # at once, and no infra retry spent
    assert relaunched.trigger.handle["labels"]["trainops/attempt"] == "2"
    record = job_json(file_root)
    assert (record["capacity"], record["infra_failures"]) == ("on-demand", 0)


def test_image_pull_failure_is_retried_after_a_back_off_then_succeeds(file_root, api, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    play(api, ["pod-imagepullbackoff", "pod-imagepullbackoff"])
    with pytest.raises(TaskDeferred) as back_off:
        op.execute_complete(context, first_event(deferred.value.trigger))
    assert 25 < back_off.value.trigger.serialize()[1]["not_before"] - time.time() <= 30
    assert len(jobs(api)) == 0  # deleted at once; the next one waits out the back-off
    trigger = type(back_off.value.trigger)(
        **{**back_off.value.trigger.serialize()[1], "not_before": time.time()}
    )
    with pytest.raises(TaskDeferred) as relaunched:
        op.relaunch_when_gone(context, first_event(trigger))
    play(api, ["pod-succeeded", "pod-succeeded"], "job-complete")
    trainer_writes(file_root, 2, "completed", last_step=100, checkpoint_step=100)
    result = op.execute_complete(context, first_event(relaunched.value.trigger))
    assert (result["attempts"], result["preemptions"]) == (2, 0)
    assert [a["classification"] for a in job_json(file_root)["attempts"]] == ["infra", "succeeded"]


def test_an_error_fails_with_the_trainers_hint_and_the_pods_last_lines(file_root, api, context):
    op = operator(file_root)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    name = play(api, ["pod-error-exit1", "pod-running"], "job-failed-exitcode")
    api.write_log(
        f"{name}-0-p0q7z",
        "Traceback (most recent call last):",
        "FloatingPointError: loss is nan at step 12",
        at=T0 + 5,
    )
    trainer_writes(
        file_root,
        1,
        "failed",
        error="FloatingPointError: loss is nan at step 12",
        hint="lower train.lr or enable gradient clipping",
    )
    with pytest.raises(RuntimeError) as failure:
        op.execute_complete(context, first_event(deferred.value.trigger))
    message = str(failure.value)
    assert "lower train.lr or enable gradient clipping" in message
    assert "[node-0] FloatingPointError: loss is nan at step 12" in message
    assert len(jobs(api)) == 1 and job_json(file_root)["status"] == "failed"  # no relaunch


def test_rerun_reattaches_restart_deletes_nothing_and_kill_deletes_everything(file_root, api, context):
    with pytest.raises(TaskDeferred) as deferred:
        operator(file_root).execute(context)
    name = play(api, ["pod-running", "pod-running"])
    with pytest.raises(TaskDeferred) as again:  # a re-run task (new worker) finds the live job
        operator(file_root).execute(context)
    assert again.value.trigger.handle["job_id"] == name and jobs(api) == [name]
    assert [c[1] for c in api.calls if c[0] == "create"] == ["Service", "Job"]

    trigger = deferred.value.trigger

    async def restart_then_kill():
        polling = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.1)
        polling.cancel()  # the triggerer restarts: cancels and cleans up its triggers
        await trigger.cleanup()
        alive = sorted(k[0] for k in api.objects)
        await trigger.on_kill()  # a user marks the task failed
        return alive

    assert asyncio.run(restart_then_kill()) == ["Job", "Pod", "Pod", "Service"]
    assert api.objects == {}  # the Job (Foreground: its pods with it) and the Service
    assert ("delete", "Job", name, "Foreground") in api.calls
