"""The launch plan: the resolved trainer config and each attempt's JobSpec, built in one place."""

import pytest
import yaml

from trainops.operators.launch_plan import (
    LaunchSettings,
    checked_run_config,
    manifests_of,
    nest,
    one_process_job,
    run_config,
    sized,
    training_attempt,
)

IDENTITY = {"dag_id": "retrain", "run_id": "manual__1", "task_id": "train", "map_index": -1}
RUN_URI = "s3://lake/trainops/runs/retrain/manual__1/train"


def settings(**kw):
    return LaunchSettings(
        **{
            "nodes": 2,
            "gpus_per_node": 8,
            "image": "registry.example.com/trainer:1.4",
            "namespace": "ml",
            "termination_grace_seconds": 45,
            **kw,
        }
    )


def attempt(n=1, capacity="spot", **kw):
    return training_attempt(
        settings(**kw),
        identity=IDENTITY,
        run_uri=RUN_URI,
        attempt=n,
        capacity=capacity,
        storage_env={"AWS_ENDPOINT_URL_S3": "http://minio:9000"},
    )


def test_dotted_and_nested_trainer_settings_mean_the_same():
    assert nest({"train.lr": 0.1, "train": {"max_steps": 5}, "model": {"preset": "tiny"}}) == {
        "train": {"lr": 0.1, "max_steps": 5},
        "model": {"preset": "tiny"},
    }


def test_the_run_config_is_the_trainers_own_resolved_schema_with_the_derived_uris():
    config = yaml.safe_load(
        run_config({"train.max_steps": 7}, run_uri=RUN_URI, data_uri="s3://lake/datasets/d/v1", world_size=2)
    )
    assert (config["run_uri"], config["data_uri"], config["train"]["max_steps"]) == (
        RUN_URI,
        "s3://lake/datasets/d/v1",
        7,
    )
    assert "lr" in config["train"]  # the trainer's defaults are filled in


@pytest.mark.parametrize(
    "user, world_size, message",
    [
        ({"train": {"lrr": 0.1}}, 1, r"train\.lrr"),
        ({"run_uri": "s3://elsewhere"}, 1, "trainer_config must not set 'run_uri'"),
        ({"data_uri": "s3://elsewhere"}, 1, "trainer_config must not set 'data_uri'"),
        (
            {"train": {"micro_batch_size": 4, "global_batch_size": 12}},
            8,
            r"global_batch_size=12 is not a multiple of .* world size 8",
        ),
        ({"train.lr": float("nan")}, 1, "train.lr: expected a finite number, got nan"),
        ({"parallel.replicate": 3}, 4, r"parallel\.replicate=3 does not divide the world size 4"),
        (
            "{'train.lr': 0.1}",
            1,
            r"trainer_config must be a dict of trainer keys such as \{'train.lr': 0.001\}, got \"\{",
        ),
    ],
)
def test_a_config_the_trainer_would_refuse_fails_here(user, world_size, message):
    with pytest.raises(ValueError, match=message):
        run_config(user, run_uri=RUN_URI, data_uri="s3://d", world_size=world_size)


def test_without_a_world_size_everything_but_the_global_batch_is_checked():
    """While the sizing is templated, at DAG parse: the rest is checked all the same."""
    split = {"train": {"micro_batch_size": 4, "global_batch_size": 12}}
    config = checked_run_config(split, run_uri=RUN_URI, data_uri="s3://d", world_size=None)
    assert config.train.global_batch_size == 12
    with pytest.raises(ValueError, match=r"train\.lr: expected a finite number"):
        checked_run_config({"train.lr": float("inf")}, run_uri=RUN_URI, data_uri="s3://d", world_size=None)


