"""The Kubernetes backend against a real cluster (opt in).

Runs only when ``KUBECONFIG`` points at a cluster and ``TRAINOPS_TRAINER_IMAGE`` names an
image it can pull (the trainer image; it runs as uid 10001). The job goes to
``TRAINOPS_K8S_NAMESPACE`` (default ``default``) through the ``kubernetes_default``
connection, which falls back to ``KUBECONFIG`` when no such connection is defined.
``TRAINOPS_SYSTEM_DEADLINE_S`` (default 300) is how long a job may take, image pull included.

    KUBECONFIG=~/.kube/config TRAINOPS_TRAINER_IMAGE=ghcr.io/you/trainops-trainer:dev \\
        .venv/bin/python -m pytest tests/system -m system -q

The rendezvous test launches a distributed 2-node CPU job of each kind: ``indexed-job``
always, ``pytorchjob`` and ``trainjob`` only where their CRD is installed (each skips naming
what to install otherwise; ``trainjob`` also needs the ``torch-distributed``
ClusterTrainingRuntime).
"""

import os
import re
import time
import uuid

import pytest

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="no cluster: set KUBECONFIG"),
]

DEADLINE_S = float(os.environ.get("TRAINOPS_SYSTEM_DEADLINE_S", "300"))


def wait_until(check, what: str, deadline_s: float = DEADLINE_S, explain=None):
    """Poll ``check`` until it returns a truthy value; fail naming ``what`` at the deadline,
    with what ``explain()`` says (a log tail) when given."""
    end = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            detail = f"\n{_said(explain)}" if explain else ""
            raise AssertionError(f"{what} not reached within {deadline_s}s{detail}")
        time.sleep(2)


def _said(explain) -> str:
    """What ``explain()`` says, or why it could not say it (an API error must not hide the
    timeout it explains)."""
    try:
        return explain()
    except Exception as exc:
        return f"(could not read more: {exc!r})"


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


# -- rendezvous: a distributed 2-node job of each kind ----------------------------------
# torchrun's agent logs its rendezvous result at INFO (LOGLEVEL), one field a line:
#   I1206 02:20:40.485000 7 .../elastic/agent/server/api.py:553]   group_world_size=2
_RDZV_FIELD = re.compile(r"^\[node-(\d+)\] .*\]\s+(group_rank|group_world_size)=(\d+)\s*$")
# the header of the table `python -m trainer presets` prints
_PRESETS_HEADER = re.compile(r"^\[node-(\d+)\] preset\s+layers\s", re.MULTILINE)


def rendezvous_results(tail: str) -> dict[int, dict[str, int]]:
    """Each node's rendezvous result in a ``logs_tail``: {node: {"group_rank": r,
    "group_world_size": n}}; a node whose agent never finished the rendezvous is missing."""
    out: dict[int, dict[str, int]] = {}
    for line in tail.splitlines():
        found = _RDZV_FIELD.match(line)
        if found:
            out.setdefault(int(found.group(1)), {})[found.group(2)] = int(found.group(3))
    return out


def missing_prerequisite(cluster, kind: str) -> str | None:
    """Why the cluster cannot run ``kind`` (its CRD, or the Trainer runtime, is missing), read
    from the API; None when it can, or when the API does not let us tell (403: the launch
    will say)."""
    if kind == "indexed-job":
        return None  # batch/v1: every cluster has it
    from trainops.cluster.kubernetes import pytorchjob, trainjob
    from trainops.cluster.kubernetes.backend import CUSTOM_KINDS
    from trainops.cluster.spec import JobSpecError

    api_kind = {"pytorchjob": pytorchjob.KIND, "trainjob": trainjob.KIND}[kind]
    group, version, plural = CUSTOM_KINDS[api_kind]
    client = cluster.hook.custom_object_client
    try:
        schema = cluster.served_schema(api_kind)  # JobSpecError: no CRD, or not this version
    except JobSpecError as exc:
        return str(exc)
    if schema is None:  # no right to read CRDs: listing the kind answers 404 without its CRD
        try:
            client.list_namespaced_custom_object(group, version, cluster.namespace, plural, limit=1)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return f"the cluster serves no {group}/{version} {plural} (list: 404)"
            if getattr(exc, "status", None) != 403:
                raise
    if kind == "trainjob":
        runtime = trainjob.STOCK_RUNTIME
        try:
            client.get_cluster_custom_object(group, version, "clustertrainingruntimes", runtime)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return (
                    f"the cluster has Kubeflow Trainer but no ClusterTrainingRuntime {runtime!r} "
                    "(install Trainer's default runtimes)"
                )
            if getattr(exc, "status", None) != 403:
                raise
    return None


