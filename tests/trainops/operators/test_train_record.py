"""The training run's job.json in storage: read back, claimed create-only, and each launch
recorded (the intent before ``launch``, the handle after it)."""

import pytest

from trainer.contract import RunLayout
from trainer.storage import open_storage
from trainops.cluster.spec import JobSpec
from trainops.operators import train_record
from trainops.recovery.record import RunFolderTaken

MINE = {"dag_id": "retrain", "run_id": "manual__1", "task_id": "train", "map_index": -1}
THEIRS = {**MINE, "task_id": "train.3"}
AT = "2026-01-01T00:00:00+00:00"
HANDLE = {"cluster": "local", "job_id": "train-1234abcd-a1", "labels": {"trainops/attempt": "1"}}


def run(tmp_path):
    layout = RunLayout((tmp_path / "run").as_uri())
    return open_storage(layout.run_uri), layout


def claim(store, layout, identity, read=None):
    return train_record.claim(
        store, layout, identity, cluster="local", capacity="spot",
        read=read or (lambda: train_record.read_job(store, layout, identity)),
    )  # fmt: skip


def test_a_run_folder_is_claimed_once_and_refused_to_another_task(tmp_path):
    store, layout = run(tmp_path)
    assert train_record.read_job(store, layout, MINE) is None
    job = claim(store, layout, MINE)
    assert store.get_json(layout.job) == job and job["airflow"] == MINE and job["attempts"] == []
    assert claim(store, layout, MINE) == job  # a retry reads it back
    with pytest.raises(RunFolderTaken, match="belongs to dag 'retrain', run 'manual__1', task 'train'"):
        claim(store, layout, THEIRS)


def test_a_record_from_before_owners_is_adopted(tmp_path):
    store, layout = run(tmp_path)
    job = claim(store, layout, MINE)
    del job["airflow"]
    store.put_json(layout.job, job)
    assert claim(store, layout, MINE)["airflow"] == MINE
    assert store.get_json(layout.job)["airflow"] == MINE


def test_a_record_that_vanishes_in_the_race_to_create_it_says_so(tmp_path):
    store, layout = run(tmp_path)
    claim(store, layout, MINE)
    with pytest.raises(RuntimeError, match=r"job\.json is missing, so this run's attempts are unknown"):
        claim(store, layout, MINE, read=lambda: None)  # exists, yet reads back as nothing


def test_the_intent_is_written_before_the_launch_and_the_handle_after_it_once(tmp_path):
    store, layout = run(tmp_path)
    job = claim(store, layout, MINE)
    spec = JobSpec(name="train-1234abcd-a1", args=["train"], nodes=1, gpus_per_node=0)
    rendered = []

    def manifests(s):
        rendered.append(s.name)
        return [{"kind": "Job"}]

    intended = train_record.record_intent(store, layout, job, spec, manifests=manifests, at=AT, try_number=1)
    assert store.get_json(layout.job)["attempts"][0]["status"] == "launching"
    again = train_record.record_intent(
        store, layout, intended, spec, manifests=manifests, at=AT, try_number=2
    )
    assert again is intended and rendered == ["train-1234abcd-a1"]  # the current attempt stands
    running = train_record.record_handle(store, layout, intended, 1, HANDLE, at=AT)
    assert store.get_json(layout.job)["attempts"][0]["job"] == HANDLE
    store.put_json(layout.job, {**running, "note": "not overwritten"})
    assert train_record.record_handle(store, layout, running, 1, HANDLE, at=AT) is running
    assert store.get_json(layout.job)["note"] == "not overwritten"  # no news: no write