def test_an_attempts_job_carries_its_number_the_tasks_labels_and_the_operators_settings():
    spec = attempt(2, capacity="on-demand").spec
    assert spec.name.startswith("train-") and spec.name.endswith("-a2")
    assert spec.args == ["python", "-m", "trainer", "train", "--config", f"{RUN_URI}/config.yaml"]
    assert (spec.nodes, spec.gpus_per_node, spec.distributed) == (2, 8, True)
    assert (spec.image, spec.namespace, spec.capacity, spec.termination_grace_seconds) == (
        "registry.example.com/trainer:1.4",
        "ml",
        "on-demand",
        45,
    )
    assert spec.env == {
        "AWS_ENDPOINT_URL_S3": "http://minio:9000",
        "TRAINOPS_ATTEMPT": "2",
        "TRAINOPS_GPUS_PER_NODE": "8",  # the trainer refuses to train on fewer (trainer.parallel)
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a stuck collective crashes the rank
    }
    assert attempt(1, gpus_per_node=0).spec.env["TRAINOPS_GPUS_PER_NODE"] == "0"
    assert spec.labels == {
        "trainops/dag": "retrain",
        "trainops/run": "manual__1",
        "trainops/task": "train",
        "trainops/map-index": "-1",
        "trainops/attempt": "2",
    }
    assert settings().world_size == 16 and settings(gpus_per_node=0).world_size == 2


def test_an_attempts_job_restarts_its_workers_in_place_as_the_operator_says():
    assert attempt(1).spec.restarts_in_place == 0  # LaunchSettings' own default: none
    assert attempt(1, restarts_in_place=2).spec.restarts_in_place == 2


def test_job_options_are_merged_with_what_the_operator_sets():
    spec = attempt(
        job_options={
            "kind": "pytorchjob",
            "scheduler": "kueue:gpu-queue",
            "env": {"HF_HOME": "/cache"},
            "labels": {"team": "search"},
        }
    ).spec
    assert (spec.kind, spec.scheduler) == ("pytorchjob", "kueue:gpu-queue")
    assert spec.env["HF_HOME"] == "/cache" and spec.env["TRAINOPS_ATTEMPT"] == "1"
    assert spec.labels["team"] == "search" and spec.labels["trainops/attempt"] == "1"
    with pytest.raises(ValueError, match=r"job_options labels sets \['trainops/attempt'\]"):
        attempt(job_options={"labels": {"trainops/attempt": "9"}})
    with pytest.raises(ValueError, match=r"job_options env sets \['TRAINOPS_GPUS_PER_NODE'\]"):
        attempt(job_options={"env": {"TRAINOPS_GPUS_PER_NODE": "0"}})  # gpus_per_node says it


def test_an_injected_preemption_goes_to_the_attempt_it_names_only():
    inject = {"node": 1, "at_step": 40}
    first = attempt(1, inject_preemption=inject).chaos
    assert first == {"node": 1, "at_step": 40, "attempt": 1, "metrics_uri": f"{RUN_URI}/metrics.jsonl"}
    assert attempt(2, inject_preemption=inject).chaos is None
    assert attempt(2, inject_preemption={**inject, "attempt": 2}).chaos["attempt"] == 2
    assert attempt(1).chaos is None
    # A templated value renders to a mapping or None (the demos' preempt param); anything else
    # is refused, naming it.
    with pytest.raises(ValueError, match=r"inject_preemption must be a mapping .* got 'node 1 at 40'"):
        attempt(1, inject_preemption="node 1 at 40")


def test_a_one_process_job_is_one_node_without_torchrun():
    spec = one_process_job(
        "eval",
        identity=IDENTITY,
        attempt=1,
        args=["python", "-m", "trainer", "evaluate"],
        labels={"trainops/task": "evaluate"},
        image="img",
        namespace="ml",
        capacity="spot",
        job_options={"cpu": "4"},
        storage_env={"AWS_REGION": "eu-west-1"},
        gpus_per_node=1,
    )
    assert (spec.nodes, spec.distributed, spec.gpus_per_node, spec.cpu) == (1, False, 1, "4")
    assert spec.name.startswith("eval-") and spec.name.endswith("-a1")
    assert spec.env == {"AWS_REGION": "eu-west-1", "TRAINOPS_GPUS_PER_NODE": "1"}
    assert spec.labels == {"trainops/task": "evaluate"}


def test_only_a_kubernetes_attempt_records_manifests():
    spec = attempt().spec
    assert manifests_of("local", spec) == []
    assert [m["kind"] for m in manifests_of("kubernetes", spec)] == ["Service", "Job"]


def test_the_nccl_watchdog_is_on_unless_the_user_set_it():
    from trainops.operators.launch_plan import watchdog_env

    assert watchdog_env({}) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert watchdog_env({"nccl_env": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}}) == {}
    assert watchdog_env({"env": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}}) == {}


