"""What lies around a report page: its Airflow run, its run's report, the cards promoted from
it, whether it is live; read from a real file:// root through the app's checked reads."""

from __future__ import annotations

import os

import pytest

from tests.trainops.reports.helpers import run_job
from trainer.contract import join
from trainer.storage import open_storage
from trainops.reports.around import around_report, run_of_path
from trainops.reports.frame import AirflowRef, Around
from trainops.reports.reader import Reads

RUN_ID = "manual__2026-01-01T00:00:00+00:00"
IDS = {"dag_id": "retrain", "run_id": RUN_ID, "task_id": "train", "map_index": -1}


@pytest.fixture
def tree(file_root):
    """A run (recorded with its Airflow ids) promoted as demo-lm v1, then rolled back to."""
    from trainops.registry.promotion import promote

    storage = open_storage(file_root)
    run_uri = join(file_root, "runs", "retrain", "manual__2026-01-01T00_00_00_00_00", "train")
    storage.put_json(join(run_uri, "job.json"), run_job(run_uri=run_uri, airflow=IDS))
    storage.put_json(join(run_uri, "eval", "gate.json"), {"approved": True, "checks": []})
    storage.put(join(run_uri, "export", "model.safetensors"), b"weights")
    other = join(file_root, "runs", "nightly", "old", "train")
    storage.put_json(join(other, "job.json"), run_job(run_uri=other, status="running"))
    for uri in (run_uri, other):
        promote(
            storage,
            file_root,
            "demo-lm",
            export_uri=join(run_uri, "export"),
            card={"run_uri": uri},
            expected_production_version=None if uri == run_uri else 1,
        )
    return storage, file_root, run_uri, other


def _around(root: str, uri: str, reads: Reads) -> Around:
    where = reads.locate(uri)
    assert where is not None
    return around_report(where, reads.read(uri), reads.read, reads.listing, reads.locate)


def test_a_runs_report_knows_its_airflow_run_and_the_versions_promoted_from_it(tree):
    storage, root, run_uri, other = tree
    reads = Reads([root], None)
    card_1 = join(root, "models", "demo-lm", "versions", "1", "card.json")
    assert _around(root, join(run_uri, "job.json"), reads) == Around(
        airflow=AirflowRef("retrain", RUN_ID), cards=(("demo-lm", 1, card_1),), live=False
    )
    # a record from before the Airflow ids: the DAG only; live while it runs, and no lookup of
    # the models then (a version promoted from it is listed once it has ended)
    assert _around(root, join(other, "job.json"), reads) == Around(airflow=AirflowRef("nightly"), live=True)
    storage.put_json(join(other, "job.json"), run_job(run_uri=other))
    card_2 = join(root, "models", "demo-lm", "versions", "2", "card.json")
    assert _around(root, join(other, "job.json"), reads) == Around(
        airflow=AirflowRef("nightly"), cards=(("demo-lm", 2, card_2),)
    )


def test_a_gate_decision_and_a_model_card_lead_back_to_the_run(tree):
    _, root, run_uri, _ = tree
    reads = Reads([root], None)
    expected = Around(airflow=AirflowRef("retrain", RUN_ID), run_report=join(run_uri, "job.json"))
    assert _around(root, join(run_uri, "eval", "gate.json"), reads) == expected
    assert _around(root, join(root, "models", "demo-lm", "versions", "1", "card.json"), reads) == expected


def test_what_cannot_be_read_leaves_links_out_and_never_the_page(tree, tmp_path):
    storage, root, run_uri, _ = tree
    reads = Reads([root], None)
    storage.put(join(run_uri, "job.json"), b"{not json")
    assert _around(root, join(run_uri, "eval", "gate.json"), reads) == Around(airflow=AirflowRef("retrain"))
    # a card whose run lies outside the served roots: no lookup there
    card = join(root, "models", "x", "versions", "1", "card.json")
    storage.put_json(card, {"format": "trainops.card/v1", "run_uri": "file:///etc/runs/d/r/t"})
    assert _around(root, card, reads) == Around()
    # a job.json that a symbolic link places outside the root is not read
    outside = tmp_path / "outside" / "job.json"
    outside.parent.mkdir()
    outside.write_text('{"airflow": {"dag_id": "evil", "run_id": "x"}}')
    linked = join(root, "runs", "d", "r", "t")
    os.makedirs(linked[len("file://") :])
    os.symlink(outside, join(linked, "job.json")[len("file://") :])
    storage.put_json(join(linked, "eval", "gate.json"), {"approved": False, "checks": []})
    assert _around(root, join(linked, "eval", "gate.json"), reads) == Around(airflow=AirflowRef("d"))
    # a validation report belongs to no run
    validation = join(root, "datasets", "web", "v1", "validation.json")
    storage.put_json(validation, {"success": True})
    assert _around(root, validation, reads) == Around()


@pytest.mark.parametrize(
    ("relative", "expected"),
    [
        ("runs/d/r/t/job.json", ("file:///root", "file:///root/runs/d/r/t", "d")),
        ("team-a/runs/d/r/t/eval/gate.json", ("file:///root/team-a", "file:///root/team-a/runs/d/r/t", "d")),
        ("runs/d/r/job.json", None),  # too shallow: no task folder
        ("runs//r/t/job.json", None),
        ("datasets/runs/v/validation.json", None),
    ],
)
def test_the_run_of_a_path(relative, expected):
    assert run_of_path("file:///root", relative) == expected
