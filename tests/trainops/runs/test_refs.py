"""Which run a reference names: URIs, folders, <dag>/<run>, latest; one line for bad input."""

import os

import pytest

from trainer.storage import open_storage
from trainops.runs.refs import RunRefError, latest, resolve

from .stored import every_outcome


def test_uri_with_or_without_job_json(file_root):
    uri = f"{file_root}/runs/retrain/r1/train"
    for given in (uri, uri + "/", uri + "/job.json"):
        ref = resolve(given, file_root)
        assert (ref.run_uri, ref.dag_id, ref.run_id, ref.task, ref.root) == (
            uri,
            "retrain",
            "r1",
            "train",
            file_root,
        )


def test_dag_and_run_id_name_the_train_tasks_folder(file_root):
    ref = resolve("retrain/manual__2026-12-01T10:00:00+00:00", file_root)
    assert ref.run_uri.startswith(f"{file_root}/runs/retrain/manual__2026-12-01T10_00_00_00_00~")
    assert ref.run_uri.endswith("/train") and ref.run_id == "manual__2026-12-01T10:00:00+00:00"
    assert resolve("retrain/r1/evaluate", file_root).task == "evaluate"


def test_a_relative_folder(file_root, tmp_path, monkeypatch):
    runs = every_outcome(file_root)
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(runs["failed"].removeprefix("file://"))
    assert resolve(relative, file_root).run_uri == runs["failed"]


def test_latest_is_the_newest_job_json(file_root):
    runs = every_outcome(file_root)
    assert latest(open_storage(file_root), file_root).run_uri == runs["running"]
    assert resolve("latest", file_root, open_storage(file_root)).run_uri == runs["running"]


@pytest.mark.parametrize(
    "given,said",
    [
        ("", "an empty run"),
        ("http://x/y", "only s3:// and file:// runs"),
        ("./no/such/folder", "no such folder on this machine"),
        ("just-a-word", "expected a run URI"),
        ("a/b/c/d", "expected a run URI"),
    ],
)
def test_bad_input_is_one_line_saying_what_was_expected(file_root, given, said):
    with pytest.raises(RunRefError, match=said) as err:
        resolve(given, file_root)
    assert "\n" not in str(err.value)


def test_a_uri_laid_out_otherwise_is_taken_as_the_run_prefix(file_root):
    ref = resolve("s3://bucket/elsewhere/my-run/", file_root)
    assert (ref.run_uri, ref.dag_id, ref.root) == ("s3://bucket/elsewhere/my-run", "", "")


def test_latest_with_no_runs_says_how_to_make_one(file_root):
    with pytest.raises(RunRefError, match="make demo"):
        latest(open_storage(file_root), file_root)


def test_latest_is_not_outranked_by_many_scheduled_run_ids(file_root, monkeypatch):
    """Run ids sort 'scheduled__' above 'manual__': the newest by date and job.json time wins."""
    import trainops.runs.refs as refs
    from tests.trainops.runs.stored import attempt, write_run

    monkeypatch.setattr(refs, "SCANNED", 3)
    for day in range(1, 6):
        write_run(
            file_root,
            "nightly",
            f"scheduled__2026-11-0{day}T00:00:00+00:00",
            status="succeeded",
            attempts=[attempt(1, "succeeded", "")],
        )
    manual = write_run(
        file_root,
        "nightly",
        "manual__2026-12-01T10:00:00+00:00",
        status="succeeded",
        attempts=[attempt(1, "succeeded", "")],
    )
    assert latest(open_storage(file_root), file_root).run_uri == manual
