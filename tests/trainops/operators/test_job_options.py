"""job_options: what a DAG author may add to a job, refused by name at parse when it is wrong."""

import pytest

from trainops.operators.job_options import check_job_options, check_renders, merge_job_options


def test_known_fields_pass_and_come_back_as_a_copy():
    options = {"kind": "pytorchjob", "cpu": "8", "env_from_secrets": ["s3-credentials"]}
    checked = check_job_options(options)
    assert checked == options and checked is not options
    assert check_job_options(None) == {}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"schedular": "volcano"}, r"unknown field 'schedular'; known fields: .*'scheduler'"),
        ({"name": "x"}, "must not set 'name': the operator names each attempt's job"),
        ({"termination_grace_seconds": 5}, "use the operator's 'termination_grace_seconds' parameter"),
        ({"spot_flavour": "azure"}, "spot_flavour 'azure' is not one of"),
        ({"env_from_secrets": [{"env": "KEY"}]}, "env_from_secrets entry"),
    ],
)
def test_a_wrong_field_or_value_is_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        check_job_options(options)


def test_the_operators_env_and_labels_win_but_never_silently():
    merged = merge_job_options(
        {"env": {"HF_HOME": "/cache"}, "cpu": "2"},
        env={"TRAINOPS_ATTEMPT": "1"},
        labels={"trainops/task": "t"},
    )
    assert merged == {
        "env": {"HF_HOME": "/cache", "TRAINOPS_ATTEMPT": "1"},
        "labels": {"trainops/task": "t"},
        "cpu": "2",
    }
    same = merge_job_options({"labels": {"trainops/task": "t"}}, env={}, labels={"trainops/task": "t"})
    assert same["labels"] == {"trainops/task": "t"}  # agreeing with the operator is no clash
    with pytest.raises(ValueError, match=r"job_options env sets \['TRAINOPS_ATTEMPT'\]"):
        merge_job_options({"env": {"TRAINOPS_ATTEMPT": "7"}}, env={"TRAINOPS_ATTEMPT": "1"}, labels={})


def test_what_only_rendering_refuses_is_checked_for_kubernetes_only():
    literal_key = {"env": {"AWS_SECRET_ACCESS_KEY": "abc"}}
    check_renders("local", **literal_key)  # the local cluster renders no manifests
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        check_renders("kubernetes", **literal_key)
