"""The training operator's sizing settings, checked: at DAG parse for plain values, once
rendered for templated ones (a rendered template is text, hence the conversion)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainops.cluster.spec import CAPACITIES
from trainops.operators.job_options import check_renders
from trainops.operators.params import as_int


def checked_sizing(
    cluster: str,
    *,
    nodes: Any,
    gpus_per_node: Any,
    max_preemptions: Any,
    capacity: Any,
    job_options: Mapping[str, Any],
    **job_fields: Any,
) -> tuple[int, int, int]:
    """``nodes``, ``gpus_per_node`` and ``max_preemptions`` as integers, once each is checked,
    and ``capacity`` checked; on Kubernetes a trial JobSpec is rendered too (``job_fields``:
    ``image``, ``namespace``, ``termination_grace_seconds``). ValueError naming a bad value."""
    nodes = as_int("nodes", nodes, minimum=1, text=True)
    gpus_per_node = as_int("gpus_per_node", gpus_per_node, minimum=0, text=True)
    max_preemptions = as_int("max_preemptions", max_preemptions, minimum=0, text=True)
    if capacity not in CAPACITIES:
        raise ValueError(f"capacity {capacity!r} is not one of {', '.join(repr(c) for c in CAPACITIES)}")
    check_renders(
        cluster, nodes=nodes, gpus_per_node=gpus_per_node, capacity=capacity, **job_fields, **job_options
    )
    return nodes, gpus_per_node, max_preemptions
