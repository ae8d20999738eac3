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
        # What the README says is checked at parse, on every cluster:
        ({"kind": "mpijob"}, "kind 'mpijob' is not one of"),
        ({"scheduler": "slurm"}, "scheduler 'slurm'"),
        ({"cpu": "lots"}, "cpu 'lots' is not a positive Kubernetes quantity"),
        ({"memory": "-4Gi"}, "memory '-4Gi' is not a positive Kubernetes quantity"),
        ({"shm_size": "0"}, "shm_size '0' is not a positive Kubernetes quantity"),
        ({"env": {"HF HOME": "/cache"}}, "env name 'HF HOME' is not a valid variable name"),
        ({"env_from_secrets": "s3-credentials"}, "env_from_secrets must be a list"),
        ({"service_account": "Trainer"}, "service_account 'Trainer' is not a DNS-1123 name"),
        ({"labels": {"team": 1}}, "labels must be a dict of strings to strings"),
        ({"annotations": ["a"]}, "annotations must be a dict of strings to strings"),
        ({"node_selector": {"pool": 1}}, "node_selector must be a dict of strings to strings"),
        ({"tolerations": [{"operator": "Maybe"}]}, "toleration"),
        ({"affinity": []}, "affinity"),
        ({"priority_class": "Low Priority"}, "priority_class 'Low Priority' is not a DNS-1123 name"),
        ({"nccl_env": {"NCCL_DEBUG": 1}}, "nccl_env 'NCCL_DEBUG' must be a string"),
        ({"cluster_domain": "cluster local"}, "cluster_domain 'cluster local' is not a DNS name"),
        ({"runtime": "Torch"}, "runtime 'Torch' is not a DNS-1123 name"),
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


def test_the_operators_own_job_fields_are_checked_with_them():
    assert check_job_options({"cpu": "2"}, image="registry.example.com/trainer:1.4", namespace="ml") == {
        "cpu": "2"
    }
    with pytest.raises(ValueError, match="JobSpec namespace 'ML Team' is not a DNS-1123 label"):
        check_job_options(None, image="trainer:1", namespace="ML Team")
    with pytest.raises(ValueError, match="JobSpec image 'my trainer' is not an image reference"):
        check_job_options(None, image="my trainer", namespace="ml")
