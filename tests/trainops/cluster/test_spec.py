import re

import pytest

from trainops.cluster.spec import JobSpec, JobSpecError


def spec(**kw):
    return JobSpec(**{"name": "train-abc-a1", "args": ["python", "-m", "trainer", "train"], **kw})


def test_json_round_trip():
    s = spec(nodes=4, gpus_per_node=8, env={"A": "1"}, capacity="spot-then-on-demand")
    assert JobSpec.from_dict(s.to_dict()) == s
    assert s.procs_per_node == 8


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("name", "Train_1", "DNS-1123"),
        ("nodes", 0, "nodes must be"),
        ("capacity", "cheap", "capacity 'cheap'"),
        ("scheduler", "slurm", "kueue:<queue>"),
        ("kind", "mpijob", "kind 'mpijob'"),
        ("env", {"A": 1}, "env 'A' must be a string"),
        ("env", ["A=1"], "env must be a dict of variable names to strings"),
        ("env", {"A=B": "1"}, "env name 'A=B' is not a valid variable name"),
        ("nccl_env", {"NCCL_IB_DISABLE": 1}, "nccl_env 'NCCL_IB_DISABLE' must be a string"),
        ("nodes", True, "nodes must be an integer >= 1, got True"),
        ("gpus_per_node", "1", "gpus_per_node must be an integer >= 0, got '1'"),
        ("termination_grace_seconds", "60", "termination_grace_seconds must be an integer >= 1, got '60'"),
        ("distributed", "yes", "distributed must be true or false"),
        ("image", "", "image '' is not an image reference"),
        ("image", "trainer latest", "image 'trainer latest' is not an image reference"),
        ("namespace", "ML", "namespace 'ML' is not a DNS-1123 label"),
        (
            "memory",
            "-4Gi",
            r"memory '-4Gi' is not a positive Kubernetes quantity \(negative\): use a number with an optional suffix such as '64Gi'",
        ),
        (
            "memory",
            "4GB",
            r"memory '4GB' is not a positive Kubernetes quantity \(not a Kubernetes quantity\)",
        ),
        ("cpu", "lots", r"cpu 'lots' is not a positive Kubernetes quantity .* such as '8' or '500m'"),
        ("cpu", 0, r"cpu 0 is not a positive Kubernetes quantity \(not a positive number\)"),
        ("shm_size", "0Gi", "shm_size '0Gi' is not a positive Kubernetes quantity"),
        ("shm_size", None, r"shm_size None is not a positive Kubernetes quantity \(not a quantity\)"),
        ("labels", {"team": 7}, "labels must be a dict of strings to strings"),
        ("annotations", "a=b", "annotations must be a dict of strings to strings"),
        ("node_selector", {"pool": None}, "node_selector must be a dict of strings to strings"),
        ("service_account", "Trainer SA", "service_account 'Trainer SA' is not a DNS-1123 name"),
        ("priority_class", "", "priority_class '' is not a DNS-1123 name"),
        ("tolerations", {"key": "gpu"}, "tolerations must be a list of Kubernetes tolerations"),
        (
            "tolerations",
            [{"key": "gpu", "operator": "Is"}],
            "toleration .*'operator': 'Is'.*: use a dict of key",
        ),
        ("tolerations", [{"key": "gpu", "effect": "NoRun"}], "toleration .*'NoRun'"),
        ("affinity", {"nodeAffinty": {}}, "affinity .*nodeAffinty.*: use None or a Kubernetes affinity"),
        (
            "env_from_secrets",
            "s3-credentials",
            "env_from_secrets must be a list of Secret names or references",
        ),
    ],
)
def test_bad_fields_are_named(field, value, needle):
    with pytest.raises(JobSpecError, match=needle):
        spec(**{field: value})


def test_unknown_field_in_json_form():
    with pytest.raises(JobSpecError, match="unknown JobSpec field"):
        JobSpec.from_dict({**spec().to_dict(), "gpu": 1})


def test_shutdown_timeout_fits_inside_grace():
    for grace in (1, 5, 30, 60, 600):
        s = spec(termination_grace_seconds=grace)
        assert 1 <= s.shutdown_timeout_s <= grace


def test_runtime_defaults_to_trainers_torch_runtime_and_is_a_dns_name():
    assert spec().runtime == "torch-distributed"
    assert spec(runtime="trainops-torch").runtime == "trainops-torch"
    with pytest.raises(JobSpecError, match="runtime 'torch distributed' is not a DNS-1123 name"):
        spec(runtime="torch distributed")


@pytest.mark.parametrize("value", ["8", "500m", "0.5", ".5", "64Gi", "1Ki", "2e3", "+1", 4, 0.25])
def test_positive_quantities_pass(value):
    assert spec(cpu=value, memory=value, shm_size=value).cpu == value


def test_every_valid_field_still_reads_back_from_its_json_form():
    """A job.json or spec.json written before these checks holds only values that ran."""
    full = spec(
        cpu="500m",
        memory="64Gi",
        shm_size="16Gi",
        env={"HF_HOME": "/cache"},
        env_from_secrets=["s3-credentials", {"env": "TOKEN", "secret": "hf", "key": "token"}],
        service_account="trainer",
        labels={"team": "search"},
        annotations={"example.com/owner": "ml"},
        node_selector={"pool": "gpu"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        affinity={"nodeAffinity": {}},
        priority_class="batch-low",
        nccl_env={"NCCL_IB_DISABLE": "1"},
    )
    assert JobSpec.from_dict(full.to_dict()) == full


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cache_size", "-5Gi", "JobSpec cache_size '-5Gi' is not a positive Kubernetes quantity (negative)"),
        ("ephemeral_storage", "lots", "such as '220Gi'"),
        ("ttl_seconds_after_finished", -1, "ttl_seconds_after_finished must be None or an integer >= 0"),
        ("ttl_seconds_after_finished", "1d", "got '1d'"),
    ],
)
def test_disk_and_ttl_fields_are_checked_naming_the_value(field, value, message):
    with pytest.raises(JobSpecError, match=re.escape(message)):
        JobSpec(name="t", args=["x"], **{field: value})


def test_a_job_json_spec_from_before_the_disk_fields_still_reads():
    old = {
        k: v
        for k, v in JobSpec(name="t", args=["x"]).to_dict().items()
        if k not in ("cache_size", "ephemeral_storage", "ttl_seconds_after_finished")
    }
    assert JobSpec.from_dict(old).cache_size is None


def test_avoid_nodes_must_be_node_names():
    import pytest as _pytest

    from trainops.cluster.spec import JobSpec, JobSpecError

    assert JobSpec(name="x", args=["python"], avoid_nodes=["ip-10-0-1-2.ec2.internal"]).avoid_nodes
    with _pytest.raises(JobSpecError, match="avoid_nodes"):
        JobSpec(name="x", args=["python"], avoid_nodes=["bad name!"])


@pytest.mark.parametrize("value", [-1, 11, True, "2", 1.0, None])
def test_restarts_in_place_must_be_a_small_whole_number(value):
    with pytest.raises(
        JobSpecError, match=re.escape(f"restarts_in_place must be an integer from 0 to 10, got {value!r}")
    ):
        spec(restarts_in_place=value)


def test_restarts_in_place_default_to_none_and_read_back_from_the_json_form():
    assert spec().restarts_in_place == 0
    assert JobSpec.from_dict(spec(restarts_in_place=3).to_dict()).restarts_in_place == 3
    old = {k: v for k, v in spec().to_dict().items() if k != "restarts_in_place"}  # a job.json from before it
    assert JobSpec.from_dict(old).restarts_in_place == 0
