"""What every job-launching operator inherits: cluster options, one backend, defer-or-wait, the
task's identity and labels, and on_kill. Exercised through a minimal operator on the fake
cluster, so nothing here depends on what a particular operator launches."""

import re
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred

import trainops.cluster
from tests.trainops.cluster.fake_backend import FakeCluster, use_fake_cluster
from trainer.contract import safe_segment
from trainops.cluster.spec import JobSpec
from trainops.operators.base import (
    ClusterJobOperator,
    default_deferrable,
    job_labels,
    job_name,
    task_identity,
    wait_here,
)
from trainops.triggers.job import JobTrigger

RUN_ID = "manual__2026-01-01T00:00:00+00:00"


class EchoOperator(ClusterJobOperator):
    """Launches one job (or reattaches to its live one), waits, returns the event."""

    job_role_labels = {"trainops/role": "echo"}  # noqa: RUF012  (a test double)

    def execute(self, context):
        live = self.live_jobs(context)
        if live:
            return self.wait_for(context, live[0])
        labels = {**self.task_labels(context), "trainops/attempt": "1"}
        spec = JobSpec(name=job_name("echo", task_identity(context), 1), args=["echo"], labels=labels)
        return self.wait_for(context, self.backend.launch(spec), timeout=60)

    def execute_complete(self, context, event=None):
        return event


@pytest.fixture
def fake(monkeypatch):
    return use_fake_cluster(monkeypatch)


@pytest.fixture
def context():
    return {"ti": SimpleNamespace(dag_id="retrain", run_id=RUN_ID, task_id="echo", map_index=-1)}


def test_a_deferrable_task_defers_to_the_job_trigger_with_the_backends_options(fake, context):
    op = EchoOperator(
        task_id="echo", cluster="kubernetes", namespace="ml", kubernetes_conn_id="k8s_ml", poll_interval=2.5
    )
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    assert deferred.value.method_name == "execute_complete"
    trigger = deferred.value.trigger
    assert isinstance(trigger, JobTrigger)
    kwargs = trigger.serialize()[1]
    assert kwargs["cluster_options"] == {"kubernetes_conn_id": "k8s_ml", "namespace": "ml"}
    assert (kwargs["poll_interval"], kwargs["timeout"], kwargs["stream_logs"]) == (2.5, 60, True)
    assert kwargs["handle"]["job_id"] == fake.launched[0][0].name + "-x"


def test_a_task_that_is_not_deferrable_runs_the_same_trigger_in_the_worker(fake, context):
    fake.states[1] = {"phase": "succeeded", "reason": None, "nodes": [], "disruptions": []}
    event = EchoOperator(task_id="echo", deferrable=False, poll_interval=0.01).execute(context)
    assert (event["status"], event["state"]["phase"]) == ("finished", "succeeded")
    assert event["handle"]["job_id"].startswith("echo-") and len(fake.launched) == 1


def test_deferrable_follows_the_trainops_setting(monkeypatch):
    assert default_deferrable() is True and EchoOperator(task_id="e").deferrable is True
    monkeypatch.setenv("AIRFLOW__TRAINOPS__DEFAULT_DEFERRABLE", "false")
    assert EchoOperator(task_id="e").deferrable is False
    assert EchoOperator(task_id="e", deferrable=True).deferrable is True


def test_the_backend_is_built_once_on_first_use_never_at_parse(monkeypatch, context):
    built = []
    monkeypatch.setattr(
        trainops.cluster,
        "get_cluster",
        lambda name, **options: built.append((name, options)) or FakeCluster(),
    )
    op = EchoOperator(task_id="echo", cluster="kubernetes", namespace="ml")
    assert built == []  # DAG parsing builds no client
    with pytest.raises(TaskDeferred):
        op.execute(context)
    assert op.backend is op.backend
    assert built == [("kubernetes", {"kubernetes_conn_id": "kubernetes_default", "namespace": "ml"})]


def test_a_rerun_reattaches_to_the_live_job_it_finds_by_the_tasks_labels(fake, context, monkeypatch):
    live = {"cluster": "local", "job_id": "echo-live-a1", "job_dir": "/nowhere", "labels": {}}
    asked = []
    monkeypatch.setattr(fake, "find", lambda labels: asked.append(dict(labels)) or [live])
    with pytest.raises(TaskDeferred) as deferred:
        EchoOperator(task_id="echo").execute(context)
    assert deferred.value.trigger.handle["job_id"] == "echo-live-a1" and fake.launched == []
    assert asked == [
        {
            "trainops/dag": "retrain",
            "trainops/run": safe_segment(RUN_ID),
            "trainops/task": "echo",
            "trainops/map-index": "-1",
            "trainops/role": "echo",
        }
    ]