@pytest.mark.parametrize("kind", ["indexed-job", "pytorchjob", "trainjob"])
def test_a_two_node_cpu_job_of_each_kind_rendezvous_and_succeeds(kind):
    """What a user would notice: both torchrun agents joined one rendezvous (world size 2,
    node ranks 0 and 1), the trainer ran on both nodes, the job succeeded, and nothing is left
    after delete.

    The workers run ``python -m trainer presets``: a distributed JobSpec's ``args`` must be
    ``python -m trainer ...`` (torchrun wraps them as ``-m trainer``), and ``presets`` is the
    one command that needs neither a config nor a dataset. The rendezvous is torchrun's own
    (c10d at node 0's DNS name, the operator's Master Service, or Trainer's static PET_*
    variables), logged by each agent with ``LOGLEVEL=INFO``."""
    image = os.environ.get("TRAINOPS_TRAINER_IMAGE")
    if not image:
        pytest.skip("set TRAINOPS_TRAINER_IMAGE to an image the cluster can pull")
    from trainops.cluster import get_cluster
    from trainops.cluster.base import FINAL_PHASES
    from trainops.cluster.spec import JobSpec

    namespace = os.environ.get("TRAINOPS_K8S_NAMESPACE", "default")
    cluster = get_cluster("kubernetes", namespace=namespace)
    why = missing_prerequisite(cluster, kind)
    if why:
        pytest.skip(f"kind {kind!r} cannot run on this cluster: {why}")
    run = uuid.uuid4().hex[:8]
    spec = JobSpec(
        name=f"trainops-rdzv-{run}",
        kind=kind,
        nodes=2,
        gpus_per_node=0,  # one CPU process per node
        distributed=True,
        image=image,
        namespace=namespace,
        cpu="250m",
        memory="1Gi",  # torchrun's agent imports torch
        capacity="on-demand",
        args=["python", "-m", "trainer", "presets"],
        env={"LOGLEVEL": "INFO"},  # torchrun's agents log their rendezvous result
        labels={"trainops/system-test": run, "trainops/attempt": "1"},
        termination_grace_seconds=5,
    )
    handle = cluster.launch(spec)
    try:

        def tail() -> str:
            return f"log tail:\n{cluster.logs_tail(handle, lines=80)}"

        state = wait_until(
            lambda: (s := cluster.status(handle))["phase"] in FINAL_PHASES and s,
            f"a final phase of the {kind}{'' if kind == 'indexed-job' else ' (is its operator running?)'}",
            explain=lambda: f"{cluster.status(handle)}\n{tail()}",
        )
        logs = tail()
        assert state["phase"] == "succeeded", f"{state}\n{logs}"
        assert [n["exit_code"] for n in state["nodes"]] == [0, 0], f"{state}\n{logs}"
        results = rendezvous_results(logs)
        assert results.get(0, {}).get("group_world_size") == 2, f"node 0 saw no world of 2\n{logs}"
        assert results.get(1, {}).get("group_world_size") == 2, f"node 1 saw no world of 2\n{logs}"
        ranks = sorted(r.get("group_rank", -1) for r in results.values())
        assert ranks == [0, 1], f"node ranks {ranks}, not [0, 1]\n{logs}"
        ran = sorted({int(n) for n in _PRESETS_HEADER.findall(logs)})
        assert ran == [0, 1], f"the trainer ran on nodes {ran}, not [0, 1]\n{logs}"
    finally:
        cluster.delete(handle)
    wait_until(
        lambda: cluster.all_gone(handle),
        f"no pod of the {kind} left after delete",
        explain=lambda: (
            f"pods still there: {[(n.get('pod'), n.get('phase')) for n in cluster.status(handle)['nodes']]}"
        ),
    )
