"""The plain parameter checks: what passes, and errors that name the parameter and the value."""

import math

import pytest
from airflow.sdk import DAG
from airflow.sdk.bases.operator import BaseOperator

from trainops.operators.params import (
    as_int,
    dataset_uri,
    dataset_uri_problem,
    known_at_run_time,
    optional_int,
    optional_seconds,
    seconds,
)


def test_templates_and_xcoms_are_known_at_run_time_even_inside_a_dict():
    with DAG("params_test", schedule=None):
        upstream = BaseOperator(task_id="stage")
    assert known_at_run_time("{{ params.nodes }}") and known_at_run_time("{% if x %}1{% endif %}")
    assert known_at_run_time(upstream.output)
    assert known_at_run_time({"uri": upstream.output}) and known_at_run_time(
        {"train": {"lr": "{{ params.lr }}"}}
    )
    assert known_at_run_time([1, "{{ x }}"])
    assert (
        not known_at_run_time({"train.lr": 0.1})
        and not known_at_run_time("s3://b/d/v1")
        and not known_at_run_time(3)
    )


def test_integers():
    assert as_int("nodes", 2, minimum=1) == 2
    assert as_int("nodes", " 2", minimum=1, text=True) == 2  # a rendered template's text
    with pytest.raises(
        ValueError, match=r"^nodes must be an integer >= 1, got the text '2'; write 2 without quotes$"
    ):
        as_int("nodes", "2", minimum=1)
    for bad in (True, 2.0, None, "two"):
        with pytest.raises(ValueError, match=rf"^nodes must be an integer >= 1, got {bad!r}$"):
            as_int("nodes", bad, minimum=1, text=True)
    with pytest.raises(ValueError, match=r"^nodes must be an integer >= 1, got -3$"):
        as_int("nodes", "-3", minimum=1, text=True)
    assert optional_int("fallback_after", None, minimum=1) is None
    assert optional_int("fallback_after", 2, minimum=1) == 2


def test_seconds_are_positive_finite_numbers():
    assert (
        seconds("poll_interval", 1, default=5.0) == 1.0
        and seconds("poll_interval", 0.01, default=5.0) == 0.01
    )
    for bad in (0, -1, math.nan, math.inf, "5", True, None):
        with pytest.raises(ValueError) as err:
            seconds("poll_interval", bad, default=5.0)
        assert str(err.value) == (
            f"poll_interval must be a positive number of seconds, got {bad!r}; pass a number such as 5 (the default)"
        )
    assert optional_seconds("job_timeout", None, default=None) is None
    with pytest.raises(ValueError, match=r"got -1; pass a number such as 3600$"):
        optional_seconds("job_timeout", -1, default=None)


@pytest.mark.parametrize(
    "uri", ["s3://bucket/datasets/d/v1", "file:///data/datasets/d/v1", "file://localhost/data/datasets/d/v1"]
)
def test_dataset_uris_in_storage_pass(uri):
    assert dataset_uri_problem(uri) is None
    assert dataset_uri({"uri": uri, "version": "v1"}) == uri == dataset_uri(uri)


@pytest.mark.parametrize(
    "uri, problem",
    [
        ("s3:///datasets/d/v1", "names no bucket"),
        ("s3://", "names no bucket"),
        ("file://data/d/v1", "is not an absolute path"),
        ("data/d/v1", "is not a file:// or s3:// URI"),
        ("/data/d/v1", "is not a file:// or s3:// URI"),
        ("gs://b/d/v1", "is not a file:// or s3:// URI"),
    ],
)
def test_dataset_uris_that_name_no_place_in_storage(uri, problem):
    with pytest.raises(ValueError) as err:
        dataset_uri(uri)
    assert str(err.value) == (
        f"dataset URI {uri!r} {problem}: use file:///abs/path/datasets/<name>/<version> or "
        "s3://<bucket>/<prefix>/datasets/<name>/<version>, or pass the StageDatasetOperator result (stage.output)"
    )
    for not_a_uri in (None, {"version": "v1"}, 3, " "):
        with pytest.raises(
            ValueError, match="dataset must be a StageDatasetOperator result or a dataset version URI"
        ):
            dataset_uri(not_a_uri)
