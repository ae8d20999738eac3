"""Cluster backends: where jobs run. ``local`` (this host) is the embedded default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainops.cluster.local.backend import LocalCluster

if TYPE_CHECKING:  # DAG files import this package: keep it to the names
    from trainops.cluster.base import ClusterBackend

CLUSTERS = ("local", "kubernetes")


def get_cluster(name: str, **options: Any) -> ClusterBackend:
    """The backend called ``name``; options are backend-specific: ``state_dir`` for ``local``;
    ``kubernetes_conn_id``, ``namespace``, ``unschedulable_deadline_s`` for ``kubernetes``."""
    # The Kubernetes backend is imported when asked for (pyproject's banned list): DAG files
    # import the operators, which import this package, and parse faster without it.
    if name == "local":
        return LocalCluster(**options)
    if name == "kubernetes":
        from trainops.cluster.kubernetes.backend import KubernetesCluster

        return KubernetesCluster(**options)
    raise ValueError(f"unknown cluster {name!r}: use one of {CLUSTERS}")
