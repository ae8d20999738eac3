"""Cluster backends: where jobs run. ``local`` (this host) is the embedded default."""

from __future__ import annotations

CLUSTERS = ("local", "kubernetes")


def get_cluster(name: str, **options):
    """The backend called ``name``; options are backend-specific: ``state_dir`` for ``local``;
    ``kubernetes_conn_id``, ``namespace``, ``unschedulable_deadline_s`` for ``kubernetes``."""
    if name == "local":
        from trainops.cluster.local.backend import LocalCluster

        return LocalCluster(**options)
    if name == "kubernetes":
        from trainops.cluster.kubernetes.backend import KubernetesCluster

        return KubernetesCluster(**options)
    raise ValueError(f"unknown cluster {name!r}: use one of {CLUSTERS}")
