"""The dry run shows what the training task would launch as attempt 1, and launches nothing."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import yaml
from airflow.sdk.exceptions import TaskDeferred

from tests.trainops.cluster.credential_cases import CREDENTIALS
from tests.trainops.cluster.fake_backend import use_fake_cluster
from tests.trainops.operators.helpers import staged_dataset
from trainer.config import dump_yaml
from trainer.contract import RunLayout, join, run_prefix
from trainer.storage import open_storage
from trainops.cost.estimate import estimate_lines
from trainops.operators import FSDPTrainingOperator
from trainops.operators.launch_plan import checked_run_config
from trainops.recipes import form
from trainops.recipes.dry_run import dry_run_report

RUN_ID = "manual__2026-01-01T00:00:00+00:00"
JOB_OPTIONS = {
    "kind": "pytorchjob",
    "scheduler": "kueue:gpu-queue",
    "env_from_secrets": ["s3-credentials"],
    "env": {"HF_HOME": "/cache"},
    "labels": {"team": "search"},
}


def plan(**settings):
    return form.plan_run(form.check_settings(settings, source="test"))


def train_task(run_plan, root, **kw):
    """The DAG's training task, as the pipeline builds it (the plan feeds its sizing fields)."""
    return FSDPTrainingOperator(
        task_id="train",
        dataset={"uri": staged_dataset(f"{root.rsplit('/', 1)[0]}/data/datasets/tickets/v1")},
        storage_root=root,
        nodes=run_plan["nodes"],
        gpus_per_node=run_plan["gpus_per_node"],
        capacity=run_plan["capacity"],
        max_preemptions=run_plan["max_preemptions"],
        trainer_config=run_plan["trainer_config"],
        **kw,
    )


def test_the_dry_run_job_spec_is_the_one_attempt_one_launches(file_root, monkeypatch):
    cluster = use_fake_cluster(monkeypatch)
    run_plan = plan(nodes=2, gpus_per_node=8, capacity="spot-then-on-demand", max_steps=500)
    train = train_task(
        run_plan,
        file_root,
        cluster="kubernetes",
        namespace="ml",
        image="registry.example.com/trainer:1.4",
        termination_grace_seconds=45,
        job_options=JOB_OPTIONS,
    )
    report = dry_run_report(run_plan, train, dag_id="retrain_manual", run_id=RUN_ID)
    assert cluster.launched == []  # the dry run launched nothing

    ti = SimpleNamespace(dag_id="retrain_manual", run_id=RUN_ID, task_id="train", map_index=-1)
    with pytest.raises(TaskDeferred):
        train.execute({"ti": ti})
    ((launched, _),) = cluster.launched
    # the same spec, except the disk, which the launch sizes from the staged dataset's manifest
    sized = ("cache_size", "ephemeral_storage")
    assert launched.cache_size is not None and report["disk"].startswith("sized at launch")
    assert report["job_spec"] == {
        k: v for k, v in launched.to_dict().items() if k not in sized
    } | dict.fromkeys(sized)
    spec = report["job_spec"]
    assert (spec["termination_grace_seconds"], spec["kind"], spec["scheduler"]) == (
        45,
        "pytorchjob",
        "kueue:gpu-queue",
    )
    assert spec["env"]["HF_HOME"] == "/cache" and spec["labels"]["team"] == "search"
    assert [m["kind"] for m in report["manifests"]] == ["PyTorchJob"]
    assert report["cluster"] == "kubernetes"


def test_the_dry_run_reports_the_resolved_config_and_manifests_and_writes_nothing(file_root, monkeypatch):
    cluster = use_fake_cluster(monkeypatch)
    run_plan = plan(nodes=2, gpus_per_node=8, max_steps=500, dataset_uri="s3://raw/tickets/2026-*/*.parquet")
    report = dry_run_report(run_plan, train_task(run_plan, file_root), dag_id="retrain_manual", run_id=RUN_ID)
    assert (report["cluster"], report["capacity"], report["max_preemptions"]) == ("local", "spot", 3)
    assert report["dataset_uri"] == "s3://raw/tickets/2026-*/*.parquet"
    config = report["trainer_config"]
    assert config["train"]["max_steps"] == 500 and "lr" in config["train"]  # the trainer's defaults too
    assert config["data_uri"].startswith(f"{file_root}/datasets/tickets/")
    assert report["job_spec"]["nodes"] == 2 and report["job_spec"]["gpus_per_node"] == 8
    job = next(m for m in report["manifests"] if m["kind"] == "Job")  # what kubernetes would get
    assert job["spec"]["completions"] == 2
    assert cluster.launched == [] and open_storage(file_root).list(file_root) == []


