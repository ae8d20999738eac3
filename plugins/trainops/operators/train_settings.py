"""The training operator's sizing settings, checked: at DAG parse for plain values, once
rendered for templated ones (a rendered template is text, hence the conversion)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainops.cluster.spec import CAPACITIES, MAX_RESTARTS_IN_PLACE
from trainops.operators.job_options import check_renders
from trainops.operators.params import ParameterError, as_int


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


def checked_restarts(restarts_in_place: Any) -> int:
    """``restarts_in_place`` (torchrun's restarts of a node's workers in place; a rendered
    template's text too) as an integer
    from 0 to :data:`~trainops.cluster.spec.MAX_RESTARTS_IN_PLACE`; ParameterError naming the
    value and what to pass otherwise."""
    count = as_int("restarts_in_place", restarts_in_place, minimum=0, text=True)
    if count > MAX_RESTARTS_IN_PLACE:
        raise ParameterError(
            f"restarts_in_place must be an integer from 0 to {MAX_RESTARTS_IN_PLACE}, got {count}: a failure "
            "that outlasts a few restarts in the same pods is better met by relaunching the whole gang "
            "elsewhere; pass a few, such as 2 (the default), or 0 to relaunch the gang on every failure"
        )
    return count
