"""What every object of a launch carries: the ``trainops/job`` label, the Kueue queue label,
the user's labels (fitted) and annotations."""

import pytest

from trainops.cluster.kubernetes import objects
from trainops.cluster.spec import JobSpec

ARGS = ["python", "-m", "trainer", "train"]


def spec(**kw) -> JobSpec:
    return JobSpec(**{"name": "train-0123abcd-a1", "args": ARGS, "namespace": "ml", **kw})


@pytest.mark.parametrize(
    "scheduler,queue,kueue,volcano",
    [
        ("default", None, False, False),
        ("volcano", None, False, True),
        ("volcano:training", "training", False, True),
        ("kueue:team-a", "team-a", True, False),
    ],
)
def test_the_scheduler_names_the_queue_and_who_admits_the_job(scheduler, queue, kueue, volcano):
    s = spec(scheduler=scheduler)
    assert (objects.queue(s), objects.is_kueue(s), objects.is_volcano(s)) == (queue, kueue, volcano)


def test_metadata_labels_the_job_and_its_kueue_queue():
    meta = objects.metadata(spec(labels={"team": "search"}, scheduler="kueue:team-a"), "job-1")
    assert meta == {
        "name": "job-1",
        "namespace": "ml",
        "labels": {"team": "search", "trainops/job": "job-1", "kueue.x-k8s.io/queue-name": "team-a"},
    }
    volcano = objects.metadata(spec(scheduler="volcano:training"), "job-1")
    assert volcano["labels"] == {"trainops/job": "job-1"}  # Volcano's queue is not a label


def test_metadata_fits_label_values_and_keeps_annotations_as_given():
    long = "manual__" + "2026-01-01T00:00:00+00:00" * 3
    meta = objects.metadata(spec(labels={"trainops/run": long}, annotations={"example.com/note": long}), "j")
    assert len(meta["labels"]["trainops/run"]) <= 63
    assert meta["annotations"] == {"example.com/note": long}
    assert "annotations" not in objects.metadata(spec(), "j")