def test_killing_the_task_deletes_its_live_jobs_and_never_raises(fake, context, caplog, capsys):
    op = EchoOperator(task_id="echo")
    op.on_kill()  # nothing launched yet: nothing to delete
    assert fake.deleted == []
    with pytest.raises(TaskDeferred):
        op.execute(context)
    fake.live = [
        {"cluster": "local", "job_id": "echo-a1", "labels": {}},
        {"cluster": "local", "job_id": "echo-a2", "labels": {}},
    ]
    op.on_kill()
    assert fake.deleted == ["echo-a1", "echo-a2"]

    def unreachable(handle):
        raise ConnectionError("API server unreachable")

    fake.delete = unreachable
    op.on_kill()  # logged, not raised: the task is being killed anyway
    assert "could not delete the task's jobs" in caplog.text + capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cluster": "slurm"}, r"cluster must be one of \('local', 'kubernetes'\), got 'slurm'"),
        ({"job_options": {"schedular": "volcano"}}, "unknown field 'schedular'"),
    ],
)
def test_bad_settings_fail_at_parse_before_the_task_joins_the_dag(kwargs, message):
    with DAG("base_parse_probe", schedule=None) as dag, pytest.raises(ValueError, match=message):
        EchoOperator(task_id="echo", **kwargs)
    assert dag.task_ids == []


def test_identity_labels_and_names_find_the_task_again():
    ti = SimpleNamespace(dag_id="retrain", run_id=RUN_ID, task_id="train", map_index=None)
    identity = task_identity({"ti": ti})
    assert identity == {"dag_id": "retrain", "run_id": RUN_ID, "task_id": "train", "map_index": -1}
    assert job_labels(identity)["trainops/run"] == safe_segment(RUN_ID)  # a label value
    name = job_name("train", identity, 3)
    assert name.startswith("train-") and name.endswith("-a3") and len(name) == len("train-0a1b2c3d-a3")
    assert job_name("train", identity, 3) == name  # the same task finds the same name again
    assert job_name("train", {**identity, "map_index": 2}, 3) != name  # each mapped task its own


def test_waiting_here_returns_the_triggers_first_event_and_refuses_a_silent_one():
    class Trigger:
        settle_s = 20.0

        def __init__(self, payloads):
            self.payloads = payloads

        async def run(self):
            for payload in self.payloads:
                yield SimpleNamespace(payload=payload)

    trigger = Trigger([{"status": "gone", "handle": {}}, {"status": "never seen"}])
    assert wait_here(trigger) == {"status": "gone", "handle": {}}
    assert trigger.settle_s == 0.0  # no scheduler to race in the worker
    with pytest.raises(RuntimeError, match="Trigger ended without an event"):
        wait_here(Trigger([]))


@pytest.mark.parametrize("bad", [-1, 0, "5", None, float("inf")])
def test_a_poll_interval_that_would_poll_without_pause_is_refused_at_parse(bad):
    """-1 made 14,797 status calls in 3.3 s: every job-launching operator refuses it."""
    with pytest.raises(
        ValueError, match=rf"^poll_interval must be a positive number of seconds, got {re.escape(repr(bad))}"
    ):
        EchoOperator(task_id="echo", poll_interval=bad)


def test_every_trigger_gets_the_outage_tolerance_and_the_tries_deadline(fake, context):
    from datetime import UTC, datetime, timedelta

    started = datetime(2026, 1, 1, tzinfo=UTC)
    ctx = {"ti": SimpleNamespace(**vars(context["ti"]), start_date=started)}
    op = EchoOperator(task_id="echo", api_outage_tolerance=120, execution_timeout=timedelta(minutes=5))
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    kwargs = deferred.value.trigger.serialize()[1]
    assert kwargs["api_outage_tolerance"] == 120
    assert kwargs["deadline"] == started.timestamp() + 300
    assert deferred.value.timeout == timedelta(seconds=1)  # long past: Airflow's backstop at once
    with pytest.raises(TaskDeferred) as untimed:
        EchoOperator(task_id="echo").execute(context)
    assert untimed.value.trigger.deadline is None and untimed.value.timeout is None


def test_a_deadline_an_operator_does_not_handle_deletes_its_job_and_fails(fake, context):
    event = {"status": "deadline", "handle": {"cluster": "local", "job_id": "echo-1"}, "deadline": 1.0,
             "message": "the task's execution_timeout ends at X"}  # fmt: skip
    with pytest.raises(RuntimeError, match="execution_timeout ends at X; the job was deleted"):
        EchoOperator(task_id="echo").resume_execution("execute_complete", {"event": event}, context)
    assert fake.deleted == ["echo-1"]


@pytest.mark.parametrize("bad", [0, -1, "600", float("inf")])
def test_an_outage_tolerance_that_is_not_a_positive_number_is_refused_at_parse(bad):
    with pytest.raises(ValueError, match="api_outage_tolerance must be a positive number of seconds"):
        EchoOperator(task_id="echo", api_outage_tolerance=bad)
