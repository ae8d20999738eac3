"""The CRDs the test clusters serve, loaded once from tests/data/crds (the releases' own files).

``TRAINJOB_RELEASES``: Kubeflow Trainer's TrainJob CRD of each release we render for; the
newest is what the simulated control plane serves unless a test installs another.
"""

import copy
import functools
from pathlib import Path

import yaml

CRDS = Path(__file__).resolve().parents[3] / "data" / "crds"
TRAINJOB_RELEASES = {
    "v2.0.0": "trainer.kubeflow.org_trainjobs-v2.0.0.yaml",
    "v2.1.0": "trainer.kubeflow.org_trainjobs-v2.1.0.yaml",
    "v2.3.0": "trainer.kubeflow.org_trainjobs-v2.3.0.yaml",
}
NEWEST_TRAINER = "v2.3.0"
FILES = {
    "trainjobs": TRAINJOB_RELEASES[NEWEST_TRAINER],
    "pytorchjobs": "kubeflow.org_pytorchjobs.yaml",
}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _load(filename: str) -> dict:
    return yaml.load((CRDS / filename).read_text(), Loader=_LOADER)


def crd(filename: str) -> dict:
    """The CRD in ``filename`` (a copy: callers may change it)."""
    return copy.deepcopy(_load(filename))


def schema(filename: str, version: str) -> dict:
    """The ``openAPIV3Schema`` of ``version`` in ``filename`` (shared: do not change it)."""
    return next(
        v["schema"]["openAPIV3Schema"] for v in _load(filename)["spec"]["versions"] if v["name"] == version
    )


def trainjob_crd(release: str = NEWEST_TRAINER) -> dict:
    return crd(TRAINJOB_RELEASES[release])


# plural -> (group, the version served) of every CRD a test cluster may have
GROUPS = {
    "pytorchjobs": ("kubeflow.org", "v1"),
    "trainjobs": ("trainer.kubeflow.org", "v1alpha1"),
    "clustertrainingruntimes": ("trainer.kubeflow.org", "v1alpha1"),
    "jobsets": ("jobset.x-k8s.io", "v1alpha2"),
    "podgroups": ("scheduling.volcano.sh", "v1beta1"),
    "queues": ("scheduling.volcano.sh", "v1beta1"),
    "localqueues": ("kueue.x-k8s.io", "v1beta1"),
    "clusterqueues": ("kueue.x-k8s.io", "v1beta1"),
}


def served(plural: str) -> dict:
    """The CRD a test cluster serves for ``plural``: the pinned file, or (one whose schema we
    do not hold, such as a PodGroup) a CRD without a schema."""
    if plural in FILES:
        return _load(FILES[plural])
    group, version = GROUPS[plural]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "versions": [{"name": version, "served": True}]},
    }
