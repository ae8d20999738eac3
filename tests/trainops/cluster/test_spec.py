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
