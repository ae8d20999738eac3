"""What every pod carries: GPUs, shared memory, grace, identity, and no literal credentials."""

import pytest

from tests.trainops.cluster.credential_cases import CREDENTIAL_IDS, CREDENTIALS
from trainops.cluster.kubernetes.render import render_manifests, to_yaml
from trainops.cluster.spec import KINDS, JobSpec, JobSpecError

ARGS = ["python", "-m", "trainer", "train", "--config", "s3://bucket/runs/r1/config.yaml"]


def pods(**kw) -> list[dict]:
    spec = JobSpec(**{"name": "train-0123abcd-a1", "args": ARGS, **kw})
    out = []
    for m in render_manifests(spec):
        if m["kind"] == "Job":
            out.append(m["spec"]["template"]["spec"])
        elif m["kind"] == "PyTorchJob":
            out += [r["template"]["spec"] for r in m["spec"]["pytorchReplicaSpecs"].values()]
    return out


@pytest.mark.parametrize("kind", ["indexed-job", "pytorchjob"])
def test_gpu_pod_resources_shm_grace_and_non_root(kind):
    for pod in pods(kind=kind, nodes=2, gpus_per_node=8, shm_size="32Gi", termination_grace_seconds=120):
        (c,) = pod["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert pod["terminationGracePeriodSeconds"] == 120
        timeout = int(next(a for a in c["command"] if a.startswith("--shutdown-timeout=")).split("=")[1])
        assert 0 < timeout < 120
        assert "--nproc-per-node=8" in c["command"] and "--nnodes=2" in c["command"]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_cpu_pod_has_no_gpu_resource_and_plain_process_when_not_distributed():
    (pod,) = pods(gpus_per_node=0, distributed=False)
    c = pod["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert c["command"] == ARGS
    assert "subdomain" not in pod


def test_s3_endpoint_nccl_and_secrets_by_reference():
    (pod,) = pods(
        env={"AWS_ENDPOINT_URL_S3": "http://minio:9000", "AWS_REGION": "eu-west-1"},
        nccl_env={"NCCL_IB_DISABLE": "1"},
        service_account="trainer",
        env_from_secrets=["wandb", {"env": "AWS_SECRET_ACCESS_KEY", "secret": "s3", "key": "secret"}],
    )
    c = pod["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_ENDPOINT_URL_S3"]["value"] == "http://minio:9000"
    assert env["AWS_REGION"]["value"] == "eu-west-1"
    assert env["NCCL_IB_DISABLE"]["value"] == "1"
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}},
    }
    assert c["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert pod["serviceAccountName"] == "trainer"
    # the Node's name, for a spot notice to say which node is going away (trainer.runtime.notice)
    assert env["TRAINOPS_NODE_NAME"] == {
        "name": "TRAINOPS_NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    # torchrun's store unshared, so that a restart in place never reads its predecessor's keys
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"


@pytest.mark.parametrize(
    "field,name",
    [
        ("env", "AWS_SECRET_ACCESS_KEY"),
        ("env", "AWS_ACCESS_KEY_ID"),
        ("env", "AWS_SESSION_TOKEN"),
        ("env", "DB_PASSWORD"),
        ("env", "HF_TOKEN"),
        ("nccl_env", "NCCL_TOKEN"),
    ],
)
def test_literal_credentials_are_rejected(field, name):
    with pytest.raises(JobSpecError, match=f"{name}.*env_from_secrets"):
        pods(**{field: {name: "hunter2"}})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name,value,secret", CREDENTIALS, ids=CREDENTIAL_IDS)
def test_launch_refuses_a_literal_credential_naming_the_variable_never_its_value(kind, name, value, secret):
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=ARGS,
        kind=kind,
        spot_flavour="gke",  # what every kind can place
        termination_grace_seconds=30,
        env={"AWS_REGION": "eu-west-1", name: value},
    )
    with pytest.raises(JobSpecError) as refused:
        render_manifests(spec)  # what the backend submits, and what a launch renders first
    message = str(refused.value)
    assert f"env {name!r}" in message and "env_from_secrets" in message and "service_account" in message
    assert secret not in message and value not in message
    assert "AWS_REGION" not in message  # only the credential is named


def test_every_literal_credential_is_named_at_once():
    env = {name: value for name, value, _ in CREDENTIALS}
    with pytest.raises(JobSpecError) as refused:
        render_manifests(JobSpec(name="train-0123abcd-a1", args=ARGS, env=env))
    message = str(refused.value)
    assert all(repr(name) in message for name in env)
    assert not any(secret in message for _, _, secret in CREDENTIALS)
    assert "look like credentials (values not shown)" in message


@pytest.mark.parametrize(
    "name,value",
    [
        ("AWS_ENDPOINT_URL_S3", "http://minio.storage:9000"),
        ("AWS_REGION", "eu-west-1"),
        ("TRAINOPS_ATTEMPT", "1"),
        ("TRAINOPS_GPUS_PER_NODE", "8"),
        ("TRAINOPS_STORAGE_OUTAGE_TOLERANCE_S", "120"),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ("PYTHONHASHSEED", "0"),
        ("HF_HOME", "/cache/hf"),
        ("HF_HUB_OFFLINE", "1"),
        ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1"),  # a switch, not a token
        ("HF_TOKEN_PATH", "/var/run/secrets/hf/token"),  # where the token is mounted
        ("TOKENIZERS_PARALLELISM", "false"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/var/run/secrets/aws/credentials"),
        ("GOOGLE_APPLICATION_CREDENTIALS", "/var/run/secrets/gcp/key.json"),
        ("WANDB_PROJECT", "search"),
        ("OMP_NUM_THREADS", "4"),
    ],
)
def test_the_variables_a_job_legitimately_sets_are_not_refused(name, value):
    (pod,) = pods(env={name: value}, nccl_env={"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"})
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env[name] == value and env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_no_literal_secret_value_reaches_the_manifest():
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=ARGS,
        env_from_secrets=[{"env": "AWS_SECRET_ACCESS_KEY", "secret": "s3", "key": "secret"}],
    )
    assert "hunter2" not in to_yaml(render_manifests(spec))


def test_bad_nccl_variable_and_bad_secret_ref_are_named():
    with pytest.raises(JobSpecError, match=r"'OMP_NUM_THREADS'.*put it in env"):
        pods(nccl_env={"OMP_NUM_THREADS": "4"})
    with pytest.raises(JobSpecError, match=r"env_from_secrets entry.*Secret name"):
        JobSpec(name="x", args=ARGS, env_from_secrets=[{"secret": "s3"}])


def test_priority_volcano_and_identity():
    (pod,) = pods(priority_class="batch-low", scheduler="volcano")
    assert pod["priorityClassName"] == "batch-low"
    assert pod["schedulerName"] == "volcano"
    assert pod["automountServiceAccountToken"] is False
    (pod,) = pods()
    assert "schedulerName" not in pod and "serviceAccountName" not in pod


def _argvs(manifest: dict) -> list[list[str]]:
    """Every trainer container's argument list in one manifest, whatever its kind."""
    body = manifest.get("spec", {})
    if manifest["kind"] == "Job":
        return [c["command"] for c in body["template"]["spec"]["containers"]]
    if manifest["kind"] == "PyTorchJob":
        return [
            c["command"]
            for r in body["pytorchReplicaSpecs"].values()
            for c in r["template"]["spec"]["containers"]
        ]
    if manifest["kind"] == "TrainJob":
        return [body["trainer"]["command"] + body["trainer"]["args"]]
    return []


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_with_our_rendezvous_lets_torchrun_restart_a_nodes_workers_as_often_as_the_spec_says(kind):
    spec = JobSpec(
        name="train-0123abcd-a1",
        args=ARGS,
        kind=kind,
        nodes=2,
        spot_flavour="gke",  # what every kind can place
        termination_grace_seconds=30,
        restarts_in_place=2,
    )
    argvs = [argv for m in render_manifests(spec) for argv in _argvs(m)]
    restarts = "--max-restarts=0" if kind == "trainjob" else "--max-restarts=2"  # static: see below
    assert argvs and all([a for a in argv if a.startswith("--max-restarts")] == [restarts] for argv in argvs)
    for pod in pods(kind="indexed-job", restarts_in_place=2):
        assert pod["restartPolicy"] == "Never"  # the restarts are torchrun's, inside the container


def test_static_command_leaves_rendezvous_to_the_runtime_and_keeps_the_shutdown_timeout():
    from trainops.cluster.kubernetes.pod import static_command

    spec = JobSpec(
        name="train-0123abcd-a1", args=ARGS, nodes=2, gpus_per_node=8, termination_grace_seconds=40
    )
    assert static_command(spec) == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=8",
        f"--shutdown-timeout={spec.shutdown_timeout_s}",
        "--max-restarts=0",
        "-m",
        "trainer",
        *ARGS[3:],
    ]
    # torchrun's static rendezvous never restarts the other nodes' workers with a restarted
    # node's (num_nodes_waiting is always 0) and shares one store across rounds: no restart in
    # place, whatever restarts_in_place says
    restarting = JobSpec(name="train-0123abcd-a1", args=ARGS, nodes=2, restarts_in_place=3)
    assert [a for a in static_command(restarting) if a.startswith("--max-restarts")] == ["--max-restarts=0"]
    # a trainer argument that looks like a torchrun flag is the trainer's, and is kept
    odd = JobSpec(name="train-0123abcd-a1", args=[*ARGS, "--rdzv-note=x"])
    assert static_command(odd)[-1] == "--rdzv-note=x"
    plain = JobSpec(name="train-0123abcd-a1", args=ARGS, distributed=False)
    assert static_command(plain) == ARGS


def test_a_sized_cache_gets_its_limit_and_the_pod_requests_the_disk():
    from trainops.cluster.kubernetes import pod
    from trainops.cluster.spec import JobSpec

    sized = JobSpec(name="t", args=["x"], cache_size="180Gi", ephemeral_storage="200Gi")
    assert pod.resources(sized)["requests"]["ephemeral-storage"] == "200Gi"
    assert "ephemeral-storage" not in pod.resources(sized)["limits"]  # logs count against a limit
    assert {"name": "cache", "emptyDir": {"sizeLimit": "180Gi"}} in pod.volumes(sized)
    cache_only = JobSpec(name="t", args=["x"], cache_size="40Gi")
    assert pod.resources(cache_only)["requests"]["ephemeral-storage"] == "40Gi"
    unsized = JobSpec(name="t", args=["x"])
    assert "ephemeral-storage" not in pod.resources(unsized)["requests"]
    assert {"name": "cache", "emptyDir": {}} in pod.volumes(unsized)
