"""Which listed objects are runs: ``[<prefix>/]runs/<dag>/<run>/<task>/job.json`` at any depth."""

from __future__ import annotations

from trainer.contract import join, run_prefix
from trainer.storage import open_storage
from trainops.cost.runs import RunPath, run_of, runs_below, task_matches


def test_a_run_is_known_by_its_last_five_segments_at_any_depth():
    assert run_of("runs/nightly/r1/train/job.json") == RunPath("", "nightly", "r1", "train")
    assert run_of("teams/nlp/runs/nightly/r1/train.3/job.json") == RunPath(
        "teams/nlp", "nightly", "r1", "train.3"
    )
    for not_a_run in (
        "runs/nightly/job.json",  # too shallow
        "runs/nightly/r1/train/eval/gate.json",
        "runs/nightly/r1/train/checkpoints/job.json",  # no runs/ five segments up
        "datasets/d/v1/job.json",
        "runs/nightly//train/job.json",
        "a/../runs/nightly/r1/train/job.json",
    ):
        assert run_of(not_a_run) is None, not_a_run


def test_a_mapped_task_is_the_task():
    assert (
        task_matches("train", "train")
        and task_matches("train.0", "train")
        and task_matches("train.12", "train")
    )
    assert not task_matches("train_b", "train") and not task_matches("train.x", "train")
    assert not task_matches("retrain.1", "train") and task_matches("grp.train.1", "grp.train")


def test_one_listing_finds_the_runs_of_nested_storage_roots(file_root):
    storage = open_storage(file_root)
    flat = run_prefix(file_root, "nightly", "r1", "train")
    nested = run_prefix(join(file_root, "teams", "nlp"), "nightly", "r2", "train", map_index=1)
    for run in (flat, nested):
        storage.put_json(join(run, "job.json"), {})
        storage.put(join(run, "checkpoints", "step_1", "x.distcp"), b"x")
    storage.put_json(join(file_root, "models", "m", "versions", "1", "card.json"), {})
    found = runs_below(storage, file_root)
    assert found == [
        (join(flat, "job.json"), RunPath("", "nightly", "r1", "train")),
        (join(nested, "job.json"), RunPath("teams/nlp", "nightly", "r2", "train.1")),
    ]
    # one DAG under its own root (the estimate's view), a mapped task's runs included
    mapped = run_prefix(file_root, "nightly", "r3", "train", map_index=0)
    storage.put_json(join(mapped, "job.json"), {})
    storage.put_json(join(run_prefix(file_root, "other", "r1", "train"), "job.json"), {})
    assert [(run.run_id, run.task) for _, run in runs_below(storage, file_root, dag_id="nightly")] == [
        ("r1", "train"),
        ("r3", "train.0"),
    ]
