"""The Kubernetes backend against a real cluster (opt in).

Runs only when ``KUBECONFIG`` points at a cluster and ``TRAINOPS_TRAINER_IMAGE`` names an
image it can pull (the trainer image; it runs as uid 10001). The job goes to
``TRAINOPS_K8S_NAMESPACE`` (default ``default``) through the ``kubernetes_default``
connection, which falls back to ``KUBECONFIG`` when no such connection is defined.

    KUBECONFIG=~/.kube/config TRAINOPS_TRAINER_IMAGE=ghcr.io/you/trainops-trainer:dev \\
        .venv/bin/python -m pytest tests/system -m system -q
"""

import os
import time
import uuid

import pytest

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="no cluster: set KUBECONFIG"),
]

DEADLINE_S = 300


def wait_until(check, what: str, deadline_s: float = DEADLINE_S):
    """Poll ``check`` until it returns a truthy value; fail naming ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {deadline_s}s")
        time.sleep(2)


def test_a_tiny_cpu_indexed_job_succeeds_and_is_deleted():
    image = os.environ.get("TRAINOPS_TRAINER_IMAGE")
    if not image:
        pytest.skip("set TRAINOPS_TRAINER_IMAGE to an image the cluster can pull")
    from trainops.cluster import get_cluster
    from trainops.cluster.base import FINAL_PHASES
    from trainops.cluster.spec import JobSpec

    namespace = os.environ.get("TRAINOPS_K8S_NAMESPACE", "default")
    cluster = get_cluster("kubernetes", namespace=namespace)
    run = uuid.uuid4().hex[:8]
    spec = JobSpec(
        name=f"trainops-system-{run}",
        nodes=2,
        distributed=False,
        image=image,
        namespace=namespace,
        cpu="100m",
        memory="256Mi",
        capacity="on-demand",
        args=["python", "-c", "print('trainops system test ok')"],
        labels={"trainops/system-test": run, "trainops/attempt": "1"},
        termination_grace_seconds=5,
    )
    handle = cluster.launch(spec)
    try:
        assert [h["job_id"] for h in cluster.find({"trainops/system-test": run})] == [handle["job_id"]]
        state = wait_until(
            lambda: (s := cluster.status(handle))["phase"] in FINAL_PHASES and s,
            "a final phase",
        )
        logs = cluster.logs_tail(handle, lines=5)
        assert state["phase"] == "succeeded", (state, logs)
        assert [n["exit_code"] for n in state["nodes"]] == [0, 0]
        assert "[node-0] trainops system test ok" in logs
        assert "[node-1] trainops system test ok" in logs
        lines, _ = cluster.log_lines(handle, None)  # what the trigger streams into the task log
        assert "trainops system test ok" in lines
        assert cluster.find({"trainops/system-test": run}) == []  # finished: nothing to reattach
    finally:
        cluster.delete(handle)
    wait_until(lambda: cluster.all_gone(handle), "no pod left after delete")
