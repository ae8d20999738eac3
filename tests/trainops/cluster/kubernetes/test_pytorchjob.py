"""The ``pytorchjob`` kind: a Kubeflow PyTorchJob whose Master hosts the rendezvous and whose
replicas never restart."""

from trainops.cluster.kubernetes.render import render_manifests
from trainops.cluster.spec import JobSpec

ARGS = ["python", "-m", "trainer", "train", "--config", "s3://bucket/runs/r1/config.yaml"]


def test_pytorchjob_replicas_and_gang():
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=ARGS,
        kind="pytorchjob",
        nodes=4,
        gpus_per_node=8,
        scheduler="volcano:training",
        priority_class="batch-low",
    )
    (pj,) = render_manifests(spec)
    replicas = pj["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    assert {r["restartPolicy"] for r in replicas.values()} == {"Never"}
    assert pj["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 4,
        "queue": "training",
        "priorityClass": "batch-low",
    }
    for replica in replicas.values():
        assert replica["template"]["spec"]["schedulerName"] == "volcano"
    master = replicas["Master"]["template"]["spec"]["containers"][0]["command"]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert "--rdzv-endpoint=train-0123abcd-a1-master-0:29500" in master
    assert "--rdzv-conf=is_host=1" in master and "--rdzv-conf=is_host=0" in worker
    single = render_manifests(JobSpec(name="train-0123abcd-a1", args=ARGS, kind="pytorchjob"))[0]
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_run_policy_keeps_finished_pods_and_never_retries():
    (pj,) = render_manifests(JobSpec(name="train-0123abcd-a1", args=ARGS, kind="pytorchjob", gpus_per_node=8))
    assert pj["spec"]["runPolicy"] == {"cleanPodPolicy": "None", "backoffLimit": 0}
    assert pj["spec"]["nprocPerNode"] == "8"  # the CRD's type: a string
    (container,) = pj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert container["name"] == "pytorch"
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"}]
