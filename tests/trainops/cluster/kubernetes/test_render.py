"""The one entry point for manifests: every JobSpec kind has a builder, a job object the
backend knows, the objects a reattached handle deletes, and a selector for its pods."""

import itertools

import pytest
import yaml

from tests.trainops.cluster.credential_cases import CREDENTIAL_IDS, CREDENTIALS
from trainops.cluster.kubernetes.render import (
    BUILDERS,
    JOB_KINDS,
    JOB_OBJECTS,
    job_ref,
    object_refs,
    pod_selector,
    render_manifests,
    review_manifests,
    to_yaml,
)
from trainops.cluster.spec import KINDS, JobSpec

ARGS = ["python", "-m", "trainer", "train", "--config", "s3://bucket/runs/r1/config.yaml"]
# what every kind can carry (a TrainJob takes a named provider and at most 30 s of grace)
PLACEABLE = {"spot_flavour": "gke", "termination_grace_seconds": 30}


def test_every_jobspec_kind_has_a_builder_and_a_job_object():
    assert set(BUILDERS) == set(JOB_OBJECTS) == set(KINDS)
    assert sorted(JOB_KINDS.values()) == sorted(KINDS)


@pytest.mark.parametrize(
    "kind,scheduler",
    [
        (kind, scheduler)
        for kind, scheduler in itertools.product(KINDS, ("default", "volcano", "kueue:team-a"))
        if (kind, scheduler) != ("trainjob", "volcano")  # a TrainJob takes no Volcano (test_trainjob)
    ],
)
def test_the_job_object_is_last_and_a_reattached_handle_finds_everything_launched(kind, scheduler):
    spec = JobSpec(name="train-0123abcd-a1", args=ARGS, kind=kind, nodes=2, scheduler=scheduler, **PLACEABLE)
    manifests = render_manifests(spec)
    launched = [
        {"apiVersion": m["apiVersion"], "kind": m["kind"], "name": m["metadata"]["name"]} for m in manifests
    ]
    job = launched[-1]
    assert job == job_ref(kind, "train-0123abcd-a1")
    assert JOB_KINDS[job["kind"]] == kind
    refs = object_refs(kind, job["name"])
    assert all(ref in refs for ref in launched) and refs[-1] == job  # the job is deleted first


def test_pods_are_selected_by_our_label_or_by_their_jobset():
    assert pod_selector("indexed-job", "j") == {"trainops/job": "j"}
    assert pod_selector("pytorchjob", "j") == {"trainops/job": "j"}
    assert pod_selector("trainjob", "j") == {
        "jobset.sigs.k8s.io/jobset-name": "j",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
    }
    for kind in ("indexed-job", "pytorchjob"):  # the label the selector needs is on the pods
        spec = JobSpec(name="train-0123abcd-a1", args=ARGS, kind=kind, nodes=2)
        job = render_manifests(spec)[-1]
        templates = (
            [job["spec"]["template"]]
            if kind == "indexed-job"
            else [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
        )
        for template in templates:
            assert (
                pod_selector(kind, job["metadata"]["name"]).items() <= template["metadata"]["labels"].items()
            )


def test_kueue_suspends_and_labels_the_job():
    for kind in ("indexed-job", "pytorchjob", "trainjob"):
        spec = JobSpec(
            name="train-0123abcd-a1",
            args=ARGS,
            kind=kind,
            scheduler="kueue:team-a",
            spot_flavour="gke",
            termination_grace_seconds=30,
        )
        job = render_manifests(spec)[-1]
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        suspended = job["spec"].get("suspend") or job["spec"]["runPolicy"].get("suspend")
        assert suspended is True


def test_yaml_keeps_the_build_order_and_writes_no_aliases():
    manifests = render_manifests(JobSpec(name="train-0123abcd-a1", args=ARGS, nodes=2))
    shared = {"key": "dedicated", "operator": "Exists"}
    manifests[-1]["spec"]["template"]["spec"]["tolerations"] = [shared, shared]
    text = to_yaml(manifests)
    assert "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == manifests
    assert text.index("apiVersion") < text.index("kind") < text.index("metadata") < text.index("spec")


def container_env(manifests: list[dict]) -> dict[str, object]:
    """name -> value (or valueFrom) of the trainer container of every pod template in ``manifests``."""
    text = to_yaml(manifests)
    found = {}
    for doc in yaml.safe_load_all(text):
        spec = doc["spec"]
        templates = [spec["template"]["spec"]] if doc["kind"] == "Job" else []
        templates += [r["template"]["spec"] for r in spec.get("pytorchReplicaSpecs", {}).values()]
        envs = [t["containers"][0]["env"] for t in templates]
        envs += [spec["trainer"]["env"]] if doc["kind"] == "TrainJob" else []
        for env in envs:
            for e in env:
                found[e["name"]] = e.get("value", e.get("valueFrom"))
    return found


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name,value,secret", CREDENTIALS, ids=CREDENTIAL_IDS)
def test_the_reviewed_manifests_mask_a_literal_credential_and_say_launch_refuses_it(
    kind, name, value, secret
):
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=ARGS,
        kind=kind,
        env={"AWS_REGION": "eu-west-1", name: value},
        **PLACEABLE,
    )
    manifests, refusal = review_manifests(spec)
    text = to_yaml(manifests)
    assert secret not in text and value not in text
    env = container_env(manifests)
    assert env[name] == "***" and env["AWS_REGION"] == "eu-west-1"  # named, masked; the rest as it is
    assert refusal is not None and f"env {name!r}" in refusal and "env_from_secrets" in refusal
    assert secret not in refusal


def test_a_spec_without_credentials_reviews_as_it_renders():
    spec = JobSpec(name="train-0123abcd-a1", args=ARGS, env={"AWS_ENDPOINT_URL_S3": "http://minio:9000"})
    assert review_manifests(spec) == (render_manifests(spec), None)
