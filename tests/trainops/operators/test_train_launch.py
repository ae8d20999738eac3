"""What the training operator launches: the run's config checked before anything is written,
and each attempt's JobSpec sized from the config as written."""

import pytest

from tests.task_log import RecordingLog
from tests.trainops.operators.helpers import staged_dataset
from trainer.config import dump_yaml
from trainer.contract import RunLayout
from trainer.storage import open_storage
from trainops.operators import train_launch
from trainops.operators.launch_plan import LaunchSettings

IDENTITY = {"dag_id": "retrain", "run_id": "manual__1", "task_id": "train", "map_index": -1}


def settings(**extra):
    return LaunchSettings(
        nodes=2, gpus_per_node=0, image="trainops-trainer:latest", namespace="default",
        termination_grace_seconds=60, **extra,
    )  # fmt: skip


def checked(tmp_path, data_uri, trainer_config=None):
    layout = RunLayout((tmp_path / "run").as_uri())
    store = open_storage(layout.run_uri)
    config = train_launch.checked_config(
        {"train.max_steps": 100, **(trainer_config or {})},
        settings(),
        cluster="local",
        data_uri=data_uri,
        layout=layout,
        store=store,
        model_name=None,
        storage_root=None,
        aws_conn_id=None,
    )
    return config, store, layout


def test_a_dataset_that_is_not_staged_is_refused_before_anything_is_written(tmp_path):
    missing = (tmp_path / "data" / "nothing").as_uri()
    with pytest.raises(ValueError, match="does not exist"):
        checked(tmp_path, missing)
    assert not (tmp_path / "run").exists()


def test_the_config_is_checked_against_the_dataset(tmp_path):
    data = staged_dataset((tmp_path / "data" / "v1").as_uri(), train_tokens=50)
    with pytest.raises(ValueError, match=r"train\.seq_len=64 needs windows of 65 tokens"):
        checked(tmp_path, data, {"train.seq_len": 64})


def test_an_attempt_is_launched_from_the_config_as_written_on_the_runs_capacity(tmp_path):
    data = staged_dataset((tmp_path / "data" / "v1").as_uri())
    config, store, layout = checked(tmp_path, data)
    store.put(layout.config, dump_yaml(config).encode())
    assert train_launch.run_config(store, layout) == config
    launch = train_launch.attempt_launch(
        store, layout, settings(), cluster="local", identity=IDENTITY, attempt=2,
        job={"capacity": "on-demand", "attempts": []}, aws_conn_id=None, log=RecordingLog(),
    )  # fmt: skip
    assert launch.spec.name.endswith("-a2") and launch.spec.capacity == "on-demand"
    assert launch.spec.nodes == 2 and launch.spec.labels["trainops/attempt"] == "2"
    assert launch.spec.cache_size is None  # the pods' disk is sized on Kubernetes only


def test_a_relaunch_keeps_off_a_node_earlier_attempts_hung_on_twice_and_says_so(tmp_path):
    from datetime import UTC, datetime

    data = staged_dataset((tmp_path / "data" / "v1").as_uri())
    config, store, layout = checked(tmp_path, data)
    store.put(layout.config, dump_yaml(config).encode())
    ended = datetime.now(UTC).isoformat()
    hung = [
        {
            "attempt": n,
            "classification": "hung",
            "ended_at": ended,
            "state": {"nodes": [{"index": 0, "node_name": "node-x"}]},
        }
        for n in (1, 2)
    ]
    log = RecordingLog()
    launch = train_launch.attempt_launch(
        store, layout, settings(), cluster="local", identity=IDENTITY, attempt=3,
        job={"capacity": "spot", "attempts": hung}, aws_conn_id=None, log=log,
    )  # fmt: skip
    assert launch.spec.avoid_nodes == ["node-x"]
    assert ("warning", "attempt 3 keeps off 1 node(s) earlier attempts failed on twice: "
            "node-x (attempt 1: hung, attempt 2: hung)") in log.lines  # fmt: skip


def test_the_pods_disk_comes_from_the_config_and_the_dataset(tmp_path):
    data = staged_dataset((tmp_path / "data" / "v1").as_uri())
    config, _, _ = checked(tmp_path, data)
    log = RecordingLog()
    disk = train_launch.pod_disk(config, nodes=2, gpus_per_node=0, aws_conn_id=None, log=log)
    assert set(disk) == {"cache_size", "ephemeral_storage"}
    assert log.lines[0][1].startswith("pod disk: ") and "job_options cache_size" in log.lines[0][1]
