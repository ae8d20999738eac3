"""Cluster backends: where jobs run. ``local`` (this host) is the embedded default."""

from __future__ import annotations

CLUSTERS = ("local", "kubernetes")


def get_cluster(name: str, **options):
    """The backend called ``name``; options are backend-specific (e.g. ``state_dir``)."""
    if name == "local":
        from trainops.cluster.local import LocalCluster

        return LocalCluster(**options)
    if name == "kubernetes":
        raise NotImplementedError(
            "cluster='kubernetes' is not available yet (issue #4); use cluster='local'")
    raise ValueError(f"unknown cluster {name!r}: use one of {CLUSTERS}")
