"""The dry run shows what the training task would launch as attempt 1, and launches nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred

from tests.trainops.cluster.fake_backend import use_fake_cluster
from tests.trainops.operators.helpers import staged_dataset
from trainer.storage import open_storage
from trainops.operators import FSDPTrainingOperator
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


def test_a_config_the_trainer_refuses_fails_the_dry_run_too(file_root):
    run_plan = {**plan(), "trainer_config": {"train": {"lrr": 0.1}}}
    with pytest.raises(ValueError, match=r"train\.lrr"):
        dry_run_report(run_plan, train_task(plan(), file_root), dag_id="d", run_id="r")
