"""Which nodes a relaunch keeps off: struck twice for the node's sake, within the TTL; and, on
the simulated control plane, the next attempt's pods land elsewhere."""

from datetime import UTC, datetime

import pytest

from trainops.recovery.bad_nodes import MAX_AVOIDED, avoided, describe, strikes

T0 = datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp()


def entry(attempt, classification, nodes, *, minutes=0, disruptions=(), reasons=None):
    return {
        "attempt": attempt,
        "classification": classification,
        "ended_at": datetime.fromtimestamp(T0 + 60 * minutes, UTC).isoformat(),
        "state": {
            "nodes": [
                {"index": i, "node_name": n, "reason": (reasons or {}).get(n)} for i, n in enumerate(nodes)
            ],
            "disruptions": list(disruptions),
        },
    }


def test_a_single_node_that_hung_twice_is_avoided():
    attempts = [entry(1, "hung", ["node-a"]), entry(2, "hung", ["node-a"], minutes=20)]
    found = avoided(attempts, now=T0 + 3600)
    assert list(found) == ["node-a"] and [s.attempt for s in found["node-a"]] == [1, 2]
    assert describe(found) == "node-a (attempt 1: hung, attempt 2: hung)"
    assert avoided(attempts[:1], now=T0 + 3600) == {}  # once is not enough


def test_a_multi_node_hang_strikes_no_node():
    """Rank 0's heartbeat cannot say which node stalled: blaming them all would empty the pool."""
    attempts = [entry(1, "hung", ["node-a", "node-b"]), entry(2, "hung", ["node-a", "node-b"], minutes=20)]
    assert strikes(attempts) == [] and avoided(attempts, now=T0) == {}


def test_node_reasons_strike_and_spot_reclaims_do_not():
    lost = {"node": 1, "reason": "NodeLost", "message": "node node-b is not ready"}
    reclaimed = {"node": 1, "reason": "DisruptionTarget", "message": "preempted: spot instance reclaimed"}
    attempts = [
        entry(1, "infra", ["node-a", "node-b"], disruptions=[lost]),
        entry(2, "preempted", ["node-a", "node-b"], minutes=5, disruptions=[reclaimed]),
        entry(
            3,
            "infra",
            ["node-c", "node-b"],
            minutes=10,
            reasons={"node-b": "The node was low on resource: memory"},
        ),
        # a pod over its own limits is the job's fault, not the node's
        entry(
            4,
            "infra",
            ["node-c"],
            minutes=12,
            reasons={"node-c": "Pod ephemeral local storage usage exceeds the total limit"},
        ),
        entry(5, "infra", ["node-c"], minutes=14, reasons={"node-c": "OOMKilled"}),
    ]
    assert [(s.node, s.attempt) for s in strikes(attempts)] == [("node-b", 1), ("node-b", 3)]
    assert list(avoided(attempts, now=T0 + 600)) == ["node-b"]


def test_an_exclusion_that_left_no_node_is_dropped():
    """A fixed pool that small: the attempt that kept off node-a found no node; the next keeps off none."""
    attempts = [entry(1, "hung", ["node-a"]), entry(2, "hung", ["node-a"], minutes=20)]
    stuck = {**entry(3, "infra", [], minutes=40), "spec": {"avoid_nodes": ["node-a"]}}
    stuck["state"]["unschedulable"] = True
    assert list(avoided(attempts, now=T0 + 3600)) == ["node-a"]
    assert avoided([*attempts, stuck], now=T0 + 3600) == {}


def test_strikes_expire_and_the_list_is_bounded():
    attempts = [entry(1, "hung", ["node-a"]), entry(2, "hung", ["node-a"], minutes=1)]
    assert avoided(attempts, now=T0 + 7 * 3600) == {}  # past the 6 h TTL: repaired, or replaced
    assert avoided(attempts, now=T0 + 120, ttl_s=0) == {}  # exclusion off
    many = [entry(i, "hung", [f"n{i // 2}"], minutes=i) for i in range(2 * (MAX_AVOIDED + 3))]
    found = avoided(many, now=T0 + 3600)
    assert len(found) == MAX_AVOIDED and "n0" not in found  # the most recently struck kept


@pytest.fixture
def plane():
    from tests.trainops.cluster.kubernetes.control_plane import ControlPlane

    simulated = ControlPlane()
    for name in ("node-a", "node-b"):
        simulated.add_node(name)
    return simulated


def test_on_the_simulated_control_plane_the_next_attempt_lands_on_another_node(plane):
    from trainops.cluster.kubernetes.backend import KubernetesCluster
    from trainops.cluster.spec import JobSpec

    attempts = [entry(1, "hung", ["node-a"]), entry(2, "hung", ["node-a"], minutes=20)]
    avoid = sorted(avoided(attempts, now=T0 + 3600))
    spec = JobSpec(
        name="train-0a1b2c3d-a3",
        args=["python", "-m", "trainer", "train"],
        nodes=1,
        namespace="ml",
        spot_flavour="gke",
        avoid_nodes=avoid,
    )
    KubernetesCluster(hook=plane, clock=plane.clock, sleep=plane.sleep).launch(spec)
    plane.tick(3)
    (pod,) = plane.pods()
    assert pod["spec"]["nodeName"] == "node-b"  # node-a, first in order, is kept off
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert all(
        {"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]} in t["matchFields"]
        for t in terms["nodeSelectorTerms"]
    )


def test_a_node_the_cloud_announced_is_kept_off_the_next_launch_at_once_for_a_while():
    stopped = entry(1, "preempted", ["ip-10-0-1-7", "ip-10-0-1-8"])
    stopped["record"] = {
        "notice": {
            "provider": "aws",
            "event": "spot/instance-action: terminate",
            "noticed_at": T0,
            "node": "ip-10-0-1-8",
        }
    }
    found = avoided([stopped], now=T0 + 60)
    assert list(found) == ["ip-10-0-1-8"]  # one notice is enough; the other node stays usable
    assert describe(found) == "ip-10-0-1-8 (attempt 1: spot notice: aws spot/instance-action: terminate)"
    assert avoided([stopped], now=T0 + 3600) == {}  # long gone by then: no need to keep off its name
    older = {**stopped, "record": {"notice": {**stopped["record"]["notice"], "node": None}}}
    assert avoided([older], now=T0 + 60) == {}  # a notice without a node (no downward API) names none
    two = {
        **stopped,
        "record": {"notice": {**stopped["record"]["notice"], "nodes": ["ip-10-0-1-7", "ip-10-0-1-8"]}},
    }
    assert sorted(avoided([two], now=T0 + 60)) == ["ip-10-0-1-7", "ip-10-0-1-8"]  # both nodes read one