def test_the_dry_run_masks_literal_credentials_and_says_launch_would_refuse_them(
    file_root, monkeypatch, caplog
):
    use_fake_cluster(monkeypatch)
    caplog.set_level(logging.WARNING, logger="trainops.recipes.dry_run")
    env = {name: value for name, value, _ in CREDENTIALS}
    run_plan = plan(nodes=1, gpus_per_node=1, max_steps=10)
    train = train_task(run_plan, file_root, job_options={**JOB_OPTIONS, "env": {**JOB_OPTIONS["env"], **env}})

    report = dry_run_report(run_plan, train, dag_id="retrain_manual", run_id=RUN_ID)

    # what the DAG's dry run task prints, and returns as its XCom
    shown = json.dumps(report, default=str) + yaml.safe_dump_all(report["manifests"]) + caplog.text
    assert not [name for name, _, secret in CREDENTIALS if secret in shown]
    assert report["job_spec"]["env"] == {
        **dict.fromkeys(env, "***"),
        "HF_HOME": "/cache",
        "TRAINOPS_ATTEMPT": "1",
        "TRAINOPS_GPUS_PER_NODE": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    (job,) = report["manifests"]
    pod_env = {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    }
    assert pod_env["DB_PASS"] == "***" and pod_env["HF_HOME"] == "/cache"
    assert pod_env["TRAINOPS_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}  # the downward API
    refused = report["refused_at_launch"]
    assert refused.startswith("on cluster 'kubernetes'") and "env_from_secrets" in refused
    assert all(f"env {name!r}" in refused for name in env) and "HF_HOME" not in refused
    assert "would be refused at launch on cluster 'kubernetes'" in caplog.text


def test_launch_on_kubernetes_refuses_what_the_dry_run_masks_naming_each_variable():
    env = {name: value for name, value, _ in CREDENTIALS}
    with pytest.raises(ValueError) as refused:
        FSDPTrainingOperator(
            task_id="train",
            dataset="file:///data/datasets/tickets/v1",
            cluster="kubernetes",
            job_options={"env": env},
        )
    assert all(f"env {name!r}" in str(refused.value) for name in env)
    assert not [name for name, _, secret in CREDENTIALS if secret in str(refused.value)]


def test_a_dry_run_without_credentials_refuses_nothing(file_root, monkeypatch):
    use_fake_cluster(monkeypatch)
    run_plan = plan()
    report = dry_run_report(
        run_plan, train_task(run_plan, file_root, job_options=JOB_OPTIONS), dag_id="d", run_id="r"
    )
    assert report["refused_at_launch"] is None and report["job_spec"]["env"]["HF_HOME"] == "/cache"


def test_a_config_the_trainer_refuses_fails_the_dry_run_too(file_root):
    run_plan = {**plan(), "trainer_config": {"train": {"lrr": 0.1}}}
    with pytest.raises(ValueError, match=r"train\.lrr"):
        dry_run_report(run_plan, train_task(plan(), file_root), dag_id="d", run_id="r")


# ----------------------------------------------------------------------- the cost estimate

# The Variable trainops_prices over the shipped table: 1.50 and 4.00 USD per GPU-hour of a p4d.
PRICES_VARIABLE = json.dumps(
    {"p4d.24xlarge": {"spot": {"per_hour": 12.0, "gpus": 8}, "on-demand": {"per_hour": 32.0, "gpus": 8}}}
)


def steps(attempt, first, last, start, seconds):
    """Metrics records of steps ``first..last`` of ``attempt``, ``seconds`` apart from ``start``."""
    return [
        {"step": s, "attempt": attempt, "loss": 1.0, "time": start + (s - first + 1) * seconds}
        for s in range(first, last + 1)
    ]


def earlier_run(
    root,
    run_id,
    *,
    preset="tiny",
    step_s=2.0,
    ended="2026-11-30T00:00:00+00:00",
    dag_id="retrain_manual",
    task="train",
):
    """An earlier run's folder: config.yaml, job.json (1 node x 8 GPUs of p4d.24xlarge, preempted once
    after step 30 with its checkpoint at 20) and its metrics parts, every step ``step_s`` seconds."""
    storage = open_storage(root)
    run_uri = run_prefix(root, dag_id, run_id, task)
    user = {**plan()["trainer_config"], "model": {"preset": preset}}
    config = checked_run_config(user, run_uri=run_uri, data_uri=f"{root}/datasets/tickets/v0", world_size=8)
    storage.put(join(run_uri, "config.yaml"), dump_yaml(config).encode())
    node = {"index": 0, "node_name": "n0", "instance_type": "p4d.24xlarge", "capacity_type": "spot"}
    attempts = [
        {
            "attempt": n,
            "capacity": "spot",
            "nodes": 1,
            "gpus_per_node": 8,
            "args": [],
            "spec": {},
            "manifests": [],
            "launched_at": launched,
            "ended_at": end,
            "steps_lost": lost,
            "node_types": [node],
        }
        for n, launched, end, lost in (
            (1, "2026-11-29T23:00:00+00:00", "2026-11-29T23:30:00+00:00", 10),
            (2, "2026-11-29T23:31:00+00:00", ended, 0),
        )
    ]
    storage.put_json(
        join(run_uri, "job.json"),
        {
            "run_uri": run_uri,
            "config_uri": join(run_uri, "config.yaml"),
            "cluster": "kubernetes",
            "capacity": "spot",
            "preemptions": 1,
            "infra_failures": 0,
            "status": "succeeded",
            "attempts": attempts,
        },
    )
    layout = RunLayout(run_uri)
    for attempt, records in ((1, steps(1, 1, 30, 1000.0, step_s)), (2, steps(2, 21, 40, 2000.0, step_s))):
        storage.put(layout.metrics_part(attempt, 1), "".join(json.dumps(r) + "\n" for r in records).encode())
    return run_uri


def test_the_dry_run_estimates_from_the_last_run_of_the_same_dag_and_model(file_root, monkeypatch):
    use_fake_cluster(monkeypatch)
    last = earlier_run(file_root, "manual__3", step_s=2.0, ended="2026-11-30T00:00:00+00:00")
    earlier_run(file_root, "manual__1", step_s=9.0, ended="2026-11-01T00:00:00+00:00")  # older
    earlier_run(
        file_root, "manual__4", preset="small", step_s=7.0, ended="2026-11-30T06:00:00+00:00"
    )  # another model
    earlier_run(file_root, "manual__5", step_s=5.0, ended="2026-11-30T07:00:00+00:00", dag_id="other_dag")
    before = open_storage(file_root).list(file_root)
    run_plan = plan(nodes=1, gpus_per_node=8, max_steps=500)
    report = dry_run_report(
        run_plan,
        train_task(run_plan, file_root),
        dag_id="retrain_manual",
        run_id=RUN_ID,
        prices_variable=PRICES_VARIABLE,
    )
    estimate = report["estimate"]
    # kept steps 1..20 of attempt 1 and 21..40 of attempt 2, 2 s each: 500 steps x 2 s on 8 GPUs
    assert (estimate["step_s"], estimate["step_time_source"]) == (pytest.approx(2.0), "previous run")
    assert estimate["gpu_hours"] == pytest.approx(500 * 2.0 / 3600 * 8)  # 2.22
    assert estimate["spot_cost"] == pytest.approx(500 * 2.0 / 3600 * 8 * 1.5)  # 3.33
    assert estimate["on_demand_cost"] == pytest.approx(500 * 2.0 / 3600 * 8 * 4.0)  # 8.89
    assert estimate["instance_type"] == "p4d.24xlarge"  # what that run ran on
    assert estimate["assumptions"][:3] == [
        "instance type p4d.24xlarge: what the last run of this DAG and model ran on",
        "prices from the Variable trainops_prices + default table",
        f"step time measured over 38 kept steps of the last run of this DAG and model, {last}: 2 s/step on 8 accelerators",
    ]
    assert estimate_lines(estimate)[1:3] == [
        "  500 steps x 2 s/step (previous run) = 16.7 min on 8 accelerators (p4d.24xlarge), capacity spot = 2.22 GPU-hours",
        "  spot $3.33, on-demand $8.89: spot saves $5.56 (62%) if no preemption comes",
    ]
    assert open_storage(file_root).list(file_root) == before  # read, nothing written


def test_a_mapped_train_task_counts_as_an_earlier_run_and_other_tasks_do_not(file_root, monkeypatch):
    use_fake_cluster(monkeypatch)
    mapped = earlier_run(
        file_root, "manual__3", step_s=3.0, ended="2026-11-30T00:00:00+00:00", task="train.2"
    )
    earlier_run(
        file_root, "manual__4", step_s=7.0, ended="2026-11-30T06:00:00+00:00", task="trainer"
    )  # newer
    run_plan = plan(nodes=1, gpus_per_node=8, max_steps=500)
    report = dry_run_report(run_plan, train_task(run_plan, file_root), dag_id="retrain_manual", run_id=RUN_ID)
    estimate = report["estimate"]
    assert (estimate["step_s"], estimate["step_time_source"]) == (pytest.approx(3.0), "previous run")
    assert mapped in estimate["assumptions"][2]


def test_the_dry_run_estimates_from_flops_on_the_node_selectors_instance_type(file_root, monkeypatch):
    use_fake_cluster(monkeypatch)
    earlier_run(file_root, "manual__1", preset="small")  # another model: not measured from
    run_plan = plan(nodes=2, gpus_per_node=8, max_steps=500)
    train = train_task(
        run_plan,
        file_root,
        cluster="kubernetes",
        namespace="ml",
        image="registry.example.com/trainer:1.4",
        job_options={"node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
    )
    estimate = dry_run_report(run_plan, train, dag_id="retrain_manual", run_id=RUN_ID)["estimate"]
    assert (estimate["instance_type"], estimate["gpu"], estimate["step_time_source"]) == (
        "p5.48xlarge",
        "H100",
        "preset FLOPs",
    )
    # tiny at seq_len 64: 6 x 2,154,816 + 12 x 2 x 64 x 64 = 13,027,200 FLOPs per token;
    # 8 samples x 16 ranks x 64 tokens per step, at 40% of 16 H100s' 989 TFLOP/s
    assert estimate["step_s"] == pytest.approx(8 * 16 * 64 * 13_027_200 / (0.4 * 989e12 * 16))
    assert estimate["spot_price"]["known"] and estimate["assumptions"][0] == "prices from the default table"


def test_unreadable_earlier_runs_leave_the_flops_estimate_and_say_so(file_root, monkeypatch):
    from trainer.storage import StorageUnavailable
    from trainops.recipes import dry_run

    def down(*_a, **_k):
        raise StorageUnavailable("list s3://bucket/runs/retrain_manual: unreachable for 120 s")

    monkeypatch.setattr(dry_run, "last_run", down)
    run_plan = plan()
    estimate = dry_run_report(
        run_plan, train_task(run_plan, file_root), dag_id="retrain_manual", run_id=RUN_ID
    )["estimate"]
    assert estimate["step_time_source"] == "preset FLOPs"
    assert estimate["assumptions"][0].startswith(
        "the earlier runs of retrain_manual could not be read (list s3://"
    )


def test_a_broken_prices_variable_is_ignored_and_said(file_root, monkeypatch):
    use_fake_cluster(monkeypatch)
    run_plan = plan()
    report = dry_run_report(
        run_plan, train_task(run_plan, file_root), dag_id="d", run_id="r", prices_variable="{not json"
    )
    said = report["estimate"]["assumptions"]
    assert said[0].startswith("Variable trainops_prices ignored (Variable trainops_prices is not valid JSON")
    assert said[1] == "prices from the default table"


def test_an_earlier_run_with_more_metrics_than_the_cap_is_passed_over(file_root, monkeypatch):
    from trainops.recipes import dry_run

    use_fake_cluster(monkeypatch)
    earlier_run(file_root, "manual__1")
    monkeypatch.setattr(dry_run, "MAX_METRICS_BYTES", 100)  # its two parts hold more
    run_plan = plan()
    estimate = dry_run_report(
        run_plan, train_task(run_plan, file_root), dag_id="retrain_manual", run_id=RUN_ID
    )["estimate"]
    assert estimate["step_time_source"] == "preset FLOPs"


def test_the_dry_run_sizes_the_pods_from_the_gpus_and_the_preset_and_warns_when_it_cannot_fit(
    file_root, monkeypatch
):
    use_fake_cluster(monkeypatch)
    big = plan(nodes=4, gpus_per_node=8, model_preset="1b")
    report = dry_run_report(big, train_task(big, file_root), dag_id="retrain_manual", run_id=RUN_ID)
    # 1 CPU, 4Gi and 1Gi of shm before: 3 CPUs and 2Gi of shm per GPU, memory from the model's size
    assert (report["job_spec"]["cpu"], report["job_spec"]["memory"], report["job_spec"]["shm_size"]) == (
        "24",
        "85Gi",
        "16Gi",
    )
    assert report["sizing"]["warnings"] == []

    cpu_only = plan(nodes=1, gpus_per_node=0, model_preset="7b")
    report = dry_run_report(cpu_only, train_task(cpu_only, file_root), dag_id="retrain_manual", run_id=RUN_ID)
    assert [w["check"] for w in report["sizing"]["warnings"]] == ["cpu-only"]
