"""The training operator's sizing settings, checked and converted from rendered templates."""

import pytest

from trainops.operators.train_settings import checked_restarts, checked_sizing

FIELDS = {"image": "trainops-trainer:latest", "namespace": "default", "termination_grace_seconds": 60}


def sizing(cluster="local", **given):
    settings = {"nodes": 2, "gpus_per_node": 0, "max_preemptions": 3, "capacity": "spot", **given}
    return checked_sizing(cluster, job_options={}, **settings, **FIELDS)


def test_rendered_templates_become_integers():
    assert sizing(nodes="4", gpus_per_node="8", max_preemptions="0") == (4, 8, 0)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"nodes": 0}, "nodes"),
        ({"gpus_per_node": -1}, "gpus_per_node"),
        ({"max_preemptions": "many"}, "max_preemptions"),
        ({"capacity": "cheap"}, "capacity 'cheap' is not one of 'spot', 'on-demand', 'spot-then-on-demand'"),
    ],
)
def test_a_bad_setting_is_refused_by_name(given, message):
    with pytest.raises(ValueError, match=message):
        sizing(**given)


def test_on_kubernetes_a_trial_job_is_rendered_with_the_job_options():
    assert sizing("kubernetes", nodes=2) == (2, 0, 3)
    with pytest.raises(ValueError):
        checked_sizing(
            "kubernetes", nodes=2, gpus_per_node=0, max_preemptions=3, capacity="spot",
            job_options={"env": {"AWS_SECRET_ACCESS_KEY": "literal"}}, **FIELDS,
        )  # fmt: skip


def test_restarts_in_place_are_a_small_whole_number():
    assert [checked_restarts(n) for n in (0, 2, 10, "3")] == [0, 2, 10, 3]  # "3": a rendered template
    with pytest.raises(
        ValueError, match=r"restarts_in_place must be an integer from 0 to 10, got 11: .*such as 2"
    ):
        checked_restarts(11)
    with pytest.raises(ValueError, match="restarts_in_place must be an integer >= 0, got True"):
        checked_restarts(True)
