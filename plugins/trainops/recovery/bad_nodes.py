"""Nodes to keep a relaunch away from: the ones this run's attempts failed on for the node's
sake, twice. Pure, over ``job.json``'s attempt entries.

A few nodes cause most failures at scale (a flaky GPU, a bad NIC, a full disk), and a gang
relaunched onto the node that just hung is likely to hang again. So a node earns a **strike**
when an attempt ended on it for a reason that is the node's, not the program's nor the cloud's:

- **hung** (the hang detector stopped it): a strike for the node, when the gang had one node.
  A gang of several nodes that hangs says nothing about which one stalled (rank 0's heartbeat
  is all there is), so no node of it is struck: blaming them all would exclude the whole pool.
- **infra** (the infrastructure stopped it): a strike for each node the backend names as lost or
  evicted for a node reason (NotReady, gone, the node low on memory or disk), not for a spot
  reclaim (``preempted``), which is the cloud's call, nor for a pod over its own limits.

A node the cloud announced it is taking back (the attempt record's ``notice``, whose ``node``
the downward API named) is kept off the next launch at once, one notice being enough, for
:data:`NOTICED_TTL_S`: a gang relaunched onto it before it goes would read the same notice and
stop again, spending a preemption each time (nothing cordons a node without Karpenter's
interruption handling or the Node Termination Handler).

When an attempt that kept off nodes found no node at all (unschedulable: a fixed pool that
small), the next one keeps off none: waiting hours for strikes to expire is worse.

A node with :data:`STRIKES` strikes within ``ttl_s`` (a node may be repaired or replaced: the
strikes expire) is excluded from the next launch's placement: a node affinity that no pod may
be scheduled on (``JobSpec.avoid_nodes``; ``metadata.name NotIn``). At most :data:`MAX_AVOIDED`
nodes, those struck most recently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

STRIKES = 2
DEFAULT_TTL_S = 6 * 3600.0
MAX_AVOIDED = 8
NOTICED_TTL_S = 1800.0  # a noticed node is gone well before this (AWS: 2 min; GCE, Azure: 30 s)
# A pod or disruption reason that is the node's doing (Kubernetes' words, lower case). An
# eviction counts only for node pressure ("The node was low on resource"): a pod evicted for
# its own ephemeral-storage limit, or a container killed for its own memory limit, is the job's.
NODE_REASONS = (
    "nodelost",
    "notready",
    "node not ready",
    "nodeshutdown",
    "deletionbypodgc",
    "the node was low on resource",
    "node vanished",
    "node is gone",
)


@dataclass(frozen=True)
class Strike:
    node: str
    attempt: int
    why: str
    at: float  # epoch seconds: when the attempt ended


def _at(entry: Mapping[str, Any]) -> float | None:
    text = entry.get("ended_at")
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text else None
    except ValueError:
        return None


def _node_reason(*texts: object) -> bool:
    joined = " ".join(str(t).lower() for t in texts if t)
    return any(r in joined for r in NODE_REASONS) and "preempt" not in joined and "spot" not in joined


def strikes(attempts: Iterable[Mapping[str, Any]]) -> list[Strike]:
    """Every strike the ended attempts give (see the module docstring), oldest first."""
    out: list[Strike] = []
    for entry in attempts:
        at = _at(entry)
        classification = (entry.get("decision") or {}).get("classification") or entry.get("classification")
        state = entry.get("state") or {}
        nodes = [n for n in state.get("nodes") or [] if isinstance(n, Mapping)]
        named: dict[Any, str] = {n.get("index"): str(n["node_name"]) for n in nodes if n.get("node_name")}
        if at is None or not named:
            continue
        attempt = int(entry.get("attempt") or 0)
        if classification == "hung" and len(nodes) == 1:
            out += [Strike(name, attempt, "hung", at) for name in named.values()]
        elif classification == "infra":
            for disruption in state.get("disruptions") or []:
                name = named.get(disruption.get("node"))
                if name and _node_reason(disruption.get("reason"), disruption.get("message")):
                    out.append(Strike(name, attempt, f"infra: {disruption.get('reason')}", at))
            for node in nodes:
                if node.get("node_name") and _node_reason(node.get("reason"), node.get("message")):
                    out.append(Strike(node["node_name"], attempt, f"infra: {node.get('reason')}", at))
    unique = {(s.node, s.attempt): s for s in out}  # one strike per node and attempt
    return sorted(unique.values(), key=lambda s: (s.at, s.attempt))


def noticed(attempts: Iterable[Mapping[str, Any]]) -> list[Strike]:
    """The nodes the cloud's interruption notices named (each attempt record's ``notice``)."""
    out = []
    for entry in attempts:
        notice = (entry.get("record") or {}).get("notice") or {}
        at, nodes = notice.get("noticed_at"), notice.get("nodes")
        if not isinstance(nodes, list):  # a record from before ``nodes``
            nodes = [notice.get("node")]
        if not isinstance(at, int | float):
            continue
        event = f"spot notice: {notice.get('provider')} {notice.get('event')}"
        for node in nodes:
            if isinstance(node, str) and node:
                out.append(Strike(node, int(entry.get("attempt") or 0), event, float(at)))
    return out


def avoided(
    attempts: Sequence[Mapping[str, Any]], *, now: float, ttl_s: float = DEFAULT_TTL_S
) -> dict[str, list[Strike]]:
    """The nodes to keep the next launch off, each with its strikes (newest-struck first, at
    most :data:`MAX_AVOIDED`); ``ttl_s`` <= 0: none (exclusion off)."""
    if ttl_s <= 0:
        return {}
    by_node: dict[str, list[Strike]] = {}
    for strike in strikes(attempts):
        if now - strike.at <= ttl_s:
            by_node.setdefault(strike.node, []).append(strike)
    bad = {n: s for n, s in by_node.items() if len(s) >= STRIKES}
    for strike in noticed(attempts):
        if now - strike.at <= NOTICED_TTL_S:
            bad.setdefault(strike.node, []).append(strike)
    last = attempts[-1] if attempts else {}
    if bad and (last.get("state") or {}).get("unschedulable") and (last.get("spec") or {}).get("avoid_nodes"):
        return {}  # the exclusion left the last attempt no node: the pool is that small, so drop it
    newest = sorted(bad, key=lambda n: -bad[n][-1].at)[:MAX_AVOIDED]
    return {n: bad[n] for n in newest}


def describe(found: Mapping[str, list[Strike]]) -> str:
    """One line for the task log: each node and the attempts that struck it."""
    return "; ".join(
        f"{node} ({', '.join(f'attempt {s.attempt}: {s.why}' for s in marks)})"
        for node, marks in found.items()
    )
