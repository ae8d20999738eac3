"""Names Kubernetes will accept, including what it appends to them."""

import re

import pytest

from trainops.cluster.kubernetes import names
from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec

ARGS = ["python", "-m", "trainer", "train"]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("kind", ["indexed-job", "pytorchjob", "trainjob"])
@pytest.mark.parametrize("nodes", [1, 2, 11, 128])
def test_operator_names_are_kept_and_long_names_fit(kind, nodes):
    # trainjob: JobSet names the pods <job>-node-0-<index> (job "node", its Job 0)
    place = {"spot_flavour": "gke", "termination_grace_seconds": 30}
    short = JobSpec(name="train-0123abcd-a12", args=ARGS, kind=kind, nodes=nodes, **place)
    assert names.job_name(short) == "train-0123abcd-a12"
    long = JobSpec(name="evaluate-" + "x" * 50 + "-a1", args=ARGS, kind=kind, nodes=nodes, **place)
    job = names.job_name(long)
    assert job != long.name and job.startswith("evaluate-x")
    assert job == names.job_name(long)  # deterministic
    for host in names.pod_hostnames(long):
        assert len(host) <= 63 and DNS_1035.match(host), host
    manifest = render_manifests(long)[-1]
    assert manifest["metadata"]["name"] == job


def test_two_long_names_sharing_a_prefix_stay_distinct():
    a = JobSpec(name="train-" + "y" * 52 + "-a1", args=ARGS, nodes=4)
    b = JobSpec(name="train-" + "y" * 52 + "-a2", args=ARGS, nodes=4)
    assert names.job_name(a) != names.job_name(b)


def test_service_names_start_with_a_letter():
    spec = JobSpec(name="1234-train", args=ARGS, nodes=2)
    service, job = render_manifests(spec)
    assert DNS_1035.match(service["metadata"]["name"])
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]


def test_label_values_fit_and_stay_deterministic():
    long = "manual__" + "2026-01-01T00_00_00_00_00" * 4
    value = names.label_value(long)
    assert len(value) <= 63 and value == names.label_value(long)
    assert re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", value)
    assert names.label_value("_x") != "_x"
    assert names.label_value("scheduled__2026") == "scheduled__2026"
    spec = JobSpec(name="train-0123abcd-a1", args=ARGS, labels={"trainops/run": long})
    assert render_manifests(spec)[-1]["metadata"]["labels"]["trainops/run"] == value


def test_bad_label_key_is_named():
    with pytest.raises(ValueError, match="'bad key!'"):
        render_manifests(JobSpec(name="train-0123abcd-a1", args=ARGS, labels={"bad key!": "x"}))
