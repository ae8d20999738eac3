"""The ``indexed-job`` kind: a headless Service and an Indexed Job that fails as a whole, plus a
PodGroup when Volcano gang-schedules it."""

from trainops.cluster.kubernetes import indexed_job
from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec

ARGS = ["python", "-m", "trainer", "train", "--config", "s3://bucket/runs/r1/config.yaml"]


def test_indexed_job_gang_semantics_and_rendezvous():
    spec = JobSpec(name="train-0123abcd-a1", args=ARGS, namespace="ml", nodes=4, gpus_per_node=8)
    service, job = render_manifests(spec)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["backoffLimit"] == 0
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[1]["onExitCodes"] == {"operator": "NotIn", "values": [0]}
    pod = job["spec"]["template"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == 29500
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    argv = pod["spec"]["containers"][0]["command"]
    assert "--rdzv-endpoint=train-0123abcd-a1-0.train-0123abcd-a1.ml.svc.cluster.local:29500" in argv
    assert not any(a.startswith("--rdzv-conf") for a in argv)  # same args for every index


def test_volcano_gang_is_a_pod_group_named_in_the_pods():
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=ARGS,
        nodes=4,
        scheduler="volcano:training",
        priority_class="batch-low",
    )
    manifests = render_manifests(spec)
    assert [m["kind"] for m in manifests] == ["Service", "PodGroup", "Job"]  # the pods find them
    _, group, job = manifests
    assert (group["apiVersion"], group["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
    assert group["metadata"]["name"] == job["metadata"]["name"]
    assert group["spec"] == {"minMember": 4, "queue": "training", "priorityClassName": "batch-low"}
    pod = job["spec"]["template"]
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == job["metadata"]["name"]
    assert pod["spec"]["schedulerName"] == "volcano"
    (_, group, _) = render_manifests(JobSpec(name="train-0123abcd-a1", args=ARGS, scheduler="volcano"))
    assert group["spec"] == {"minMember": 1}  # Volcano's default queue


def test_a_plain_process_needs_no_service():
    spec = JobSpec(name="train-0123abcd-a1", args=ARGS, distributed=False)
    (job,) = render_manifests(spec)
    assert job["kind"] == "Job" and "subdomain" not in job["spec"]["template"]["spec"]


def test_object_refs_name_every_object_a_launch_can_create_in_creation_order():
    spec = JobSpec(name="train-0123abcd-a1", args=ARGS, nodes=2, scheduler="volcano")
    created = [(m["apiVersion"], m["kind"], m["metadata"]["name"]) for m in render_manifests(spec)]
    refs = [(r["apiVersion"], r["kind"], r["name"]) for r in indexed_job.object_refs("train-0123abcd-a1")]
    assert refs == created
    assert refs[-1] == ("batch/v1", "Job", "train-0123abcd-a1")  # the job last: deleted first