def test_the_estimated_disk_is_used_and_job_options_override_it():
    disk = {"cache_size": "300Gi", "ephemeral_storage": "302Gi"}
    spec = attempt(disk=disk).spec
    assert (spec.cache_size, spec.ephemeral_storage) == ("300Gi", "302Gi")
    mine = attempt(disk=disk, job_options={"cache_size": "50Gi"}).spec
    assert (mine.cache_size, mine.ephemeral_storage) == ("50Gi", "302Gi")


def run_config_for(preset):
    return checked_run_config(
        {"model.preset": preset}, run_uri=RUN_URI, data_uri="s3://lake/d/v1", world_size=None
    )


def test_sized_settings_give_the_pods_cpu_memory_and_shm_from_the_gpus_and_the_model(caplog):
    caplog.set_level("INFO", logger="trainops.operators.launch_plan")
    spec = training_attempt(
        sized(settings(nodes=4, gpus_per_node=8), run_config_for("1b")),
        identity=IDENTITY,
        run_uri=RUN_URI,
        attempt=1,
        capacity="spot",
        storage_env={},
    ).spec
    assert (spec.cpu, spec.memory, spec.shm_size) == ("24", "85Gi", "16Gi")  # was 1, 4Gi, 1Gi
    assert "pod resources: cpu 24, memory 85Gi" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_job_options_override_the_derived_resources_and_the_log_says_so(caplog):
    caplog.set_level("INFO", logger="trainops.operators.launch_plan")
    launch = sized(settings(job_options={"memory": "500Gi"}), run_config_for("1b"))
    spec = training_attempt(
        launch, identity=IDENTITY, run_uri=RUN_URI, attempt=1, capacity="spot", storage_env={}
    ).spec
    assert (spec.cpu, spec.memory) == ("24", "500Gi")
    assert "(job_options override memory)" in caplog.text


def test_a_preset_that_cannot_fit_is_a_warning_in_the_log(caplog):
    sized(settings(nodes=1, gpus_per_node=0), run_config_for("7b"))
    sized(
        settings(
            nodes=1,
            gpus_per_node=1,
            job_options={"node_selector": {"node.kubernetes.io/instance-type": "g6.xlarge"}},
        ),
        run_config_for("7b"),
    )
    sized(settings(nodes=1, gpus_per_node=1), run_config_for("1b"))  # fits one 80 GB GPU: no warning
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert warnings[0].startswith("sizing: model.preset '7b' (6.74B parameters) with gpus_per_node=0")
    assert warnings[1].startswith(
        "sizing: model.preset '7b' (6.74B parameters) does not fit 1 x 1 GPU(s) of g6.xlarge's L4"
    )


def test_the_nodes_to_avoid_reach_the_attempts_spec_with_the_users_own():
    spec = training_attempt(
        settings(job_options={"avoid_nodes": ["node-z"]}),
        identity=IDENTITY,
        run_uri=RUN_URI,
        attempt=3,
        capacity="spot",
        storage_env={},
        avoid_nodes=["node-b", "node-a"],
    ).spec
    assert spec.avoid_nodes == ["node-a", "node-b", "node-z"]  # recorded in job.json with the spec


def test_avoid_nodes_in_job_options_must_be_a_list():
    from trainops.cluster.spec import JobSpecError

    with pytest.raises(JobSpecError, match="avoid_nodes 'gpu1': use a list"):
        training_attempt(
            settings(job_options={"avoid_nodes": "gpu1"}),
            identity=IDENTITY,
            run_uri=RUN_URI,
            attempt=1,
            capacity="spot",
            storage_env={},
        )


def test_training_on_kubernetes_spot_watches_for_the_clouds_notice_unless_the_user_set_it():
    from trainops.operators.launch_plan import spot_notice_env

    assert spot_notice_env("kubernetes", "spot", {}) == {"TRAINOPS_SPOT_NOTICE": "auto"}
    assert spot_notice_env("kubernetes", "on-demand", {}) == {}  # no notice to watch for
    assert spot_notice_env("local", "spot", {}) == {}  # the "node" is this machine
    assert spot_notice_env("kubernetes", "spot", {"env": {"TRAINOPS_SPOT_NOTICE": "off"}}) == {}
